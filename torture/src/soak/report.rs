//! The soak's markdown report: what ran, the verdict table, the traffic's figures and
//! every sample.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use super::options::SoakOptions;
use super::traffic::Tally;
use super::verdict::{MetricVerdict, Sample};

/// What the report says besides the samples.
pub struct ReportInputs<'a> {
    /// The soak's options.
    pub options: &'a SoakOptions,
    /// The URL with credentials hidden.
    pub shown_url: &'a str,
    /// When it started (UTC, RFC 3339) and on what.
    pub started: &'a str,
    /// Seconds it actually ran.
    pub ran_secs: f64,
    /// The traffic's figures.
    pub tally: &'a Tally,
    /// Server samples that failed, with the last error.
    pub probe_failures: (usize, Option<String>),
    /// Traffic tasks that had to be aborted after the deadline.
    pub aborted_tasks: usize,
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "—".into()
    } else if v.fract() == 0.0 && v.abs() < 1e12 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// The verdict as a markdown table (one row per metric).
pub fn verdict_table(verdicts: &[MetricVerdict]) -> String {
    let mut out = String::from(
        "| metric | first | last | min / max (last half) | slope/h (last half) | rule | verdict |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
        let verdict = match v.passed {
            None => "—".to_string(),
            Some(true) => "pass".to_string(),
            Some(false) => format!("**FAIL**: {}", v.why),
        };
        let slope = v
            .slope_per_hour
            .map_or("—".to_string(), |s| format!("{s:+.3}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} / {} | {} | {} | {} |",
            v.metric,
            number(v.first),
            number(v.last),
            number(v.min),
            number(v.max),
            slope,
            v.rule.describe(),
            verdict
        );
    }
    out
}

/// The whole report.
pub fn render(inputs: &ReportInputs<'_>, samples: &[Sample], verdicts: &[MetricVerdict]) -> String {
    let o = inputs.options;
    let t = &o.traffic;
    let passed = super::verdict::passed(verdicts);
    let mut out = String::new();
    let _ = writeln!(out, "# Soak of {}\n", inputs.shown_url);
    let _ = writeln!(
        out,
        "Started {}; ran {:.0} s, a sample every {} s. Traffic: {} lock tasks on {} keys, ttl {} ms, \
         waits of {} ms, holds of {} ms on average, 1 in {} acquisitions cancelled mid-wait, 1 in {} guards dropped without release, \
         {} long holders ({} s each), a semaphore and a read-write lock where the backend has them; seed {}.\n",
        inputs.started,
        inputs.ran_secs,
        o.sample.as_secs_f64(),
        t.tasks,
        t.keys,
        t.ttl.as_millis(),
        t.wait.as_millis(),
        t.hold.as_millis(),
        t.cancel_one_in,
        t.drop_one_in,
        t.long_holders,
        t.long_hold.as_secs_f64(),
        t.seed
    );
    let _ = writeln!(
        out,
        "## Verdict: {}\n",
        if passed { "PASS" } else { "FAIL" }
    );
    out.push_str(&verdict_table(verdicts));
    let tally = inputs.tally;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let cycles = load(&tally.cycles);
    let _ = writeln!(out, "\n## Traffic\n");
    let _ = writeln!(
        out,
        "| cycles | cycles/s | acquired | released | dropped | cancelled mid-wait | waited out | long holdings lost |\n|---|---|---|---|---|---|---|---|\n| {} | {:.1} | {} | {} | {} | {} | {} | {} |",
        cycles,
        cycles as f64 / inputs.ran_secs.max(1e-9),
        load(&tally.acquired),
        load(&tally.released),
        load(&tally.dropped),
        load(&tally.cancelled),
        load(&tally.timed_out),
        load(&tally.lost),
    );
    let kinds = tally
        .kinds
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join(", ");
    let _ = writeln!(out, "\nTasks that ran: {kinds}.");
    let errors = tally.errors.lock().unwrap_or_else(|e| e.into_inner());
    if errors.is_empty() {
        let _ = writeln!(out, "\nNo other errors.");
    } else {
        let list: Vec<String> = errors.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        let _ = writeln!(out, "\nOther errors: {}.", list.join(", "));
        let first = tally.first_errors.lock().unwrap_or_else(|e| e.into_inner());
        for (kind, message) in first.iter() {
            let _ = writeln!(out, "\n- first {kind}: {message}");
        }
    }
    let (failures, last) = &inputs.probe_failures;
    if *failures > 0 {
        let _ = writeln!(
            out,
            "\nServer samples that failed: {failures} (last: {}).",
            last.as_deref().unwrap_or("?")
        );
    }
    if inputs.aborted_tasks > 0 {
        let _ = writeln!(
            out,
            "\nTraffic tasks still running 30 s after the deadline, aborted: {}.",
            inputs.aborted_tasks
        );
    }
    let _ = writeln!(out, "\n## Samples\n");
    out.push_str(&samples_table(samples));
    out
}

/// Every sample, one row each, one column per metric.
pub fn samples_table(samples: &[Sample]) -> String {
    let names: BTreeSet<&String> = samples.iter().flat_map(|s| s.values.keys()).collect();
    let mut out = String::from("| t (s) |");
    for name in &names {
        let _ = write!(out, " {name} |");
    }
    out.push_str("\n|---|");
    for _ in &names {
        out.push_str("---|");
    }
    out.push('\n');
    for sample in samples {
        let _ = write!(out, "| {:.0} |", sample.t);
        for name in &names {
            let cell = sample.values.get(*name).map_or("—".into(), |v| number(*v));
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}
