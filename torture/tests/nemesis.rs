//! The nemesis on its own: a plan replays identically from its seed and places every kind,
//! and injecting a fault really stops, kills and restarts a worker process and switches
//! its proxy, each undone at the end.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_tests::proxy::{FaultProxy, ProxyMode};
use dlock_torture::events::Event;
use dlock_torture::faults::FaultKind;
use dlock_torture::nemesis::Nemesis;
use dlock_torture::options::WorkerOptions;
use dlock_torture::schedule::{plan, PlannedFault, ScheduleParams};
use dlock_torture::targets::{EventLog, ServerSide, WorkerPool};

fn params(kinds: Vec<FaultKind>) -> ScheduleParams {
    ScheduleParams {
        duration: Duration::from_secs(30),
        ttl: Duration::from_secs(2),
        workers: 4,
        members: 3,
        kinds,
    }
}

#[test]
fn a_plan_replays_from_its_seed() {
    let p = params(FaultKind::ALL.to_vec());
    for seed in 0..50 {
        let first = plan(seed, &p);
        assert_eq!(first, plan(seed, &p), "seed {seed}");
        let printed: Vec<String> = first.iter().map(ToString::to_string).collect();
        let again: Vec<String> = plan(seed, &p).iter().map(ToString::to_string).collect();
        assert_eq!(printed, again);
        // faults never overlap and end a ttl before the run does
        for pair in first.windows(2) {
            assert!(pair[0].at + pair[0].length <= pair[1].at, "{pair:?}");
        }
        let last = first.last().expect("a plan");
        assert!(last.at + last.length <= Duration::from_secs(28));
    }
    assert_ne!(plan(1, &p), plan(2, &p), "another seed, another plan");
}

#[test]
fn a_thirty_second_plan_has_every_kind_of_each_backend() {
    // the kinds each local backend takes (the suite's runs use seed 15, default kinds)
    let redis: Vec<FaultKind> = FaultKind::DEFAULT
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::KillLeader
                    | FaultKind::Failover
                    | FaultKind::TerminateBackend
                    | FaultKind::ReplaceLockFile
            )
        })
        .collect();
    let consensus: Vec<FaultKind> = FaultKind::DEFAULT
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::RestartServer
                    | FaultKind::Failover
                    | FaultKind::TerminateBackend
                    | FaultKind::ReplaceLockFile
            )
        })
        .collect();
    let cluster: Vec<FaultKind> = redis
        .iter()
        .copied()
        .filter(|k| !matches!(k, FaultKind::Blackhole | FaultKind::Reset))
        .collect();
    for kinds in [redis, consensus, cluster] {
        let planned = plan(15, &params(kinds.clone()));
        for kind in &kinds {
            assert!(
                planned.iter().any(|p| p.kind == *kind),
                "{kind} missing from {planned:#?}"
            );
        }
    }
}

/// The kinds `--local sentinel` takes: no proxy faults (the client connects to the master
/// the sentinels announce), no kill-leader (that is `failover` there).
fn sentinel_kinds() -> Vec<FaultKind> {
    FaultKind::DEFAULT
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::Blackhole
                    | FaultKind::Reset
                    | FaultKind::KillLeader
                    | FaultKind::TerminateBackend
                    | FaultKind::ReplaceLockFile
            )
        })
        .collect()
}

#[test]
fn the_sentinel_run_of_the_suite_has_a_failover_and_a_master_paused_past_down_after() {
    // runs.rs `redis_sentinel`: 30 s, 4 workers, 2 data nodes, seed 166. A server fault's
    // target names a role on Sentinel: even the master, odd the replica.
    let planned = plan(
        166,
        &ScheduleParams {
            members: 2,
            ..params(sentinel_kinds())
        },
    );
    for kind in sentinel_kinds() {
        assert!(
            planned.iter().any(|p| p.kind == kind),
            "{kind} missing from {planned:#?}"
        );
    }
    let on_master = |kind| planned.iter().any(|p| p.kind == kind && p.target % 2 == 0);
    assert!(on_master(FaultKind::PauseServerLong), "{planned:#?}");
    assert!(on_master(FaultKind::PauseServerShort), "{planned:#?}");
    // the failover's window (6-8 s at ttl 2 s) fits, with room for the sentinels' slack
    let last = planned.last().expect("a plan");
    assert!(
        last.at + last.length <= Duration::from_secs(28),
        "{planned:#?}"
    );
}

#[test]
fn the_user_server_run_of_the_suite_has_its_kinds() {
    // runs.rs `a_users_server_by_url_and_pid`: 25 s, 3 workers, one server, seed 15, the
    // kinds that need no `--local`
    let kinds: Vec<FaultKind> = FaultKind::DEFAULT
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::KillLeader
                    | FaultKind::RestartServer
                    | FaultKind::Failover
                    | FaultKind::TerminateBackend
                    | FaultKind::ReplaceLockFile
            )
        })
        .collect();
    let planned = plan(
        15,
        &ScheduleParams {
            duration: Duration::from_secs(25),
            ttl: Duration::from_secs(2),
            workers: 3,
            members: 1,
            kinds,
        },
    );
    for kind in [
        FaultKind::Blackhole,
        FaultKind::PauseServerShort,
        FaultKind::PauseServerLong,
    ] {
        assert!(
            planned.iter().any(|p| p.kind == kind),
            "{kind}: {planned:#?}"
        );
    }
}

fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
}

fn ready(events: &EventLog, incarnation: u32) -> bool {
    events
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.incarnation == incarnation && matches!(e.event, Event::Ready { .. }))
}

fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn faults_act_on_real_worker_processes_and_are_undone() {
    let dir = tempfile::tempdir().expect("temp dir");
    // a fenced store for the worker
    let mut store = Command::new(env!("CARGO_BIN_EXE_torture-store"))
        .arg("--log")
        .arg(dir.path().join("store.log"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("store");
    let mut line = String::new();
    BufReader::new(store.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("address");
    let store_addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .expect("address")
        .parse()
        .expect("addr");

    let events: EventLog = Arc::new(Mutex::new(Vec::new()));
    let worker = WorkerOptions {
        id: 0,
        incarnation: 0,
        url: "memory://".into(),
        store: store_addr,
        seed: 1,
        ttl: Duration::from_millis(500),
        keys: 1,
        semaphore: true,
    };
    let pool = Arc::new(Mutex::new(WorkerPool::new(
        env!("CARGO_BIN_EXE_torture").into(),
        vec![worker],
        dir.path(),
        Arc::clone(&events),
    )));
    pool.lock().unwrap().spawn(0).expect("spawn");
    wait_for("worker ready", Duration::from_secs(20), || {
        ready(&events, 0)
    });

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let proxy = runtime
        .block_on(FaultProxy::try_start(upstream.local_addr().expect("addr")))
        .expect("proxy");
    let proxy = Arc::new(proxy);
    let mut nemesis = Nemesis {
        pool: Arc::clone(&pool),
        proxies: vec![vec![Arc::clone(&proxy)]],
        servers: ServerSide::Pids(Vec::new()),
        connection_bound_locks: false,
    };
    let fault = |kind, length| PlannedFault {
        at: Duration::ZERO,
        kind,
        target: 0,
        length: Duration::from_millis(length),
    };

    // pause: the worker is stopped during the fault and running after it
    let pid = pool.lock().unwrap().pid(0).expect("pid");
    let injected = std::thread::scope(|s| {
        let handle = s.spawn(|| nemesis.inject(fault(FaultKind::PauseWorkerShort, 600)));
        wait_for("worker stopped", Duration::from_secs(5), || {
            state(pid) == Some('T')
        });
        handle.join().expect("inject")
    });
    assert_eq!(injected.outcome, Ok(()));
    assert!(injected.end_ns - injected.start_ns >= 600_000_000);
    assert_ne!(state(pid), Some('T'), "resumed after the fault");

    // blackhole: the proxy drops bytes during the fault and passes after it
    let injected = std::thread::scope(|s| {
        let handle = s.spawn(|| nemesis.inject(fault(FaultKind::Blackhole, 300)));
        wait_for("proxy blackholed", Duration::from_secs(5), || {
            proxy.mode() == ProxyMode::Blackhole
        });
        handle.join().expect("inject")
    });
    assert_eq!(injected.outcome, Ok(()));
    assert_eq!(
        proxy.mode(),
        ProxyMode::Pass,
        "passes again after the fault"
    );

    // reset: forgets no lock where locks outlive connections; where they do not
    // (PostgreSQL's session advisory locks), it is a loss the checker excuses
    let injected = nemesis.inject(fault(FaultKind::Reset, 100));
    assert_eq!((injected.outcome, injected.forgets_locks), (Ok(()), false));
    nemesis.connection_bound_locks = true;
    let injected = nemesis.inject(fault(FaultKind::Reset, 100));
    assert_eq!((injected.outcome, injected.forgets_locks), (Ok(()), true));
    assert_eq!(proxy.mode(), ProxyMode::Pass);

    // kill: a new process (next incarnation) runs after the fault
    let injected = nemesis.inject(fault(FaultKind::KillWorker, 100));
    assert_eq!(injected.outcome, Ok(()));
    assert!(state(pid).is_none(), "the old process is gone");
    let new_pid = pool.lock().unwrap().pid(0).expect("restarted");
    assert_ne!(new_pid, pid);
    wait_for("restarted worker ready", Duration::from_secs(20), || {
        ready(&events, 1)
    });

    // a server fault without server pids fails plainly, it is not silently done
    let injected = nemesis.inject(fault(FaultKind::PauseServerShort, 100));
    assert!(injected.outcome.is_err());

    assert_eq!(
        pool.lock().unwrap().stop_all(Duration::from_secs(10)),
        dlock_torture::targets::Stopped::default(),
        "stops when asked"
    );
    let _ = store.kill();
    let _ = store.wait();
}

#[test]
fn the_postgres_run_of_the_suite_has_every_kind() {
    // runs.rs `postgres_one_server`: 30 s, 4 workers, one server, seed 15; every kind but
    // kill-leader and failover (one server, no replica) and replace-lock-file (file only)
    let kinds: Vec<FaultKind> = FaultKind::DEFAULT
        .into_iter()
        .filter(|k| {
            !matches!(
                k,
                FaultKind::KillLeader | FaultKind::Failover | FaultKind::ReplaceLockFile
            )
        })
        .collect();
    assert_one_server_plan_has_every_kind(&kinds);
}

#[test]
fn the_mysql_and_file_runs_of_the_suite_have_every_kind() {
    // runs.rs `mysql_one_server`: 30 s, 4 workers, one server, seed 15; every kind but
    // failover (no replica) and replace-lock-file (file only); kill-leader is kill -9 of
    // the server
    let mysql: Vec<FaultKind> = FaultKind::DEFAULT
        .into_iter()
        .filter(|k| !matches!(k, FaultKind::Failover | FaultKind::ReplaceLockFile))
        .collect();
    // runs.rs `file_directory`: no server, no network: the worker faults and
    // replace-lock-file
    let file = vec![
        FaultKind::PauseWorkerShort,
        FaultKind::PauseWorkerLong,
        FaultKind::KillWorker,
        FaultKind::ReplaceLockFile,
    ];
    for kinds in [mysql, file] {
        assert_one_server_plan_has_every_kind(&kinds);
    }
}

/// The plan of a suite run on one server (seed 15, the suite's other
/// settings) draws every one of `kinds`.
fn assert_one_server_plan_has_every_kind(kinds: &[FaultKind]) {
    let planned = plan(
        15,
        &ScheduleParams {
            members: 1,
            ..params(kinds.to_vec())
        },
    );
    for kind in kinds {
        assert!(
            planned.iter().any(|p| p.kind == *kind),
            "{kind} missing from {planned:#?}"
        );
    }
}

#[test]
fn kinds_of_one_backend_leave_the_other_plans_as_they_were() {
    // `replace-lock-file` is in the default set but applies to `--local file` only: the
    // others drop it before drawing, so their seeded plans are still the ones in
    // docs/reliability (10 minutes, 4 workers, seed 1, ttl 2 s)
    assert!(FaultKind::DEFAULT.contains(&FaultKind::ReplaceLockFile));
    for (backend, members, skipped) in [
        (
            "postgres",
            1,
            &[FaultKind::KillLeader, FaultKind::Failover][..],
        ),
        (
            "redis",
            1,
            &[
                FaultKind::KillLeader,
                FaultKind::Failover,
                FaultKind::TerminateBackend,
            ][..],
        ),
    ] {
        let kinds: Vec<FaultKind> = FaultKind::DEFAULT
            .into_iter()
            .filter(|k| *k != FaultKind::ReplaceLockFile && !skipped.contains(k))
            .collect();
        let planned = plan(
            1,
            &ScheduleParams {
                duration: Duration::from_secs(600),
                members,
                ..params(kinds)
            },
        );
        let path = format!(
            "{}/../docs/reliability/{backend}/schedule.txt",
            env!("CARGO_MANIFEST_DIR")
        );
        let recorded = std::fs::read_to_string(&path).expect("the recorded schedule");
        let recorded: Vec<&str> = recorded
            .lines()
            .filter(|l| l.starts_with("  +"))
            .map(|l| l.trim_start())
            .collect();
        let now: Vec<String> = planned.iter().map(ToString::to_string).collect();
        assert_eq!(recorded, now, "{backend}'s seed-1 plan changed");
    }
}

/// `--local postgres`: pausing the server stops the postmaster and every process it forked
/// (each session is a backend of its own), resuming continues them all;
/// `terminate-backend` ends a worker's session that holds an advisory lock, found by its
/// `application_name`; `restart-server` is a fast restart that ends every session.
#[test]
fn postgres_pause_stops_every_backend_terminate_and_restart_end_sessions() {
    use dlock_torture::options::LocalKind;
    use dlock_torture::targets::{application_name, LocalServers};

    let mut servers = LocalServers::start(LocalKind::Postgres).expect("postgres");
    let LocalServers::Postgres(pg) = &servers else {
        panic!("not postgres")
    };
    let postmaster = dlock_tests::servers::ServerControl::pid(pg.as_ref()).expect("pid");
    // a client session of "worker 2" holding an advisory lock, as dlock's would
    let mut client = Command::new(pg.psql_path())
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-XAtq", "-c"])
        .arg("SELECT pg_advisory_lock(42); SELECT pg_sleep(60)")
        .env("PGAPPNAME", application_name(2))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql");
    let holding = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted";
    wait_for("the client holds its lock", Duration::from_secs(20), || {
        pg.psql(holding) == "1"
    });
    let children = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        let after = s[s.rfind(')')? + 1..].to_string();
                        after.split_whitespace().nth(1)?.parse::<u32>().ok()
                    })
                    == Some(postmaster)
            })
            .collect()
    };
    assert!(children().len() >= 2, "a backend and background processes");

    servers.pause(0).expect("pause");
    assert_eq!(state(postmaster), Some('T'));
    for pid in children() {
        assert!(
            matches!(state(pid), Some('T' | 'Z') | None),
            "child {pid} of the postmaster not stopped"
        );
    }
    servers.resume(0).expect("resume");
    assert_ne!(state(postmaster), Some('T'));
    for pid in children() {
        assert_ne!(state(pid), Some('T'), "child {pid} still stopped");
    }

    // worker 0 has no session: the one holding a lock is ended, whoever's it is
    let ended = servers.terminate_backend(0).expect("terminate");
    let (worker, text) = ended.expect("a session ended");
    assert_eq!(worker, 2, "{text}");
    assert!(text.contains("holding locks"), "{text}");
    wait_for(
        "the client's session ended",
        Duration::from_secs(10),
        || client.try_wait().expect("wait").is_some(),
    );
    let LocalServers::Postgres(pg) = &servers else {
        unreachable!()
    };
    assert_eq!(pg.psql(holding), "0", "its lock went with it");
    assert_eq!(servers.terminate_backend(0).expect("terminate"), None);

    // a fast restart: the same port, every session gone, the data kept
    let LocalServers::Postgres(pg) = &servers else {
        unreachable!()
    };
    pg.psql("CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)");
    servers.restart(0).expect("restart");
    let LocalServers::Postgres(pg) = &servers else {
        unreachable!()
    };
    assert_eq!(pg.psql("SELECT n FROM kept"), "7");
    assert!(servers.restart_forgets_locks());
}

#[test]
fn freeze_flows_is_asked_for_by_name_and_keeps_the_default_plans() {
    // Not in the default set, so seeded plans of the default runs are what they were.
    assert!(!FaultKind::DEFAULT.contains(&FaultKind::FreezeFlows));
    assert_eq!(
        &FaultKind::ALL[..FaultKind::DEFAULT.len()],
        &FaultKind::DEFAULT[..]
    );
    let kinds = vec![
        FaultKind::PauseWorkerShort,
        FaultKind::KillWorker,
        FaultKind::FreezeFlows,
    ];
    // runs.rs `frozen_flows_on_redis_and_postgres`: seed 15, 30 s
    let planned = plan(15, &params(kinds.clone()));
    for kind in &kinds {
        assert!(
            planned.iter().any(|p| p.kind == *kind),
            "{kind} missing from {planned:#?}"
        );
    }
}

/// `--local mysql`: `terminate-backend` is `KILL` of a worker's session holding a named
/// lock, found by the client name its owner tokens end in; the holder's `lost()` fires; a
/// restart keeps the fence rows; `kill-leader` is kill -9 of the one server, whose
/// sessions (and locks) go with it.
#[test]
fn mysql_kill_ends_a_holding_session_and_kill9_forgets_locks() {
    use dlock_torture::options::LocalKind;
    use dlock_torture::targets::{application_name, LocalServers};

    let mut servers = LocalServers::start(LocalKind::Mysql).expect("mysql");
    let url = servers.url(Duration::from_secs(2));
    assert!(url.ends_with("?session_timeout=2s"), "{url}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // "worker 2" holds a lock through dlock, as a torture worker does
    let worker_url = dlock_torture::urls::with_param(&url, "client_name", &application_name(2));
    let backend = runtime
        .block_on(dlock::connect(&worker_url))
        .expect("connect");
    let guard = runtime
        .block_on(
            dlock::Lock::new("torture:k0")
                .ttl(Duration::from_secs(2))
                .with_backend(Arc::clone(&backend))
                .acquire(),
        )
        .expect("acquire");
    let fence = guard.fencing_token().expect("a fence");

    // worker 0 holds nothing: the session holding a lock is ended, whoever's it is
    let (worker, text) = servers
        .end_session(0)
        .expect("kill")
        .expect("a session ended");
    assert_eq!(worker, Some(2), "{text}");
    assert!(text.contains("holding locks"), "{text}");
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(3), guard.lost()).await })
        .expect("lost() within the ttl after the KILL");
    drop(guard);

    // kill -9 of the one server: its sessions go, the fence rows stay
    assert_eq!(servers.leader(Duration::from_secs(1)), Ok(0));
    assert!(servers.kill_forgets_locks());
    let guard = runtime
        .block_on(
            dlock::Lock::new("torture:k0")
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(5))
                .with_backend(Arc::clone(&backend))
                .acquire(),
        )
        .expect("acquire again");
    let second = guard.fencing_token().expect("a fence");
    assert!(second > fence);
    servers.kill(0).expect("kill -9");
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(3), guard.lost()).await })
        .expect("lost() within the ttl after kill -9 of the server");
    drop(guard);
    servers.start_again(0).expect("start again");
    servers.restart(0).expect("restart");
    let guard = runtime
        .block_on(
            dlock::Lock::new("torture:k0")
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(10))
                .with_backend(Arc::clone(&backend))
                .acquire(),
        )
        .expect("acquire after the restarts");
    assert!(
        guard.fencing_token().expect("a fence") > second,
        "fences go on across kill -9 and a restart"
    );
    runtime.block_on(guard.release()).expect("release");
    assert!(servers.restart_forgets_locks());
}

/// `--local file`: `replace-lock-file` takes a held lock file from its holder, removing
/// it the first time and renaming a new one over it the second; each time the holder's
/// `lost()` fires, and the next acquirer gets a higher fence.
#[test]
fn file_replace_takes_the_lock_file_from_its_holder() {
    use dlock_torture::options::LocalKind;
    use dlock_torture::targets::{application_name, LocalServers};

    let mut servers = LocalServers::start(LocalKind::File).expect("a directory");
    assert_eq!(servers.members(), 0);
    let url = servers.url(Duration::from_secs(2));
    assert!(url.starts_with("file:///"), "{url}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let worker_url = dlock_torture::urls::with_param(&url, "client_name", &application_name(1));
    let backend = runtime
        .block_on(dlock::connect(&worker_url))
        .expect("connect");
    let take = || {
        runtime
            .block_on(
                dlock::Lock::new("torture:k1")
                    .ttl(Duration::from_millis(900))
                    .wait(Duration::from_secs(5))
                    .with_backend(Arc::clone(&backend))
                    .acquire(),
            )
            .expect("acquire")
    };
    assert_eq!(servers.replace_lock_file(0).expect("nothing held"), None);
    let mut last = 0;
    for how in ["removed", "replaced"] {
        let guard = take();
        let fence = guard.fencing_token().expect("a fence");
        assert!(fence > last);
        last = fence;
        let (worker, text) = servers
            .replace_lock_file(0)
            .expect("replace")
            .expect("a held file");
        assert_eq!(worker, Some(1), "{text}");
        assert!(text.contains(how), "{text}");
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(2), guard.lost()).await })
            .unwrap_or_else(|_| panic!("lost() within the ttl after the file was {how}"));
        drop(guard);
    }
    let guard = take();
    assert!(
        guard.fencing_token().expect("a fence") > last,
        "the counter goes on"
    );
    runtime.block_on(guard.release()).expect("release");
    // no server to pause, kill or end sessions on
    assert!(servers
        .not_applicable(FaultKind::PauseServerShort)
        .is_some());
    assert!(servers
        .not_applicable(FaultKind::TerminateBackend)
        .is_some());
    assert!(servers.not_applicable(FaultKind::ReplaceLockFile).is_none());
}
