//! `--held[=N,N,…]` (Redis, etcd, ZooKeeper): what keeping many leases
//! alive costs, for each N (default 1,000, 10,000 and 50,000).
//!
//! For each N, a fresh backend acquires N locks (at most `--in-flight`
//! acquisitions at once, default 500) at ttl 3 s, lets every lease renew
//! once, then holds them all for a window (`--window=SECS`, default 10 s).
//! Printed per N: the acquire rate; the leases lost (by the end of the
//! window); the server's requests per held lock per second over the window
//! (Redis: `EVALSHA`s from `INFO commandstats`, and the `PEXPIRE`s the
//! scripts ran; etcd: gRPC messages received, from its Prometheus `/metrics`
//! on the client port; ZooKeeper: `zk_packets_received` from the `mntr`
//! four-letter word); the server's CPU per held lock per second (the
//! listening process's `/proc/<pid>/stat`, found with `ss -ltnp`, so only
//! for a server on this machine: "–" otherwise); the bench process's own
//! CPU over the window; and its RSS while holding N, less its RSS before
//! the first acquisition, per lock.
//!
//! With one N on Redis it then runs the baseline of the Redis renewal: the
//! same N keys renewed by one compare-and-`PEXPIRE` script call each every
//! ttl/3, as dlock did before it renewed up to 100 leases per call (and as
//! single-key Redlock clients do), and prints Redis CPU per renewal for
//! both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockGuard};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use super::redis_info::RedisInfo;
use super::stats::{print_table, Row};
use super::workloads::BoxError;

/// The N values when `--held` names none.
pub const DEFAULT_HELD: &[usize] = &[1_000, 10_000, 50_000];
/// The window when `--window` names none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// Acquisitions in flight at once when `--in-flight` names no number.
pub const DEFAULT_IN_FLIGHT: usize = 500;
const TTL: Duration = Duration::from_secs(3);

/// What `--held` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The numbers of locks to hold, one after another.
    pub counts: Vec<usize>,
    /// How long all N are held while the counters run.
    pub window: Duration,
    /// The most acquisitions in flight at once.
    pub in_flight: usize,
}

/// The N values of `--held[=N,N,…]`.
pub fn parse_counts(arg: &str) -> Option<Vec<usize>> {
    match arg {
        "" => Some(DEFAULT_HELD.to_vec()),
        list => list
            .strip_prefix('=')?
            .split(',')
            .map(|n| {
                n.trim()
                    .replace('_', "")
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
            })
            .collect(),
    }
}

/// The baseline's renewal: one lease per call.
const RENEW_ONE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

/// Which kind of server the URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Redis,
    Etcd,
    ZooKeeper,
}

/// The server the URL names: what it is, where, and its process if it runs
/// on this machine.
struct Server {
    kind: Kind,
    host: String,
    port: u16,
    pid: Option<u32>,
    redis: Option<redis::aio::MultiplexedConnection>,
}

/// The server's request counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    /// Requests the server received (see the module docs for what counts).
    requests: u64,
    /// Redis only: `PEXPIRE`s run (one per lease renewed).
    pexpires: u64,
    /// Redis only: `INFO cpu`'s seconds.
    redis_cpu: f64,
}

impl Server {
    async fn find(url: &str) -> Result<Server, BoxError> {
        let scheme = dlock::url::scheme(url).unwrap_or("");
        let (kind, default_port) = match scheme {
            "redis" | "rediss" => (Kind::Redis, 6379),
            "etcd" => (Kind::Etcd, 2379),
            "zk" => (Kind::ZooKeeper, 2181),
            other => {
                return Err(format!(
                    "--held runs on redis://, etcd:// and zk:// URLs, not `{other}://`"
                )
                .into())
            }
        };
        let (host, port) = first_host(url, default_port).ok_or("no host in the URL")?;
        let pid = listening_pid(port);
        let redis = match kind {
            Kind::Redis => {
                let plain = url.split('?').next().unwrap_or(url);
                Some(
                    redis::Client::open(plain)?
                        .get_multiplexed_async_connection()
                        .await?,
                )
            }
            _ => None,
        };
        Ok(Server {
            kind,
            host,
            port,
            pid,
            redis,
        })
    }

    async fn counters(&mut self) -> Result<Counters, BoxError> {
        match self.kind {
            Kind::Redis => {
                let conn = self.redis.as_mut().ok_or("no Redis connection")?;
                let info = RedisInfo::read(conn).await?;
                Ok(Counters {
                    requests: info.calls("evalsha"),
                    pexpires: info.calls("pexpire"),
                    redis_cpu: info.cpu_seconds,
                })
            }
            Kind::Etcd => {
                let text = http_get(&self.host, self.port, "/metrics").await?;
                // Every gRPC message, unary or on a stream (a keep-alive is
                // one message on its stream).
                let requests = text
                    .lines()
                    .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64;
                Ok(Counters {
                    requests,
                    ..Counters::default()
                })
            }
            Kind::ZooKeeper => {
                let text = four_letters(&self.host, self.port, "mntr").await?;
                let requests = text
                    .lines()
                    .find_map(|l| l.strip_prefix("zk_packets_received"))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or(
                        "`mntr` gave no zk_packets_received (is it in 4lw.commands.whitelist?)",
                    )?;
                Ok(Counters {
                    requests,
                    ..Counters::default()
                })
            }
        }
    }

    /// What [`Counters::requests`] counts, for the table.
    fn counted(&self) -> &'static str {
        match self.kind {
            Kind::Redis => "`EVALSHA`",
            Kind::Etcd => "gRPC messages",
            Kind::ZooKeeper => "packets",
        }
    }

    /// The server's CPU seconds so far (its process, or Redis's own count).
    fn cpu(&self, counters: &Counters) -> Option<f64> {
        match self.pid {
            Some(pid) => process_cpu(pid),
            None if self.kind == Kind::Redis => Some(counters.redis_cpu),
            None => None,
        }
    }
}

/// One N's figures.
struct Measured {
    held: usize,
    acquire_rate: f64,
    lost: usize,
    requests_per_lock_s: f64,
    pexpires_per_lock_s: Option<f64>,
    server_cpu_per_lock_s: Option<Duration>,
    server_cpu_share: Option<f64>,
    client_cpu_share: f64,
    rss_per_lock: Option<f64>,
}

/// Runs `--held` against `url` and prints the table.
pub async fn run(url: &str, options: &Options) -> Result<(), BoxError> {
    // dlock's warnings (a lease lost, a grant answered too late) to stderr:
    // when a lease goes, they say why.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .try_init();
    let mut server = Server::find(url).await?;
    let base_rss = rss_bytes();
    println!(
        "\n### Held locks ({}), ttl {TTL:?}, window {:?}, at most {} acquisitions in flight; server pid {}\n",
        dlock::url::redact(url),
        options.window,
        options.in_flight,
        server.pid.map_or("not found (no server CPU)".to_owned(), |p| p.to_string()),
    );
    let mut rows = Vec::new();
    for &n in &options.counts {
        let row = hold(url, &mut server, n, options, base_rss).await?;
        eprintln!(
            "N = {n}: acquired {:.0}/s, {} lost",
            row.acquire_rate, row.lost
        );
        rows.push(row);
    }
    println!("| held locks | acquired/s | leases lost | {} per held lock per s | server CPU per held lock per s | server CPU | client CPU | client RSS per lock |", server.counted());
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let dash = || "–".to_owned();
        let requests = match r.pexpires_per_lock_s {
            Some(p) => format!("{:.3} ({p:.2} `PEXPIRE`)", r.requests_per_lock_s),
            None => format!("{:.3}", r.requests_per_lock_s),
        };
        println!(
            "| {} | {:.0} | {} | {requests} | {} | {} | {:.0} % | {} |",
            r.held,
            r.acquire_rate,
            r.lost,
            r.server_cpu_per_lock_s
                .map_or_else(dash, |d| format!("{:.2} µs", d.as_secs_f64() * 1e6)),
            r.server_cpu_share
                .map_or_else(dash, |s| format!("{:.0} %", s * 100.0)),
            r.client_cpu_share * 100.0,
            r.rss_per_lock
                .map_or_else(dash, |b| format!("{:.1} KB", b / 1000.0)),
        );
    }
    if server.kind == Kind::Redis && options.counts.len() == 1 {
        redis_baseline(url, &mut server, options.counts[0], options.window).await?;
    }
    Ok(())
}

/// Holds `n` locks on a fresh backend through the window.
async fn hold(
    url: &str,
    server: &mut Server,
    n: usize,
    options: &Options,
    base_rss: Option<u64>,
) -> Result<Measured, BoxError> {
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let run_id = std::process::id();
    let started = Instant::now();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    let mut taking = JoinSet::new();
    let mut next = 0;
    while guards.len() < n {
        while next < n && taking.len() < options.in_flight.max(1) {
            let lock = Lock::new(format!("bench:{run_id}:held:{n}:{next}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            taking.spawn(async move { lock.try_acquire().await });
            next += 1;
        }
        let taken = taking.join_next().await.ok_or("no acquisition left")?;
        let failed = |why: String| {
            format!(
                "N = {n}: after {} acquisitions in {:?}: {why}",
                guards.len(),
                started.elapsed()
            )
        };
        match taken? {
            Ok(Some(guard)) => {
                guards.push(guard);
                if guards.len().is_multiple_of(10_000) {
                    eprintln!(
                        "N = {n}: {} acquired in {:.1} s",
                        guards.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            Ok(None) => return Err(failed("a bench key was busy".into()).into()),
            Err(e) => return Err(failed(e.to_string()).into()),
        }
    }
    let acquire_rate = n as f64 / started.elapsed().as_secs_f64();
    // Every lease renews once before the counters start.
    tokio::time::sleep(TTL / 2).await;
    let rss = rss_bytes();
    let before = server.counters().await?;
    let (server_cpu_before, client_before) = (server.cpu(&before), process_cpu_self());
    let window_started = Instant::now();
    tokio::time::sleep(options.window).await;
    let after = server.counters().await?;
    let (server_cpu_after, client_after) = (server.cpu(&after), process_cpu_self());
    let window = window_started.elapsed().as_secs_f64();
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    // Released as they were taken, a bounded number at once.
    let mut releasing = JoinSet::new();
    for guard in guards {
        if releasing.len() >= options.in_flight.max(1) {
            releasing.join_next().await;
        }
        // A lost lease's release says so; the count above has it.
        releasing.spawn(async move {
            let _ = guard.release().await;
        });
    }
    while releasing.join_next().await.is_some() {}
    drop(backend);
    let per_lock_s = |count: u64| count as f64 / n as f64 / window;
    let server_cpu = match (server_cpu_before, server_cpu_after) {
        (Some(b), Some(a)) => Some((a - b).max(0.0)),
        _ => None,
    };
    Ok(Measured {
        held: n,
        acquire_rate,
        lost,
        requests_per_lock_s: per_lock_s(after.requests.saturating_sub(before.requests)),
        pexpires_per_lock_s: (server.kind == Kind::Redis)
            .then(|| per_lock_s(after.pexpires.saturating_sub(before.pexpires))),
        server_cpu_per_lock_s: server_cpu.map(|s| Duration::from_secs_f64(s / n as f64 / window)),
        server_cpu_share: server_cpu.map(|s| s / window),
        client_cpu_share: (client_after - client_before).max(0.0) / window,
        rss_per_lock: match (base_rss, rss) {
            (Some(b), Some(r)) => Some(r.saturating_sub(b) as f64 / n as f64),
            _ => None,
        },
    })
}

/// The Redis renewal against one script call per lease (see the module
/// docs), on `n` keys.
async fn redis_baseline(
    url: &str,
    server: &mut Server,
    held: usize,
    window: Duration,
) -> Result<(), BoxError> {
    let client = redis::Client::open(url.split('?').next().unwrap_or(url))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let run_id = std::process::id();

    // dlock once more, for the Redis CPU per renewal beside the baseline's.
    let backend: Arc<dyn LockBackend> = dlock::connect(url).await?;
    let mut guards = Vec::with_capacity(held);
    for batch in (0..held).collect::<Vec<_>>().chunks(1_000) {
        let mut taking = JoinSet::new();
        for &i in batch {
            let lock = Lock::new(format!("bench:{run_id}:held:{i}"))
                .with_backend(backend.clone())
                .ttl(TTL);
            taking.spawn(async move { lock.try_acquire().await });
        }
        while let Some(taken) = taking.join_next().await {
            guards.push(taken??.ok_or("a bench key was taken")?);
        }
    }
    tokio::time::sleep(TTL / 3).await;
    let (ours, our_renewals) = cpu_per_renewal(server, window).await?;
    for guard in guards {
        let _ = guard.release().await;
    }

    let script = redis::Script::new(RENEW_ONE);
    let keys: Vec<String> = (0..held)
        .map(|i| format!("bench:{run_id}:base:{i}"))
        .collect();
    for chunk in keys.chunks(1_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg("token")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    script.prepare_invoke().load_async(&mut conn).await?;
    let renewing = {
        let mut conn = conn.clone();
        let keys = keys.clone();
        let hash = script.get_hash().to_owned();
        tokio::spawn(async move {
            let stop = Instant::now() + window + TTL;
            while Instant::now() < stop {
                let round = Instant::now();
                for chunk in keys.chunks(1_000) {
                    let mut pipe = redis::pipe();
                    for key in chunk {
                        pipe.cmd("EVALSHA")
                            .arg(&hash)
                            .arg(1)
                            .arg(key)
                            .arg("token")
                            .arg(TTL.as_millis() as u64);
                    }
                    let _: Result<Vec<i64>, _> = pipe.query_async(&mut conn).await;
                }
                tokio::time::sleep_until((round + TTL / 3).into()).await;
            }
        })
    };
    tokio::time::sleep(TTL / 3).await;
    let (baseline, base_renewals) = cpu_per_renewal(server, window).await?;
    renewing.abort();
    for chunk in keys.chunks(1_000) {
        let _: i64 = redis::cmd("DEL").arg(chunk).query_async(&mut conn).await?;
    }
    println!("\ndlock: {our_renewals} renewals in the window; baseline: {base_renewals} renewals");
    print_table(
        &format!("Redis CPU per renewal, {held} held locks, ttl {TTL:?}"),
        "one script call per lease",
        &[Row::latency(
            &format!("Redis CPU per renewal, N = {held}"),
            ours,
            baseline,
        )],
    );
    Ok(())
}

/// Redis CPU per renewal (`PEXPIRE`s run) over `window`, while something
/// renews.
async fn cpu_per_renewal(
    server: &mut Server,
    window: Duration,
) -> Result<(Duration, u64), BoxError> {
    let before = server.counters().await?;
    tokio::time::sleep(window).await;
    let after = server.counters().await?;
    let renewals = after.pexpires.saturating_sub(before.pexpires);
    let per = (after.redis_cpu - before.redis_cpu) / renewals.max(1) as f64;
    Ok((Duration::from_secs_f64(per.max(0.0)), renewals))
}

/// The first `host:port` of a URL (credentials, path and query left out).
fn first_host(url: &str, default_port: u16) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1;
    let rest = rest.split(['/', '?']).next()?;
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let first = hosts.split(',').next()?;
    if let Some(bracketed) = first.strip_prefix('[') {
        let (host, port) = bracketed.split_once(']')?;
        let port = port
            .strip_prefix(':')
            .map_or(Some(default_port), |p| p.parse().ok())?;
        return Some((host.to_owned(), port));
    }
    match first.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((first.to_owned(), default_port)),
    }
}

/// The pid of the process listening on `port` on this machine (`ss -ltnp`).
fn listening_pid(port: u16) -> Option<u32> {
    let out = std::process::Command::new("ss")
        .args(["-ltnpH", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find("pid=")? + 4;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A process's CPU seconds (user + system) from `/proc/<pid>/stat`.
fn process_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clock_ticks())
}

/// `sysconf(_SC_CLK_TCK)`, by `getconf` (100 on Linux nearly everywhere).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// This process's CPU seconds, all threads.
fn process_cpu_self() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(|t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
        .unwrap_or(0.0)
}

/// This process's resident set (`VmRSS` in `/proc/self/status`), in bytes.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// An HTTP/1.0 GET of `path`, the body.
async fn http_get(host: &str, port: u16, path: &str) -> Result<String, BoxError> {
    let mut stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.to_owned())
}

/// A ZooKeeper four-letter word's answer.
async fn four_letters(host: &str, port: u16, word: &str) -> Result<String, BoxError> {
    let mut stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream.write_all(word.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_host_of_each_kind_of_url() {
        let h = |url, port| first_host(url, port);
        assert_eq!(
            h("etcd://127.0.0.1:2379", 2379),
            Some(("127.0.0.1".into(), 2379))
        );
        assert_eq!(h("zk://a:1,b:2/chroot?x=1", 2181), Some(("a".into(), 1)));
        assert_eq!(h("redis://:pw@h/0", 6379), Some(("h".into(), 6379)));
        assert_eq!(h("etcd://u:p@[::1]:9,x", 2379), Some(("::1".into(), 9)));
    }

    #[test]
    fn held_counts_parse() {
        assert_eq!(parse_counts(""), Some(DEFAULT_HELD.to_vec()));
        assert_eq!(parse_counts("=1000,50_000"), Some(vec![1_000, 50_000]));
        assert_eq!(parse_counts("=0"), None);
        assert_eq!(parse_counts("x"), None);
    }
}
