//! Latency summaries and the printed table.

use std::time::Duration;

/// Percentiles of a set of latency samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// How many samples.
    pub count: usize,
    /// The median.
    pub p50: Duration,
    /// The 99th percentile.
    pub p99: Duration,
    /// The mean.
    pub mean: Duration,
}

impl Summary {
    /// Summarizes `samples` (sorted in place). `None` if there are none.
    pub fn of(samples: &mut [Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        let total: Duration = samples.iter().sum();
        Some(Summary {
            count: samples.len(),
            p50: at(0.50),
            p99: at(0.99),
            mean: total / samples.len() as u32,
        })
    }
}

/// Formats a duration in microseconds or milliseconds, whichever reads better.
pub fn fmt_duration(d: Duration) -> String {
    if d < Duration::from_micros(100) {
        format!("{:.1} µs", d.as_secs_f64() * 1e6)
    } else if d < Duration::from_millis(10) {
        format!("{:.0} µs", d.as_secs_f64() * 1e6)
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}

/// One row of the results table: a measurement of dlock and of the baseline.
#[derive(Debug, Clone)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// dlock's figure, formatted.
    pub ours: String,
    /// The baseline's figure, formatted.
    pub baseline: String,
    /// How dlock compares, where "higher is better" has been normalized away:
    /// above 1.0 means dlock is better.
    pub ratio: f64,
}

impl Row {
    /// A row for a throughput (higher is better).
    pub fn throughput(what: &str, ours: f64, baseline: f64) -> Row {
        Row {
            what: what.to_owned(),
            ours: format!("{ours:.0}/s"),
            baseline: format!("{baseline:.0}/s"),
            ratio: ours / baseline,
        }
    }

    /// A row for a count per operation (lower is better): allocations per
    /// cycle, say.
    pub fn per_op(what: &str, ours: f64, baseline: f64) -> Row {
        Row {
            what: what.to_owned(),
            ours: format!("{ours:.1}"),
            baseline: format!("{baseline:.1}"),
            ratio: baseline / ours.max(1e-9),
        }
    }

    /// A row for a share between 0 and 1 (higher is better), shown in %.
    pub fn share(what: &str, ours: f64, baseline: f64) -> Row {
        Row {
            what: what.to_owned(),
            ours: format!("{:.1} %", ours * 100.0),
            baseline: format!("{:.1} %", baseline * 100.0),
            ratio: ours / baseline.max(1e-9),
        }
    }

    /// A row for a latency (lower is better).
    pub fn latency(what: &str, ours: Duration, baseline: Duration) -> Row {
        Row {
            what: what.to_owned(),
            ours: fmt_duration(ours),
            baseline: fmt_duration(baseline),
            ratio: baseline.as_secs_f64() / ours.as_secs_f64().max(1e-9),
        }
    }
}

/// Prints rows as a Markdown table (so it can be pasted into the README).
/// The latency rows of one client's uncontended cycles, the same for every
/// backend's table: `acquire` p50, p99 and mean, and `try_acquire` p50
/// (and p99 when `with_try_p99`), each against the baseline's cycle.
pub fn uncontended_rows(
    ours: &Summary,
    ours_try: &Summary,
    theirs: &Summary,
    with_try_p99: bool,
) -> Vec<Row> {
    let mut rows = vec![
        Row::latency(
            "acquire cycle p50, 1 client, no contention",
            ours.p50,
            theirs.p50,
        ),
        Row::latency(
            "acquire cycle p99, 1 client, no contention",
            ours.p99,
            theirs.p99,
        ),
        Row::latency(
            "acquire cycle mean, 1 client, no contention",
            ours.mean,
            theirs.mean,
        ),
        Row::latency(
            "try_acquire cycle p50, 1 client, no contention",
            ours_try.p50,
            theirs.p50,
        ),
    ];
    if with_try_p99 {
        rows.push(Row::latency(
            "try_acquire cycle p99, 1 client, no contention",
            ours_try.p99,
            theirs.p99,
        ));
    }
    rows
}

pub fn print_table(title: &str, baseline_name: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| workload | dlock | {baseline_name} | dlock vs baseline |");
    println!("|---|---:|---:|---:|");
    for row in rows {
        println!(
            "| {} | {} | {} | {:.2}× |",
            row.what, row.ours, row.baseline, row.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_set() {
        let mut samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(&mut samples).unwrap();
        assert_eq!(s.p50, Duration::from_millis(51));
        assert_eq!(s.p99, Duration::from_millis(99));
        assert!(Summary::of(&mut []).is_none());
    }
}
