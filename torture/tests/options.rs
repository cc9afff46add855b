//! The command line: every bad argument is an error that names it and says what to write;
//! URLs are taken apart and rewritten through proxies without losing credentials or path.

use dlock_torture::faults::FaultKind;
use dlock_torture::options::{parse_run, parse_worker, LocalKind, Servers, WorkerOptions};
use dlock_torture::urls::ServiceUrl;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn good_command_lines() {
    let run = parse_run(
        &args(&[
            "--local",
            "etcd",
            "--seconds",
            "30",
            "--workers",
            "8",
            "--faults",
            "reset,kill-leader",
            "--ttl-ms",
            "3000",
            "--out",
            "/tmp/x",
        ]),
        42,
    )
    .expect("valid");
    assert_eq!(run.servers, Servers::Local(LocalKind::Etcd));
    assert_eq!(run.duration.as_secs(), 30);
    assert_eq!(run.workers, 8);
    assert_eq!(run.seed, 42, "the clock's seed when none is given");
    assert_eq!(run.faults, vec![FaultKind::Reset, FaultKind::KillLeader]);
    assert_eq!(run.ttl.as_millis(), 3000);

    let run = parse_run(
        &args(&[
            "redis://127.0.0.1:6379",
            "--server-pid",
            "127.0.0.1:6379=4242",
            "--seed",
            "9",
        ]),
        1,
    )
    .expect("valid");
    assert_eq!(run.server_pids, vec![("127.0.0.1:6379".to_string(), 4242)]);
    assert_eq!(run.out.to_str(), Some("torture-9"));
    let run = parse_run(&args(&["--local", "sentinel", "--faults", "failover"]), 1).expect("valid");
    assert_eq!(run.servers, Servers::Local(LocalKind::Sentinel));
    assert_eq!(run.faults, vec![FaultKind::Failover]);
    let run = parse_run(
        &args(&["--local", "postgres", "--faults", "terminate-backend,reset"]),
        1,
    )
    .expect("valid");
    assert_eq!(run.servers, Servers::Local(LocalKind::Postgres));
    assert_eq!(
        run.faults,
        vec![FaultKind::Reset, FaultKind::TerminateBackend]
    );
    let run = parse_run(
        &args(&[
            "--local",
            "mysql",
            "--faults",
            "terminate-backend,kill-leader",
        ]),
        1,
    )
    .expect("valid");
    assert_eq!(run.servers, Servers::Local(LocalKind::Mysql));
    assert_eq!(
        run.faults,
        vec![FaultKind::KillLeader, FaultKind::TerminateBackend]
    );
    let run = parse_run(
        &args(&[
            "--local",
            "file",
            "--faults",
            "replace-lock-file,kill-worker",
        ]),
        1,
    )
    .expect("valid");
    assert_eq!(run.servers, Servers::Local(LocalKind::File));
    assert_eq!(
        run.faults,
        vec![FaultKind::KillWorker, FaultKind::ReplaceLockFile]
    );
    assert_eq!(LocalKind::Mysql.name(), "mysql");
    assert_eq!(LocalKind::File.name(), "file");
    let unknown = parse_run(&args(&["--local", "mariadb"]), 1).unwrap_err();
    assert!(unknown.0.contains("zk, postgres, mysql, file"), "{unknown}");
}

#[test]
fn bad_command_lines_name_the_argument() {
    for (line, names) in [
        (vec![], "no servers"),
        (vec!["--local", "sqlite"], "--local sqlite"),
        (vec!["redis://a:1", "--local", "redis"], "not both"),
        (vec!["redis://a:1", "redis://b:1"], "a second URL"),
        (vec!["redis://a:1", "--workers", "1"], "--workers 1"),
        (vec!["redis://a:1", "--workers", "many"], "--workers many"),
        (vec!["redis://a:1", "--minutes", "0"], "--minutes 0"),
        (
            vec!["redis://a:1", "--seconds"],
            "`--seconds` needs a value",
        ),
        (vec!["redis://a:1", "--ttl-ms", "10"], "--ttl-ms 10"),
        (
            vec!["redis://a:1", "--faults", "pause"],
            "unknown fault `pause`",
        ),
        (
            vec!["redis://a:1", "--server-pid", "4242"],
            "--server-pid 4242",
        ),
        (vec!["redis://a:1", "--frobnicate"], "--frobnicate"),
    ] {
        let err = parse_run(&args(&line), 1).expect_err(&format!("{line:?} must fail"));
        assert!(err.0.contains(names), "{line:?}: {err}");
    }
}

#[test]
fn worker_options_round_trip() {
    let worker = WorkerOptions {
        id: 3,
        incarnation: 2,
        url: "zk://127.0.0.1:1/app?session_timeout=4000ms".into(),
        store: "127.0.0.1:9".parse().expect("addr"),
        seed: 77,
        ttl: std::time::Duration::from_millis(1500),
        keys: 5,
        semaphore: false,
    };
    assert_eq!(parse_worker(&worker.to_args()).expect("parse"), worker);
    assert!(
        parse_worker(&args(&["--id", "1"])).is_err(),
        "no url, no store"
    );
}

#[test]
fn urls_keep_credentials_and_path_through_proxies() {
    let url = ServiceUrl::parse(
        "redlock://user:p%40ss@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout_ms=50",
    )
    .expect("valid");
    assert_eq!(url.hosts.len(), 3);
    assert!(!url.fencing(), "Redlock has no fencing");
    let proxied = url.with_hosts(&[
        "127.0.0.1:7".into(),
        "127.0.0.1:8".into(),
        "127.0.0.1:9".into(),
    ]);
    assert_eq!(
        proxied,
        "redlock://user:p%40ss@127.0.0.1:7,127.0.0.1:8,127.0.0.1:9?node_timeout_ms=50"
    );
    assert!(!url.redacted().contains("p%40ss"), "{}", url.redacted());
    assert!(ServiceUrl::parse("127.0.0.1:6379").is_err());
    assert!(ServiceUrl::parse("redis://").is_err());

    // a MySQL URL through a proxy keeps its database and parameters
    let mysql =
        ServiceUrl::parse("mysql://root@127.0.0.1:3306/dlock?session_timeout=2s").expect("valid");
    assert_eq!(mysql.hosts, ["127.0.0.1:3306"]);
    assert!(mysql.fencing());
    assert_eq!(
        mysql.with_hosts(&["127.0.0.1:9".into()]),
        "mysql://root@127.0.0.1:9/dlock?session_timeout=2s"
    );
    // a directory has no host, and no proxy can stand in a kernel lock's way
    let file = ServiceUrl::parse("file:///tmp/locks").expect("a directory");
    assert!(file.hosts.is_empty());
    assert_eq!(file.rest, "/tmp/locks");
    assert!(file.fencing());
    let why = dlock_torture::targets::proxy_not_applicable(&file).expect("no proxy");
    assert!(why.contains("no connection to cut"), "{why}");
}
