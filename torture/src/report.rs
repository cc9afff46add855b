//! The report: the checker's figures, the faults injected and skipped, and the verdict
//! that decides the exit status.

use std::fmt::Write as _;

use crate::checker::Figures;
use crate::clock::ms;
use crate::faults::FaultKind;
use crate::nemesis::Injected;

/// Everything the report prints.
pub struct Report<'a> {
    /// The first line: servers, length, workers, seed, ttl.
    pub header: String,
    /// Whether the backend promises fencing tokens.
    pub fencing: bool,
    /// The figures.
    pub figures: &'a Figures,
    /// The faults as injected.
    pub faults: &'a [Injected],
    /// Kinds asked for that could not run here, with the reason.
    pub skipped: &'a [(FaultKind, String)],
    /// How the workers stopped.
    pub stopped: &'a crate::targets::Stopped,
    /// When the run began (monotonic ns): fault times are printed from it.
    pub run_start_ns: u64,
}

/// Why the run failed, if it did: an unsafe overlap or a fence regression on a backend
/// that promises fencing, or a late `lost()` anywhere.
pub fn failures(figures: &Figures, fencing: bool) -> Vec<String> {
    let mut why = Vec::new();
    if fencing && figures.overlaps_unsafe > 0 {
        why.push(format!(
            "{} unsafe overlap(s) on a backend that promises fencing",
            figures.overlaps_unsafe
        ));
    }
    if fencing && figures.fence_regressions > 0 {
        why.push(format!("{} fence regression(s)", figures.fence_regressions));
    }
    if figures.lost_late > 0 {
        why.push(format!("{} late lost()", figures.lost_late));
    }
    why
}

impl Report<'_> {
    /// The report's text.
    pub fn render(&self) -> String {
        let f = self.figures;
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.header);
        let _ = writeln!(
            out,
            "critical sections completed: {} ({} acquisitions, {} store writes accepted)",
            f.critical_sections, f.acquisitions, f.writes_accepted
        );
        let _ = writeln!(
            out,
            "overlaps (locks and segments): {} rejected by fencing (safe), {} accepted (unsafe{}), {} with one side gone before writing",
            f.overlaps_fenced,
            f.overlaps_unsafe,
            if self.fencing { "" } else { "; this backend has no fencing" },
            f.overlaps_other
        );
        let _ = writeln!(
            out,
            "semaphore: {} begins found all permits' writes open (permits carry no fence)",
            f.permit_excess
        );
        let _ = writeln!(out, "fence regressions: {}", f.fence_regressions);
        let _ = writeln!(
            out,
            "lost(): {} before the server could have expired the lease, {} late; excused: {} while the worker was stopped, {} after the server forgot locks (a restart without persistence, a session ended; expected); {} permits lost",
            f.lost_in_time, f.lost_late, f.lost_while_paused, f.lost_after_restart, f.lost_permits
        );
        match f.acquire_latency {
            Some((p50, p99, max)) => {
                let _ = writeln!(
                    out,
                    "acquire latency (waiting included): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                    ms(p50),
                    ms(p99),
                    ms(max)
                );
            }
            None => {
                let _ = writeln!(out, "acquire latency: no acquisition");
            }
        }
        match &f.longest_free_wait {
            Some((gap, key)) => {
                let _ = writeln!(
                    out,
                    "longest a key stayed free after a release while a worker waited: {:.1} ms ({key})",
                    ms(*gap)
                );
            }
            None => {
                let _ = writeln!(out, "longest free wait: no hand-off observed");
            }
        }
        if f.errors.is_empty() {
            let _ = writeln!(out, "errors: none");
        } else {
            let list: Vec<String> = f.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(out, "errors: {}", list.join(", "));
        }
        let _ = writeln!(out, "faults injected ({}):", self.faults.len());
        for injected in self.faults {
            let _ = writeln!(
                out,
                "  +{:>8.3}s  {injected}",
                injected.start_ns.saturating_sub(self.run_start_ns) as f64 / 1e9
            );
        }
        let mut counts: Vec<(FaultKind, usize)> = FaultKind::ALL
            .iter()
            .map(|k| {
                (
                    *k,
                    self.faults
                        .iter()
                        .filter(|i| i.planned.kind == *k && i.outcome.is_ok())
                        .count(),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        counts.sort();
        let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(out, "faults by kind: {}", counts.join(", "));
        let failovers: Vec<&Injected> = self
            .faults
            .iter()
            .filter(|i| i.failed_over.is_some())
            .collect();
        if !failovers.is_empty() {
            let by_fault = failovers
                .iter()
                .filter(|i| i.planned.kind == FaultKind::Failover)
                .count();
            let _ = writeln!(
                out,
                "sentinel failovers: {} ({by_fault} by `failover`, {} by the sentinels during another server fault)",
                failovers.len(),
                failovers.len() - by_fault
            );
        }
        for (kind, why) in self.skipped {
            let _ = writeln!(out, "skipped {kind}: {why}");
        }
        if self.stopped.killed > 0 {
            let _ = writeln!(
                out,
                "{} worker(s) did not stop in time at the end and were killed",
                self.stopped.killed
            );
        }
        for failed in &self.stopped.failed {
            let _ = writeln!(out, "{failed}");
        }
        for e in &f.examples {
            let _ = writeln!(out, "  {e}");
        }
        let why = failures(f, self.fencing);
        if why.is_empty() {
            let _ = writeln!(out, "verdict: PASS");
        } else {
            let _ = writeln!(out, "verdict: FAIL: {}", why.join("; "));
        }
        out
    }
}
