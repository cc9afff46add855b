//! The soak's verdict math on hand-made series: least-squares slopes, the last-half
//! window, each rule (RSS slope, flat fds and threads, bounded gauges, shown-only
//! counters), and the soak's command line.

use std::collections::BTreeMap;

use dlock_torture::soak::options::parse_soak;
use dlock_torture::soak::verdict::{
    judge, judge_all, median, passed, rule_for, slope, Rule, Sample,
};

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A sample every 30 s for an hour, each metric from `f(t in seconds)`.
fn hour(metrics: &[(&str, &dyn Fn(f64) -> f64)]) -> Vec<Sample> {
    (0..=120)
        .map(|i| {
            let t = f64::from(i) * 30.0;
            let values: BTreeMap<String, f64> =
                metrics.iter().map(|(n, f)| (n.to_string(), f(t))).collect();
            Sample { t, values }
        })
        .collect()
}

fn verdict_of<'a>(
    verdicts: &'a [dlock_torture::soak::verdict::MetricVerdict],
    metric: &str,
) -> &'a dlock_torture::soak::verdict::MetricVerdict {
    verdicts
        .iter()
        .find(|v| v.metric == metric)
        .unwrap_or_else(|| panic!("no verdict for {metric}"))
}

#[test]
fn slope_is_least_squares() {
    // y = 3x + 1 exactly, then with noise that cancels around the line
    let exact: Vec<(f64, f64)> = (0..10)
        .map(|x| (f64::from(x), 3.0 * f64::from(x) + 1.0))
        .collect();
    assert!((slope(&exact).unwrap() - 3.0).abs() < 1e-12);
    let noisy = [(0.0, 1.0), (1.0, 0.0), (2.0, 1.0), (3.0, 0.0)];
    assert!((slope(&noisy).unwrap() - (-0.2)).abs() < 1e-12);
    assert_eq!(slope(&[(1.0, 5.0), (1.0, 7.0)]), None, "one x: no slope");
    assert_eq!(slope(&[]), None);
    assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    assert_eq!(median(&[]), None);
}

#[test]
fn rules_by_metric_name() {
    assert_eq!(rule_for("rss_mb"), Rule::SlopeBelow(0.1));
    assert!(matches!(rule_for("fds"), Rule::Bounded { floor, .. } if floor == 4.0));
    assert!(matches!(rule_for("threads"), Rule::Bounded { floor, .. } if floor == 2.0));
    assert!(matches!(rule_for("redis.keys"), Rule::Bounded { .. }));
    assert!(matches!(
        rule_for("postgres.advisory_locks"),
        Rule::Bounded { .. }
    ));
    assert_eq!(rule_for("etcd.revision"), Rule::Info);
    assert_eq!(rule_for("mysql.aborted_clients_total"), Rule::Info);
    assert_eq!(rule_for("log_lines[etcd.log]"), Rule::Info);
}

#[test]
fn rss_is_judged_on_the_last_half_only() {
    // 20 MB of warm-up growth in the first half hour, then flat: passes
    let warm = |t: f64| {
        if t < 1800.0 {
            30.0 + 20.0 * t / 1800.0
        } else {
            50.0
        }
    };
    let verdicts = judge_all(&hour(&[("rss_mb", &warm)]));
    let rss = verdict_of(&verdicts, "rss_mb");
    assert_eq!(rss.passed, Some(true), "{rss:?}");
    assert_eq!(rss.points, 61, "samples from 1800 s to 3600 s");
    assert_eq!((rss.first, rss.last), (30.0, 50.0));
    // 0.2 MB/h all along: fails, and says by how much
    let leak = |t: f64| 50.0 + 0.2 * t / 3600.0;
    let verdicts = judge_all(&hour(&[("rss_mb", &leak)]));
    let rss = verdict_of(&verdicts, "rss_mb");
    assert_eq!(rss.passed, Some(false));
    assert!((rss.slope_per_hour.unwrap() - 0.2).abs() < 1e-9, "{rss:?}");
    assert!(rss.why.contains("0.200/h"), "{}", rss.why);
    assert!(!passed(&verdicts));
}

#[test]
fn gauges_may_move_but_not_grow() {
    // keys that swing between 190 and 230 with the traffic: bounded
    let swing = |t: f64| 210.0 + 20.0 * (t / 90.0).sin();
    // one leaked session a minute in the last half: 30 more over the judged half
    let leak = |t: f64| 20.0 + (t / 60.0).floor();
    // a revision that counts every write: shown, not judged
    let revision = |t: f64| 1000.0 + 250.0 * t;
    let verdicts = judge_all(&hour(&[
        ("redis.keys", &swing),
        ("postgres.sessions", &leak),
        ("etcd.revision", &revision),
    ]));
    assert_eq!(verdict_of(&verdicts, "redis.keys").passed, Some(true));
    let sessions = verdict_of(&verdicts, "postgres.sessions");
    assert_eq!(sessions.passed, Some(false), "{sessions:?}");
    assert!(sessions.why.contains("rose"), "{}", sessions.why);
    let revision = verdict_of(&verdicts, "etcd.revision");
    assert_eq!(revision.passed, None);
    assert!((revision.slope_per_hour.unwrap() - 900_000.0).abs() < 1e-3);
    assert!(!passed(&verdicts));
}

#[test]
fn flat_fds_pass_and_a_creeping_fd_fails() {
    let flat = |_: f64| 19.0;
    let creep = |t: f64| 19.0 + (t / 300.0).floor();
    let verdicts = judge_all(&hour(&[("fds", &flat), ("threads", &flat)]));
    assert!(passed(&verdicts), "{verdicts:?}");
    let verdicts = judge_all(&hour(&[("fds", &creep)]));
    assert_eq!(verdict_of(&verdicts, "fds").passed, Some(false));
}

#[test]
fn too_few_points_fail_rather_than_pass() {
    let v = judge(
        "fds",
        Rule::Bounded {
            floor: 4.0,
            rel: 0.0,
        },
        &[(0.0, 1.0), (10.0, 1.0), (20.0, 1.0)],
        10.0,
    )
    .expect("a series");
    assert_eq!(v.passed, Some(false));
    assert!(v.why.contains("fewer than"), "{}", v.why);
    assert!(judge("fds", Rule::Info, &[], 0.0).is_none());
    assert!(!passed(&[]), "nothing judged is no pass");
}

#[test]
fn soak_options_default_to_the_operators_run_and_name_bad_input() {
    let soak = parse_soak(&args(&["etcd://127.0.0.1:2379"])).unwrap();
    assert_eq!(soak.duration.as_secs(), 3600);
    assert_eq!(soak.sample.as_secs(), 30);
    let t = &soak.traffic;
    assert_eq!(
        (t.tasks, t.keys, t.cancel_one_in, t.drop_one_in),
        (16, 200, 10, 20)
    );
    assert_eq!((t.ttl.as_millis(), t.wait.as_millis()), (3000, 200));
    for (bad, says) in [
        (
            vec!["redis://h:1", "--duration", "soon"],
            "`--duration soon`",
        ),
        (vec!["redis://h:1", "--tasks", "0"], "`--tasks 0`"),
        (
            vec!["redis://h:1", "--duration", "10s", "--sample", "5s"],
            "at least 8 samples",
        ),
        (vec!["redis://h:1", "--frobnicate"], "`--frobnicate`"),
        (vec!["redis://h:1", "redis://h:2"], "a second URL"),
        (vec!["--duration", "1h"], "no URL"),
        (vec!["redis://h:1", "--sample"], "`--sample` needs a value"),
    ] {
        let e = parse_soak(&args(&bad)).expect_err(&format!("{bad:?}"));
        assert!(e.0.contains(says), "{bad:?}: {e}");
    }
}
