//! The command line of `torture` and of its `worker` subcommand, parsed by hand into typed
//! options; every bad argument is an [`OptionsError`] that names it and says what to write.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::faults::{parse_fault_list, FaultKind};

/// The usage text `torture --help` prints.
pub const USAGE: &str = "\
usage: torture <url> [options]          against your own servers
       torture --local <kind> [options] against servers it starts (kind: redis, cluster,
                                        redlock, sentinel, etcd, zk, postgres, mysql,
                                        file; needs the Debian server packages but file,
                                        which takes a temp directory)
       torture soak <url> [options]     hours of mixed traffic, sampled, judged on slopes
                                        (see `torture soak --help`)
options:
  --minutes M            run length (fractions allowed; default 1)
  --seconds S            run length in seconds instead
  --workers N            worker processes (default 4)
  --seed S               seed of the fault plan and the workloads (default: from the clock, printed)
  --faults LIST          every kind but freeze-flows (default), all, none, or a comma list
                         of: pause-worker-short, pause-worker-long, kill-worker, blackhole,
                         reset, pause-server-short, pause-server-long, kill-leader,
                         restart-server, failover, terminate-backend,
                         replace-lock-file, freeze-flows
  --ttl-ms T             lease ttl in ms (default 2000)
  --keys K               plain lock keys the workers share (default 3)
  --server-pid ADDR=PID  a server process the nemesis may SIGSTOP (repeat per server)
  --late-tolerance-ms T  scheduling slack before a lost() counts as late (default 250)
  --out DIR              where report.txt, timeline.svg and the logs go (default torture-<seed>)
";

/// A bad command line: what was wrong and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionsError(pub String);

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for OptionsError {}

/// The servers `--local` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalKind {
    /// One Redis server.
    Redis,
    /// A Redis Cluster of 3 masters.
    Cluster,
    /// 5 independent Redis masters for Redlock.
    Redlock,
    /// Redis Sentinel: a master, one replica and three sentinels.
    Sentinel,
    /// A 3-member etcd cluster.
    Etcd,
    /// A 3-node ZooKeeper ensemble.
    Zk,
    /// One PostgreSQL server.
    Postgres,
    /// One MariaDB server (the MySQL backend).
    Mysql,
    /// A temporary directory of lock files (the file backend): no server.
    File,
}

impl LocalKind {
    /// The name `--local` takes.
    pub fn name(self) -> &'static str {
        match self {
            LocalKind::Redis => "redis",
            LocalKind::Cluster => "cluster",
            LocalKind::Redlock => "redlock",
            LocalKind::Sentinel => "sentinel",
            LocalKind::Etcd => "etcd",
            LocalKind::Zk => "zk",
            LocalKind::Postgres => "postgres",
            LocalKind::Mysql => "mysql",
            LocalKind::File => "file",
        }
    }

    fn parse(name: &str) -> Result<Self, OptionsError> {
        [
            LocalKind::Redis,
            LocalKind::Cluster,
            LocalKind::Redlock,
            LocalKind::Sentinel,
            LocalKind::Etcd,
            LocalKind::Zk,
            LocalKind::Postgres,
            LocalKind::Mysql,
            LocalKind::File,
        ]
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            OptionsError(format!(
                "unknown `--local {name}`; write one of redis, cluster, redlock, sentinel, etcd, zk, postgres, mysql, file"
            ))
        })
    }
}

/// Where the locks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Servers {
    /// The user's servers, by URL.
    Url(String),
    /// Servers the run starts itself.
    Local(LocalKind),
}

/// Options of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// The servers.
    pub servers: Servers,
    /// How long the nemesis and the workers run.
    pub duration: Duration,
    /// Worker processes.
    pub workers: usize,
    /// Seed of the plan and of the workers' choices.
    pub seed: u64,
    /// Fault kinds asked for.
    pub faults: Vec<FaultKind>,
    /// Lease ttl.
    pub ttl: Duration,
    /// Plain lock keys.
    pub keys: usize,
    /// Server processes the nemesis may pause: address as written in the URL, and pid.
    pub server_pids: Vec<(String, u32)>,
    /// Slack before a late `lost()` counts.
    pub late_tolerance: Duration,
    /// Output directory.
    pub out: PathBuf,
}

/// Options of one worker process (`torture worker …`, started by the run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOptions {
    /// Worker number.
    pub id: usize,
    /// How many times this worker was started before (a killed worker is restarted).
    pub incarnation: u32,
    /// The backend URL, already rewritten through this worker's proxies.
    pub url: String,
    /// The fenced store.
    pub store: SocketAddr,
    /// Seed of this worker's choices (mixed with its id and incarnation).
    pub seed: u64,
    /// Lease ttl.
    pub ttl: Duration,
    /// Plain lock keys.
    pub keys: usize,
    /// Whether semaphore rounds may run (Redlock has no semaphores); the worker runs them
    /// only if its backend offers semaphores too.
    pub semaphore: bool,
}

impl WorkerOptions {
    /// The arguments that [`parse_worker`] reads back (without the `worker` word).
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--id".into(),
            self.id.to_string(),
            "--incarnation".into(),
            self.incarnation.to_string(),
            "--url".into(),
            self.url.clone(),
            "--store".into(),
            self.store.to_string(),
            "--seed".into(),
            self.seed.to_string(),
            "--ttl-ms".into(),
            self.ttl.as_millis().to_string(),
            "--keys".into(),
            self.keys.to_string(),
            "--semaphore".into(),
            self.semaphore.to_string(),
        ]
    }
}

/// Takes the value after `flag`.
fn value<'a>(
    flag: &str,
    args: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a String, OptionsError> {
    args.next()
        .ok_or_else(|| OptionsError(format!("`{flag}` needs a value; see `torture --help`")))
}

fn number<T: std::str::FromStr>(flag: &str, text: &str, what: &str) -> Result<T, OptionsError> {
    text.parse()
        .map_err(|_| OptionsError(format!("`{flag} {text}`: write {what}")))
}

/// Parses the arguments of a run (without the program name).
///
/// ```
/// use dlock_torture::options::{parse_run, Servers};
/// let args: Vec<String> = ["redis://127.0.0.1:6379", "--minutes", "0.5", "--seed", "7"]
///     .iter().map(|s| s.to_string()).collect();
/// let run = parse_run(&args, 1).unwrap();
/// assert_eq!(run.servers, Servers::Url("redis://127.0.0.1:6379".into()));
/// assert_eq!(run.duration.as_secs(), 30);
/// assert!(parse_run(&["--workers".to_string(), "0".to_string()], 1).is_err());
/// ```
///
/// # Errors
/// A missing or malformed value, an unknown flag, no URL and no `--local`, or both.
pub fn parse_run(args: &[String], clock_seed: u64) -> Result<RunOptions, OptionsError> {
    let mut url = None;
    let mut local = None;
    let mut duration = Duration::from_secs(60);
    let mut workers = 4usize;
    let mut seed = None;
    let mut faults = FaultKind::DEFAULT.to_vec();
    let mut ttl = Duration::from_millis(2000);
    let mut keys = 3usize;
    let mut server_pids = Vec::new();
    let mut late_tolerance = Duration::from_millis(250);
    let mut out = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--local" => local = Some(LocalKind::parse(value(arg, &mut it)?)?),
            "--minutes" | "--seconds" => {
                let text = value(arg, &mut it)?;
                let n: f64 = number(arg, text, "a positive number")?;
                let secs = if arg == "--minutes" { n * 60.0 } else { n };
                if !(1.0..=7.0 * 86_400.0).contains(&secs) {
                    return Err(OptionsError(format!(
                        "`{arg} {text}`: a run lasts from 1 second to 7 days"
                    )));
                }
                duration = Duration::from_secs_f64(secs);
            }
            "--workers" => {
                let text = value(arg, &mut it)?;
                workers = number(arg, text, "a whole number from 2 to 64")?;
                if !(2..=64).contains(&workers) {
                    return Err(OptionsError(format!(
                        "`--workers {text}`: write a whole number from 2 to 64 (two, so that someone can take over a lock)"
                    )));
                }
            }
            "--seed" => seed = Some(number(arg, value(arg, &mut it)?, "a whole number")?),
            "--faults" => faults = parse_fault_list(value(arg, &mut it)?).map_err(OptionsError)?,
            "--ttl-ms" => {
                let text = value(arg, &mut it)?;
                let ms: u64 = number(arg, text, "milliseconds, 500 to 60000")?;
                if !(500..=60_000).contains(&ms) {
                    return Err(OptionsError(format!(
                        "`--ttl-ms {text}`: write milliseconds from 500 to 60000"
                    )));
                }
                ttl = Duration::from_millis(ms);
            }
            "--keys" => {
                let text = value(arg, &mut it)?;
                keys = number(arg, text, "a whole number from 1 to 100")?;
                if !(1..=100).contains(&keys) {
                    return Err(OptionsError(format!(
                        "`--keys {text}`: write a whole number from 1 to 100"
                    )));
                }
            }
            "--server-pid" => {
                let text = value(arg, &mut it)?;
                let parsed = text
                    .split_once('=')
                    .and_then(|(addr, pid)| Some((addr.to_string(), pid.parse::<u32>().ok()?)));
                match parsed {
                    Some(pair) if pair.1 > 1 => server_pids.push(pair),
                    _ => {
                        return Err(OptionsError(format!(
                            "`--server-pid {text}`: write ADDRESS=PID, the address as in the URL, e.g. 127.0.0.1:6379=4242"
                        )))
                    }
                }
            }
            "--late-tolerance-ms" => {
                let ms: u64 = number(arg, value(arg, &mut it)?, "milliseconds")?;
                late_tolerance = Duration::from_millis(ms);
            }
            "--out" => out = Some(PathBuf::from(value(arg, &mut it)?)),
            flag if flag.starts_with("--") => {
                return Err(OptionsError(format!(
                    "unknown option `{flag}`; see `torture --help`"
                )))
            }
            positional => {
                if url.replace(positional.to_string()).is_some() {
                    return Err(OptionsError(format!(
                        "a second URL `{positional}`: give one URL (several hosts go in it, comma separated)"
                    )));
                }
            }
        }
    }
    let servers = match (url, local) {
        (Some(url), None) => Servers::Url(url),
        (None, Some(kind)) => Servers::Local(kind),
        (Some(_), Some(_)) => {
            return Err(OptionsError(
                "give either a URL or `--local <kind>`, not both".to_string(),
            ))
        }
        (None, None) => {
            return Err(OptionsError(
                "no servers: give a URL (e.g. redis://127.0.0.1:6379) or `--local redis|cluster|redlock|sentinel|etcd|zk|postgres|mysql|file`".to_string(),
            ))
        }
    };
    let seed = seed.unwrap_or(clock_seed);
    let out = out.unwrap_or_else(|| PathBuf::from(format!("torture-{seed}")));
    Ok(RunOptions {
        servers,
        duration,
        workers,
        seed,
        faults,
        ttl,
        keys,
        server_pids,
        late_tolerance,
        out,
    })
}

/// Parses the arguments of `torture worker` (after the word `worker`).
///
/// # Errors
/// As [`parse_run`]: the run wrote them, so an error here is a bug, reported plainly.
pub fn parse_worker(args: &[String]) -> Result<WorkerOptions, OptionsError> {
    let mut id = None;
    let mut incarnation = 0;
    let mut url = None;
    let mut store = None;
    let mut seed = 0;
    let mut ttl = Duration::from_millis(2000);
    let mut keys = 3;
    let mut semaphore = true;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let text = value(arg, &mut it)?;
        match arg.as_str() {
            "--id" => id = Some(number(arg, text, "a number")?),
            "--incarnation" => incarnation = number(arg, text, "a number")?,
            "--url" => url = Some(text.clone()),
            "--store" => store = Some(number(arg, text, "an address")?),
            "--seed" => seed = number(arg, text, "a number")?,
            "--ttl-ms" => ttl = Duration::from_millis(number(arg, text, "a number")?),
            "--keys" => keys = number(arg, text, "a number")?,
            "--semaphore" => semaphore = number(arg, text, "true or false")?,
            other => return Err(OptionsError(format!("unknown worker option `{other}`"))),
        }
    }
    let missing = |what: &str| OptionsError(format!("`torture worker` needs `--{what}`"));
    Ok(WorkerOptions {
        id: id.ok_or_else(|| missing("id"))?,
        incarnation,
        url: url.ok_or_else(|| missing("url"))?,
        store: store.ok_or_else(|| missing("store"))?,
        seed,
        ttl,
        keys: keys.max(1),
        semaphore,
    })
}
