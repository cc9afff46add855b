//! The command line of `torture soak`, parsed by hand like the run's; every bad argument is
//! an [`OptionsError`] that names it and says what to write.

use std::path::PathBuf;
use std::time::Duration;

use crate::options::OptionsError;

/// The usage text `torture soak --help` prints.
pub const SOAK_USAGE: &str = "\
usage: torture soak <url> [options]     mixed traffic on one backend for hours, sampling the
                                        process and the server, ending with a verdict on slopes;
                                        samples on stdout, dlock's WARN events (why a lease was
                                        lost) on stderr
options:
  --duration D           how long (e.g. 1h, 30m, 20s; default 1h)
  --sample D             time between samples (default 30s)
  --report FILE          the markdown report (default soak-report.md)
  --server-log PATH      a server log file whose lines are counted (repeat per file)
  --tasks N              lock tasks (default 16)
  --keys K               lock keys they share (default 200)
  --ttl D                lease ttl (default 3s)
  --wait D               how long an acquisition waits (default 200ms)
  --hold D               mean critical section, drawn from D/2 to 3D/2 (default 50ms:
                         about 256 cycles/s with 16 tasks, as in issue 68's run)
  --cancel-one-in N      1 in N acquisitions is cancelled mid-wait (default 10; 0: none)
  --drop-one-in N        1 in N guards is dropped without release (default 20; 0: none)
  --long-holders N       tasks holding a lock for --long-hold while it renews (default 2)
  --long-hold D          how long a long holder holds (default 20s)
  --seed S               seed of the tasks' choices (default 1)
";

/// Options of a soak.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakOptions {
    /// The backend URL, as `dlock::connect` takes it.
    pub url: String,
    /// How long the traffic runs.
    pub duration: Duration,
    /// Time between samples.
    pub sample: Duration,
    /// Where the markdown report goes.
    pub report: PathBuf,
    /// Server log files whose lines are counted at each sample.
    pub server_logs: Vec<PathBuf>,
    /// The mixed traffic.
    pub traffic: TrafficOptions,
}

/// The mixed traffic's knobs; the defaults are the operator's run of issue 68.
#[derive(Debug, Clone, PartialEq)]
pub struct TrafficOptions {
    /// Tasks taking plain locks.
    pub tasks: usize,
    /// Plain lock keys they pick from.
    pub keys: usize,
    /// Lease ttl of every lock.
    pub ttl: Duration,
    /// How long one acquisition waits.
    pub wait: Duration,
    /// Mean critical section (each drawn from half to one and a half of it).
    pub hold: Duration,
    /// 1 in this many acquisitions is cancelled mid-wait (0: none).
    pub cancel_one_in: u32,
    /// 1 in this many guards is dropped without `release` (0: none).
    pub drop_one_in: u32,
    /// Tasks that hold a lock for `long_hold`, renewing it.
    pub long_holders: usize,
    /// How long a long holder holds.
    pub long_hold: Duration,
    /// Seed of the tasks' choices.
    pub seed: u64,
}

impl Default for TrafficOptions {
    fn default() -> Self {
        Self {
            tasks: 16,
            keys: 200,
            ttl: Duration::from_secs(3),
            wait: Duration::from_millis(200),
            hold: Duration::from_millis(50),
            cancel_one_in: 10,
            drop_one_in: 20,
            long_holders: 2,
            long_hold: Duration::from_secs(20),
            seed: 1,
        }
    }
}

fn value<'a>(
    flag: &str,
    args: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a String, OptionsError> {
    args.next()
        .ok_or_else(|| OptionsError(format!("`{flag}` needs a value; see `torture soak --help`")))
}

/// A duration within `range`, written as humantime (`1h`, `30s`, `200ms`).
fn duration(
    flag: &str,
    text: &str,
    range: std::ops::RangeInclusive<Duration>,
) -> Result<Duration, OptionsError> {
    let shown = |d: &Duration| humantime::format_duration(*d).to_string();
    let bounds = format!("from {} to {}", shown(range.start()), shown(range.end()));
    let parsed = humantime::parse_duration(text).map_err(|_| {
        OptionsError(format!(
            "`{flag} {text}`: write a duration {bounds}, e.g. 30s, 5m or 1h"
        ))
    })?;
    if !range.contains(&parsed) {
        return Err(OptionsError(format!(
            "`{flag} {text}`: write a duration {bounds}"
        )));
    }
    Ok(parsed)
}

fn whole<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(
    flag: &str,
    text: &str,
    low: T,
    high: T,
) -> Result<T, OptionsError> {
    match text.parse::<T>() {
        Ok(n) if n >= low && n <= high => Ok(n),
        _ => Err(OptionsError(format!(
            "`{flag} {text}`: write a whole number from {low} to {high}"
        ))),
    }
}

/// Parses the arguments of `torture soak` (after the word `soak`).
///
/// ```
/// use dlock_torture::soak::options::parse_soak;
/// let args: Vec<String> = ["redis://127.0.0.1:6379", "--duration", "20s", "--sample", "2s"]
///     .iter().map(|s| s.to_string()).collect();
/// let soak = parse_soak(&args).unwrap();
/// assert_eq!(soak.duration.as_secs(), 20);
/// assert_eq!(soak.traffic.keys, 200);
/// assert!(parse_soak(&["--tasks".to_string(), "0".to_string()]).is_err());
/// ```
///
/// # Errors
/// A missing or malformed value, an unknown flag, no URL or two, or a sample interval
/// that leaves fewer than 8 samples in the run.
pub fn parse_soak(args: &[String]) -> Result<SoakOptions, OptionsError> {
    let mut url: Option<String> = None;
    let mut run_for = Duration::from_secs(3600);
    let mut sample = Duration::from_secs(30);
    let mut report = PathBuf::from("soak-report.md");
    let mut server_logs = Vec::new();
    let mut traffic = TrafficOptions::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let flag = arg.as_str();
        match flag {
            "--duration" => {
                let range = Duration::from_secs(2)..=Duration::from_secs(7 * 86_400);
                run_for = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--sample" => {
                let range = Duration::from_millis(500)..=Duration::from_secs(3600);
                sample = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--report" => report = PathBuf::from(value(flag, &mut it)?),
            "--server-log" => server_logs.push(PathBuf::from(value(flag, &mut it)?)),
            "--tasks" => traffic.tasks = whole(flag, value(flag, &mut it)?, 1, 1024)?,
            "--keys" => traffic.keys = whole(flag, value(flag, &mut it)?, 1, 1_000_000)?,
            "--ttl" => {
                let range = Duration::from_millis(500)..=Duration::from_secs(600);
                traffic.ttl = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--wait" => {
                let range = Duration::from_millis(10)..=Duration::from_secs(60);
                traffic.wait = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--hold" => {
                let range = Duration::from_millis(2)..=Duration::from_secs(60);
                traffic.hold = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--cancel-one-in" => {
                traffic.cancel_one_in = whole(flag, value(flag, &mut it)?, 0, 1_000_000)?;
            }
            "--drop-one-in" => {
                traffic.drop_one_in = whole(flag, value(flag, &mut it)?, 0, 1_000_000)?;
            }
            "--long-holders" => {
                traffic.long_holders = whole(flag, value(flag, &mut it)?, 0, 64)?;
            }
            "--long-hold" => {
                let range = Duration::from_millis(100)..=Duration::from_secs(3600);
                traffic.long_hold = duration(flag, value(flag, &mut it)?, range)?;
            }
            "--seed" => traffic.seed = whole(flag, value(flag, &mut it)?, 0, u64::MAX)?,
            other if other.starts_with("--") => {
                return Err(OptionsError(format!(
                    "unknown option `{other}`; see `torture soak --help`"
                )))
            }
            positional => {
                if url.replace(positional.to_string()).is_some() {
                    return Err(OptionsError(format!(
                        "a second URL `{positional}`: a soak runs on one backend (several hosts go in one URL, comma separated)"
                    )));
                }
            }
        }
    }
    let url = url.ok_or_else(|| {
        OptionsError(
            "no URL: give the backend's, e.g. `torture soak redis://127.0.0.1:6379`".to_string(),
        )
    })?;
    // a slope needs a few points in the judged (last) half
    if sample * 8 > run_for {
        return Err(OptionsError(format!(
            "`--sample {}` with `--duration {}`: take at least 8 samples (a sample interval of at most a 8th of the duration)",
            humantime::format_duration(sample),
            humantime::format_duration(run_for)
        )));
    }
    Ok(SoakOptions {
        url,
        duration: run_for,
        sample,
        report,
        server_logs,
        traffic,
    })
}
