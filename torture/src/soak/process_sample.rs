//! The soak process's own figures, from `/proc/self` (Linux): resident memory, open file
//! descriptors, threads; and the tokio runtime's live tasks.

use std::collections::BTreeMap;

/// Adds `rss_mb`, `fds`, `threads` and `tasks` to `values`; a figure that cannot be read
/// (not Linux, `/proc` not mounted) is left out rather than guessed.
pub fn sample_process(values: &mut BTreeMap<String, f64>) {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(kb) = status_field(&status, "VmRSS:") {
            values.insert("rss_mb".into(), kb / 1024.0);
        }
        if let Some(threads) = status_field(&status, "Threads:") {
            values.insert("threads".into(), threads);
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // the directory handle itself is one of the entries: leave it out
        let fds = dir.count().saturating_sub(1);
        values.insert("fds".into(), fds as f64);
    }
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        values.insert("tasks".into(), handle.metrics().num_alive_tasks() as f64);
    }
}

/// The number after `field` in `/proc/self/status` (`VmRSS:   12345 kB` → 12345).
///
/// ```
/// use dlock_torture::soak::process_sample::status_field;
/// let status = "Name:\ttorture\nVmRSS:\t   20480 kB\nThreads:\t7\n";
/// assert_eq!(status_field(status, "VmRSS:"), Some(20480.0));
/// assert_eq!(status_field(status, "Threads:"), Some(7.0));
/// assert_eq!(status_field(status, "VmSwap:"), None);
/// ```
pub fn status_field(status: &str, field: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}
