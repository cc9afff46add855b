//! `torture soak`: mixed traffic on one backend for hours while the process and the server
//! are sampled, ending with a verdict on the slopes (issue 68; see
//! `docs/reliability/soak.md`).
//!
//! | module | holds |
//! |---|---|
//! | [`options`] | its command line |
//! | [`traffic`] | the mixed traffic and its tally |
//! | [`process_sample`] | the process's RSS, fds, threads and tokio tasks |
//! | [`server_sample`] | the server's keys, rows, sessions, connections, log lines |
//! | [`verdict`] | slopes over the last half and the rules they are judged by |
//! | [`report`] | the markdown report |

pub mod options;
pub mod process_sample;
pub mod report;
pub mod server_sample;
pub mod traffic;
pub mod verdict;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::urls::ServiceUrl;
use options::SoakOptions;
use report::ReportInputs;
use server_sample::ServerProbe;
use verdict::Sample;

/// How long the traffic tasks get after the deadline to finish their round.
const FINISH_LIMIT: Duration = Duration::from_secs(30);

/// What a finished soak returns.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakOutcome {
    /// Whether every judged metric passed.
    pub passed: bool,
    /// How many samples were taken.
    pub samples: usize,
}

/// Runs a soak on a tokio runtime of its own (two worker threads, the size of the
/// machine it was written for), writing the report after every sample so that an
/// interrupted soak still leaves its samples.
///
/// # Errors
/// The runtime could not start, the backend could not be reached at the start, or the
/// report could not be written.
pub fn run(options: &SoakOptions) -> Result<SoakOutcome, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(soak(options))
}

async fn soak(options: &SoakOptions) -> Result<SoakOutcome, String> {
    let shown_url = ServiceUrl::parse(&options.url)
        .map(|u| u.redacted())
        .map_err(|e| format!("`{}`: {e}", options.url))?;
    let mut probe = ServerProbe::new(&options.url, options.server_logs.clone())?;
    let backend = tokio::time::timeout(Duration::from_secs(30), dlock::connect(&options.url))
        .await
        .map_err(|_| format!("{shown_url}: no connection within 30 s"))?
        .map_err(|e| format!("{shown_url}: {e}"))?;
    let started_wall = utc_now();
    let started = Instant::now();
    let deadline = started + options.duration;
    let (mut tasks, tally) = traffic::start(&backend, &options.traffic, deadline);
    let mut samples = Vec::new();
    let mut probe_failures = (0usize, None);
    let mut next = started;
    loop {
        tokio::time::sleep_until(next).await;
        let mut values = BTreeMap::new();
        process_sample::sample_process(&mut values);
        if let Err(e) = probe.sample(&mut values).await {
            eprintln!("soak: server sample: {e}");
            probe_failures = (probe_failures.0 + 1, Some(e));
        }
        let sample = Sample {
            t: started.elapsed().as_secs_f64(),
            values,
        };
        println!("{}", sample_line(&sample));
        samples.push(sample);
        let inputs = ReportInputs {
            options,
            shown_url: &shown_url,
            started: &started_wall,
            ran_secs: started.elapsed().as_secs_f64(),
            tally: &tally,
            probe_failures: probe_failures.clone(),
            aborted_tasks: 0,
        };
        write_report(options, &inputs, &samples)?;
        if next >= deadline {
            break;
        }
        next = (next + options.sample).min(deadline);
    }
    let ran_secs = started.elapsed().as_secs_f64();
    // every task ends at the deadline after its round; one that does not is aborted
    let finish = tokio::time::timeout(FINISH_LIMIT, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let aborted_tasks = if finish.is_err() {
        let left = tasks.len();
        tasks.abort_all();
        left
    } else {
        0
    };
    let verdicts = verdict::judge_all(&samples);
    let inputs = ReportInputs {
        options,
        shown_url: &shown_url,
        started: &started_wall,
        ran_secs,
        tally: &tally,
        probe_failures,
        aborted_tasks,
    };
    write_report(options, &inputs, &samples)?;
    let passed = verdict::passed(&verdicts) && aborted_tasks == 0;
    println!("\n{}", report::verdict_table(&verdicts));
    println!(
        "soak: {} ({} samples; report in {})",
        if passed { "PASS" } else { "FAIL" },
        samples.len(),
        options.report.display()
    );
    Ok(SoakOutcome {
        passed,
        samples: samples.len(),
    })
}

fn write_report(
    options: &SoakOptions,
    inputs: &ReportInputs<'_>,
    samples: &[Sample],
) -> Result<(), String> {
    let verdicts = verdict::judge_all(samples);
    let text = report::render(inputs, samples, &verdicts);
    std::fs::write(&options.report, text)
        .map_err(|e| format!("write the report {}: {e}", options.report.display()))
}

/// One sample as a line of `name=value` pairs, printed as the soak goes.
fn sample_line(sample: &Sample) -> String {
    let mut line = format!("sample t={:.0}", sample.t);
    for (name, value) in &sample.values {
        line.push_str(&format!(" {name}={value:.3}"));
    }
    line
}

/// Now in UTC, `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// `secs` since the epoch as a UTC date and time (the civil-from-days algorithm; the
/// example checked against `date -u -d @1796000000`).
///
/// ```
/// assert_eq!(dlock_torture::soak::utc(0), "1970-01-01 00:00:00 UTC");
/// assert_eq!(dlock_torture::soak::utc(1_796_000_000), "2026-11-30 00:53:20 UTC");
/// ```
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
