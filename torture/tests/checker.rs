//! The checker on hand-made histories: overlaps split by outcome, fence regressions, and
//! `lost()` in time, late, or excused by a pause or a restart.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_torture::checker::{check, Figures, History, Holding};
use dlock_torture::events::{Acquisition, EndHow, HoldKind};
use dlock_torture::faults::FaultKind;
use dlock_torture::nemesis::Injected;
use dlock_torture::report::failures;
use dlock_torture::schedule::PlannedFault;
use dlock_torture::store::{WriteOutcome, WriteRecord};

const MS: u64 = 1_000_000;

fn holding(worker: usize, fence: u64, start: u64, returned: u64) -> Holding {
    Holding {
        worker,
        incarnation: 0,
        acquired: Acquisition {
            n: 1,
            kind: HoldKind::Lock,
            key: "k".into(),
            fence: Some(fence),
            start: start * MS,
            returned: returned * MS,
        },
        lost: None,
        end: None,
    }
}

fn fault(kind: FaultKind, worker: Option<usize>, from: u64, to: u64) -> Injected {
    Injected {
        planned: PlannedFault {
            at: Duration::ZERO,
            kind,
            target: worker.unwrap_or(0),
            length: Duration::from_millis(to - from),
        },
        on: String::new(),
        worker,
        start_ns: from * MS,
        end_ns: to * MS,
        forgets_locks: kind == FaultKind::RestartServer,
        failed_over: None,
        outcome: Ok(()),
    }
}

fn run(holdings: &[Holding], records: &[WriteRecord], faults: &[Injected]) -> Figures {
    check(&History {
        holdings,
        errors: BTreeMap::new(),
        records,
        faults,
        tolerance_ns: 100 * MS,
    })
}

fn record(id: u64, worker: &str, outcome: WriteOutcome, overlaps: Vec<u64>) -> WriteRecord {
    WriteRecord {
        id,
        key: "k".into(),
        worker: worker.into(),
        fence: Some(id),
        limit: 1,
        begin_ns: id,
        end_ns: id + 1,
        outcome,
        overlaps,
    }
}

#[test]
fn overlaps_are_split_by_what_the_store_did() {
    let records = [
        record(1, "a", WriteOutcome::RejectedAtCommit, vec![]),
        record(2, "b", WriteOutcome::Accepted, vec![1]), // fenced: a was refused
        record(3, "c", WriteOutcome::Accepted, vec![]),
        record(4, "d", WriteOutcome::Accepted, vec![3]), // both written: unsafe
        record(5, "e", WriteOutcome::Abandoned, vec![]),
        record(6, "f", WriteOutcome::Accepted, vec![5]), // e died before writing
    ];
    let f = run(&[], &records, &[]);
    assert_eq!(
        (f.overlaps_fenced, f.overlaps_unsafe, f.overlaps_other),
        (1, 1, 1)
    );
    assert_eq!(f.writes_accepted, 4);
    assert_eq!(
        failures(&f, true).len(),
        1,
        "unsafe on a fencing backend fails"
    );
    assert!(
        failures(&f, false).is_empty(),
        "Redlock: reported, not failed"
    );
}

#[test]
fn a_fence_not_above_an_earlier_grant_is_a_regression() {
    let mut a = holding(0, 100, 0, 10);
    a.end = Some((EndHow::Released, 20 * MS, 20 * MS));
    let mut b = holding(1, 100, 30, 40); // asked after a was granted, same fence
    b.end = Some((EndHow::Released, 50 * MS, 50 * MS));
    let mut c = holding(2, 99, 5, 60); // asked before a returned: no order known
    c.end = Some((EndHow::Released, 70 * MS, 70 * MS));
    let f = run(&[a, b, c], &[], &[]);
    assert_eq!(f.fence_regressions, 1);
}

#[test]
fn lost_is_late_when_another_holder_came_first_and_nothing_excuses_it() {
    // h holds fence 1 from t=10 ms; g gets the key with fence 2 at t=1000 ms.
    let mut h = holding(0, 1, 0, 10);
    let mut g = holding(1, 2, 500, 1000);
    g.end = Some((EndHow::Released, 1100 * MS, 1100 * MS));

    // lost() 50 ms after the takeover: within the 100 ms tolerance
    h.lost = Some(1050 * MS);
    h.end = Some((EndHow::NotHeld, 1060 * MS, 1060 * MS));
    let f = run(&[h.clone(), g.clone()], &[], &[]);
    assert_eq!((f.lost_in_time, f.lost_late), (1, 0));

    // 300 ms after: late, and the run fails
    h.lost = Some(1300 * MS);
    h.end = Some((EndHow::NotHeld, 1310 * MS, 1310 * MS));
    let f = run(&[h.clone(), g.clone()], &[], &[]);
    assert_eq!((f.lost_in_time, f.lost_late), (0, 1));
    assert_eq!(
        failures(&f, false).len(),
        1,
        "late lost() fails on every backend"
    );

    // never noticed, released "fine" after the takeover: late too
    h.lost = None;
    h.end = Some((EndHow::Released, 1400 * MS, 1400 * MS));
    let f = run(&[h.clone(), g.clone()], &[], &[]);
    assert_eq!(f.lost_late, 1);

    // release() called before the takeover and answered after it (the next holder was
    // woken by the release itself): the worker had let go, nothing is late
    h.lost = None;
    h.end = Some((EndHow::Released, 990 * MS, 1400 * MS));
    let f = run(&[h.clone(), g.clone()], &[], &[]);
    assert_eq!((f.lost_late, f.lost_in_time), (0, 0));

    // the worker was stopped meanwhile: excused
    h.end = Some((EndHow::Released, 1400 * MS, 1400 * MS));
    h.lost = Some(1300 * MS);
    let paused = fault(FaultKind::PauseWorkerLong, Some(0), 200, 1250);
    let f = run(&[h.clone(), g.clone()], &[], &[paused]);
    assert_eq!((f.lost_late, f.lost_while_paused), (0, 1));

    // a pause of another worker excuses nothing
    let other = fault(FaultKind::PauseWorkerLong, Some(1), 200, 1250);
    assert_eq!(run(&[h.clone(), g.clone()], &[], &[other]).lost_late, 1);

    // a restart without persistence meanwhile: expected, counted apart
    let restart = fault(FaultKind::RestartServer, None, 600, 700);
    let f = run(&[h.clone(), g.clone()], &[], &[restart]);
    assert_eq!((f.lost_late, f.lost_after_restart), (0, 1));

    // the same rule for any fault that made the server forget locks: a PostgreSQL session
    // the server ended (terminate-backend, a reset connection); a reset that forgot
    // nothing (Redis) excuses nothing
    let mut ended = fault(FaultKind::TerminateBackend, Some(0), 600, 700);
    ended.forgets_locks = true;
    let f = run(&[h.clone(), g.clone()], &[], &[ended]);
    assert_eq!((f.lost_late, f.lost_after_restart), (0, 1));
    let reset = fault(FaultKind::Reset, Some(0), 600, 700);
    assert_eq!(run(&[h.clone(), g.clone()], &[], &[reset]).lost_late, 1);

    // a holder with a lower fence proves nothing (it is the stale one)
    let mut stale = g.clone();
    stale.acquired.fence = Some(0);
    let f = run(&[h, stale], &[], &[]);
    assert_eq!((f.lost_late, f.lost_in_time), (0, 1));
}

#[test]
fn latency_and_the_longest_free_wait() {
    let mut a = holding(0, 1, 0, 10);
    a.end = Some((EndHow::Released, 100 * MS, 100 * MS));
    let mut b = holding(1, 2, 50, 130); // waited from 50, got it 30 ms after the release
    b.end = Some((EndHow::Released, 200 * MS, 200 * MS));
    let f = run(&[a, b], &[], &[]);
    assert_eq!(f.longest_free_wait, Some((30 * MS, "k".to_string())));
    assert_eq!(f.acquire_latency.map(|l| l.2), Some(80 * MS));
    assert_eq!(f.critical_sections, 2);
}
