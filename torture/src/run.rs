//! One whole torture run: servers, fenced store, proxies, workers, nemesis, checker,
//! report and timeline.

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock_tests::proxy::FaultProxy;

use crate::checker::{check, holdings, History};
use crate::clock::now_ns;
use crate::events::Event;
use crate::faults::FaultKind;
use crate::nemesis::Nemesis;
use crate::options::{RunOptions, Servers, WorkerOptions};
use crate::report::{failures, Report};
use crate::schedule::{plan, ScheduleParams};
use crate::store::WriteRecord;
use crate::targets::{proxy_not_applicable, EventLog, LocalServers, ServerSide, WorkerPool};
use crate::urls::{resolve, ServiceUrl};

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The report's text.
    pub report: String,
    /// Whether it passed (the exit status is 0).
    pub passed: bool,
}

/// The fenced store process, killed on drop.
struct StoreProcess {
    child: Child,
    addr: SocketAddr,
}

impl StoreProcess {
    fn start(exe: &Path, log: &Path) -> Result<Self, String> {
        let mut child = Command::new(exe)
            .arg("--log")
            .arg(log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start the fenced store {}: {e}", exe.display()))?;
        let stdout = child.stdout.take().ok_or("store stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("read the store's address: {e}"))?;
        let addr = line
            .trim()
            .strip_prefix("LISTENING ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("the fenced store said `{}`, not its address", line.trim()))?;
        Ok(Self { child, addr })
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binaries of this package, found beside the running `torture`.
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    let path = exe.with_file_name(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found beside {}: build the whole package (`cargo build -p dlock-torture`)",
            path.display(),
            exe.display()
        ))
    }
}

/// Runs the torture described by `options`, printing progress and the report.
///
/// # Errors
/// Set-up failed (servers, store, proxies, workers); a failed *check* is not an error but
/// an [`Outcome`] that did not pass.
pub fn run(options: &RunOptions) -> Result<Outcome, String> {
    fs::create_dir_all(&options.out)
        .map_err(|e| format!("create {}: {e}", options.out.display()))?;
    let out = options.out.clone();
    let exe = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    let store_exe = sibling("torture-store")?;

    let (servers, url) = match &options.servers {
        Servers::Local(kind) => {
            let what = if *kind == crate::options::LocalKind::File {
                "lock directory"
            } else {
                "servers"
            };
            println!("starting local {} {what} …", kind.name());
            let local = LocalServers::start(*kind)?;
            let url = local.url(options.ttl);
            (ServerSide::Local(local), url)
        }
        Servers::Url(url) => (ServerSide::Pids(options.server_pids.clone()), url.clone()),
    };
    let service = ServiceUrl::parse(&url)?;
    if let ServerSide::Pids(pids) = &servers {
        for (addr, _) in pids {
            if !service.hosts.contains(addr) {
                return Err(format!(
                    "`--server-pid {addr}=…`: {addr} is not one of the URL's hosts ({})",
                    service.hosts.join(", ")
                ));
            }
        }
    }
    let header = format!(
        "torture {}: {:.0} s, {} workers, seed {}, ttl {} ms, {} keys, late tolerance {} ms",
        service.redacted(),
        options.duration.as_secs_f64(),
        options.workers,
        options.seed,
        options.ttl.as_millis(),
        options.keys,
        options.late_tolerance.as_millis()
    );
    println!("{header}");

    let mut kinds = Vec::new();
    let mut skipped: Vec<(FaultKind, String)> = Vec::new();
    for kind in &options.faults {
        match servers.not_applicable(*kind, &service) {
            None => kinds.push(*kind),
            Some(why) => skipped.push((*kind, why)),
        }
    }
    let params = ScheduleParams {
        duration: options.duration,
        ttl: options.ttl,
        workers: options.workers,
        members: servers.members().max(1),
        kinds: kinds.clone(),
    };
    let planned = plan(options.seed, &params);
    let mut schedule_text = format!("fault plan (seed {}):\n", options.seed);
    for p in &planned {
        schedule_text.push_str(&format!("  {p}\n"));
    }
    for (kind, why) in &skipped {
        schedule_text.push_str(&format!("  skipped {kind}: {why}\n"));
    }
    print!("{schedule_text}");
    let _ = fs::write(out.join("schedule.txt"), &schedule_text);

    let store_log = out.join("store.log");
    let _ = fs::remove_file(&store_log);
    let store = StoreProcess::start(&store_exe, &store_log)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let use_proxies = proxy_not_applicable(&service).is_none();
    // PostgreSQL's locks are session advisory locks, MySQL's named locks: the server
    // frees them when the connection ends
    let postgres = matches!(service.scheme.as_str(), "postgres" | "postgresql");
    let mysql = matches!(service.scheme.as_str(), "mysql" | "mysqls");
    // where `terminate-backend` and `replace-lock-file` read the holder's name
    let client_name = mysql || service.scheme == "file";
    let mut proxies: Vec<Vec<Arc<FaultProxy>>> = Vec::new();
    let mut worker_options = Vec::new();
    for id in 0..options.workers {
        let mut mine = Vec::new();
        let mut worker_url = url.clone();
        if use_proxies {
            for host in &service.hosts {
                let upstream = resolve(host).ok_or_else(|| format!("cannot resolve {host}"))?;
                let proxy = runtime
                    .block_on(FaultProxy::try_start(upstream))
                    .map_err(|e| format!("fault proxy to {upstream}: {e}"))?;
                mine.push(Arc::new(proxy));
            }
            let hosts: Vec<String> = mine.iter().map(|p| p.addr().to_string()).collect();
            worker_url = service.with_hosts(&hosts);
        }
        if postgres && !service.rest.contains("application_name=") {
            // so that `terminate-backend` finds this worker's sessions
            worker_url = crate::urls::with_param(
                &worker_url,
                "application_name",
                &crate::targets::application_name(id),
            );
        }
        if client_name && !service.rest.contains("client_name=") {
            // so that `terminate-backend` (MySQL) and `replace-lock-file` (file) find
            // this worker's leases: their owner tokens end in this name
            worker_url = crate::urls::with_param(
                &worker_url,
                "client_name",
                &crate::targets::application_name(id),
            );
        }
        proxies.push(mine);
        worker_options.push(WorkerOptions {
            id,
            incarnation: 0,
            url: worker_url,
            store: store.addr,
            seed: options.seed,
            ttl: options.ttl,
            keys: options.keys,
            semaphore: service.scheme != "redlock",
        });
    }
    let events: EventLog = Arc::new(Mutex::new(Vec::new()));
    let pool = Arc::new(Mutex::new(WorkerPool::new(
        exe,
        worker_options,
        &out,
        Arc::clone(&events),
    )));
    {
        let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
        for i in 0..options.workers {
            pool.spawn(i)?;
        }
    }
    wait_ready(&events, options.workers, Duration::from_secs(30));

    let run_start = now_ns();
    println!("running for {:.0} s …", options.duration.as_secs_f64());
    let mut nemesis = Nemesis {
        pool: Arc::clone(&pool),
        proxies,
        servers,
        connection_bound_locks: postgres || mysql,
    };
    let nemesis_plan = planned.clone();
    let nemesis_thread = thread::spawn(move || {
        let injected = nemesis.run(&nemesis_plan, run_start);
        (injected, nemesis)
    });
    thread::sleep(options.duration);
    let (injected, nemesis) = nemesis_thread
        .join()
        .map_err(|_| "the nemesis thread panicked".to_string())?;
    let stop_limit = options.ttl * 8 + Duration::from_secs(10);
    let stopped = pool
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .stop_all(stop_limit);
    let run_end = now_ns();
    runtime.block_on(async {
        if let Ok(mut client) =
            crate::store_client::StoreClient::connect(store.addr, "shutdown").await
        {
            let _ = client.shutdown().await;
        }
    });
    drop(store);
    drop(nemesis); // proxies and servers go
    drop(runtime);

    let records = read_records(&store_log)?;
    let events = events.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut events_text = String::new();
    for e in &events {
        events_text.push_str(&format!("w{}.{} {}\n", e.worker, e.incarnation, e.event));
    }
    let _ = fs::write(out.join("events.log"), events_text);
    let (holdings, errors) = holdings(&events);
    let figures = check(&History {
        holdings: &holdings,
        errors,
        records: &records,
        faults: &injected,
        tolerance_ns: u64::try_from(options.late_tolerance.as_nanos()).unwrap_or(u64::MAX),
    });
    let report = Report {
        header: header.clone(),
        fencing: service.fencing(),
        figures: &figures,
        faults: &injected,
        skipped: &skipped,
        stopped: &stopped,
        run_start_ns: run_start,
    }
    .render();
    let svg = crate::timeline::render(
        &header,
        run_start,
        run_end,
        options.workers,
        &holdings,
        &records,
        &injected,
    );
    fs::write(out.join("report.txt"), &report)
        .map_err(|e| format!("write {}: {e}", out.join("report.txt").display()))?;
    fs::write(out.join("timeline.svg"), svg)
        .map_err(|e| format!("write {}: {e}", out.join("timeline.svg").display()))?;
    print!("{report}");
    println!(
        "report: {}, timeline: {}",
        out.join("report.txt").display(),
        out.join("timeline.svg").display()
    );
    Ok(Outcome {
        passed: failures(&figures, service.fencing()).is_empty(),
        report,
    })
}

fn wait_ready(events: &EventLog, workers: usize, limit: Duration) {
    let started = Instant::now();
    while started.elapsed() < limit {
        let ready = events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|e| matches!(e.event, Event::Ready { .. }))
            .count();
        if ready >= workers {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    println!("warning: not every worker connected within {limit:?}; starting anyway");
}

fn read_records(path: &Path) -> Result<Vec<WriteRecord>, String> {
    let text = fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    text.lines().map(WriteRecord::parse).collect()
}
