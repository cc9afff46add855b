//! `torture soak` for 20 s against a real Redis (the harness's, on a free port): the report
//! has its samples of the process and the server, the log lines of the server's log file,
//! the traffic's figures and a verdict, and the exit code matches the verdict.

use std::process::Command;
use std::time::{Duration, Instant};

use dlock_tests::servers::{RedisServer, ServerControl};

#[test]
fn a_short_soak_on_redis_samples_and_judges() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("soak.md");
    let log = redis.process().log_path().to_path_buf();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args([
            "soak",
            &redis.url(),
            "--duration",
            "20s",
            "--sample",
            "2s",
            "--report",
        ])
        .arg(&report)
        .arg("--server-log")
        .arg(&log)
        .output()
        .expect("run torture soak");
    let took = started.elapsed();
    eprintln!("soak of 20 s took {took:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(60),
        "{took:?}\n{stdout}\n{stderr}"
    );
    let code = out.status.code();
    assert!(matches!(code, Some(0 | 1)), "{code:?}: {stderr}");
    let text = std::fs::read_to_string(&report).expect("the report");
    let verdict_pass = text.contains("## Verdict: PASS");
    assert!(verdict_pass || text.contains("## Verdict: FAIL"), "{text}");
    assert_eq!(code == Some(0), verdict_pass, "exit code and verdict agree");
    // 0, 2, …, 20 s: 11 samples, each a row of the samples table and a line on stdout
    let sample_lines = stdout
        .lines()
        .filter(|l| l.starts_with("sample t="))
        .count();
    assert!(
        (10..=12).contains(&sample_lines),
        "{sample_lines} samples\n{stdout}"
    );
    for metric in [
        "rss_mb",
        "fds",
        "threads",
        "tasks",
        "redis.keys",
        "redis.dbsize",
        "redis.clients",
        "log_lines[",
    ] {
        assert!(
            text.contains(&format!("| {metric}")),
            "no {metric} in\n{text}"
        );
    }
    // the traffic ran: acquisitions, cancelled waits and dropped guards all happened
    let traffic = text
        .lines()
        .skip_while(|l| !l.starts_with("| cycles"))
        .nth(2)
        .expect("the traffic row");
    let figures: Vec<f64> = traffic
        .split('|')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    eprintln!("traffic: {traffic}");
    let [cycles, _per_s, acquired, _released, dropped, cancelled, ..] = figures[..] else {
        panic!("traffic row {traffic}");
    };
    assert!(cycles > 200.0 && acquired > 100.0, "{traffic}");
    assert!(dropped > 0.0 && cancelled > 0.0, "{traffic}");
    // on a loaded machine a starved holder may find its lease gone (`NotHeld`): a few are
    // allowed, a stream of errors is not
    let errors: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Other errors: "))
        .map_or(0.0, |list| {
            list.trim_end_matches('.')
                .split(", ")
                .filter_map(|kind| kind.rsplit(": ").next()?.parse::<f64>().ok())
                .sum()
        });
    eprintln!("other errors: {errors}");
    assert!(
        errors <= cycles / 20.0,
        "{errors} errors in {cycles} cycles\n{text}"
    );
    // dlock's keys were on the server while the soak ran
    let keys_row = text
        .lines()
        .find(|l| l.starts_with("| redis.keys "))
        .expect("redis.keys row");
    let last: f64 = keys_row.split('|').nth(3).unwrap().trim().parse().unwrap();
    assert!(last > 0.0, "{keys_row}");
}
