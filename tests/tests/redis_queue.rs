//! Waiting across processes on Redis: waiters queue on the server, a release
//! wakes only the first of them, in arrival order; a dead waiter's ticket and
//! turn lapse; a foreign `DEL` and a client that does not queue live beside
//! the queue. Each "process" is a backend of its own (its own connections,
//! subscriber and local queue), or a real child process where one must die.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock::LockError;
use dlock_tests::fixtures::redis::{
    self, lock_key, queue_backend as backend, queue_lock as lock, RedisFixture,
};
use dlock_tests::foreign::py_lock_loop;
use dlock_tests::holder::{check_marks, Holder, HolderSpec};
use dlock_tests::servers::redis::RedisOptions;

/// Waiters of the tests, each in its own "process".
const WAITERS: usize = 5;

/// How many tickets wait in `key`'s queue.
fn queued(fixture: &RedisFixture, key: &str) -> usize {
    redis::queued(&|args| fixture.redis_cli(args), key)
}

/// Waits (bounded) until `key`'s queue holds `n` tickets.
async fn until_queued(fixture: &RedisFixture, key: &str, n: usize) {
    redis::until_queued(&|args| fixture.redis_cli(args), key, n).await;
}

/// Waiters in five processes, queued one after another behind a holder,
/// are served in their order of arrival, and each is woken once: between
/// joining the queue and its turn it sends nothing but its heartbeat (one
/// try per 300 ms), then one try that takes the key and one release.
/// Before the queue every release woke every waiting process. The queue is
/// strict here (`foreign_share=0`: no gap left for clients that do not
/// queue, which would cost the head one more try).
async fn served_in_arrival_order(fixture: RedisFixture, what: &str) {
    let url = format!("{}?recheck_ms=0&foreign_share=0", fixture.url());
    let key = "queue-order";
    let holder = lock(key, backend(&url).await).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    let mut backends = Vec::new();
    for i in 0..WAITERS {
        let backend = backend(&url).await;
        backends.push(backend.clone());
        let lock = lock(key, backend);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            order.lock().unwrap().push(i);
            let served = Instant::now();
            tokio::time::sleep(Duration::from_millis(30)).await;
            guard.release().await?;
            Ok::<_, LockError>(served)
        }));
        until_queued(&fixture, key, i + 1).await;
    }
    let queued_at: Vec<u64> = backends.iter().map(|b| b.metrics().round_trips).collect();
    let released = Instant::now();
    holder.release().await.unwrap();
    let mut served = Vec::new();
    for waiter in waiters {
        let at = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("every waiter is served within 20 s")
            .unwrap()
            .unwrap();
        served.push(at.duration_since(released));
    }
    assert_eq!(
        *order.lock().unwrap(),
        (0..WAITERS).collect::<Vec<_>>(),
        "{what}: served in arrival order"
    );
    for (i, backend) in backends.iter().enumerate() {
        let sent = backend.metrics().round_trips - queued_at[i];
        // Its heartbeats while it waited: the first may come at once.
        let beats = served[i].as_millis() / 300 + 1;
        assert!(
            sent <= 2 + beats as u64,
            "{what}: waiter {i} sent {sent} requests in the {:?} after the release: one try that takes its turn, one release and {beats} heartbeats at most expected, no retry on the {i} releases before its turn",
            served[i]
        );
    }
    assert_eq!(queued(&fixture, key), 0, "{what}: the queue is empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_up_per_release_in_arrival_order() {
    served_in_arrival_order(RedisFixture::single(), "one server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_wake_up_per_release_in_arrival_order_on_a_cluster() {
    served_in_arrival_order(RedisFixture::cluster(), "cluster").await;
}

/// Waiters that die in the line do not stall it: 15 waiters in processes
/// of their own queue behind a holder, then a live one behind them; 10 are
/// killed with SIGKILL and 5 stopped with SIGSTOP just before the release,
/// when their tickets are freshest. The live waiter holds the key within
/// 2 s of the release (a dead ticket lives a second after its last
/// heartbeat; before heartbeats each dead ticket was handed a 1 s turn in
/// order: 15 s here). The stopped ones, resumed, queue again behind it and
/// are not granted while it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_stopped_waiters_do_not_stall_the_line() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let fixture = RedisFixture::single();
    let key = "queue-dead";
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let spec = HolderSpec::once(
        fixture.url(),
        key,
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let mut doomed = Vec::new();
    for i in 0..15 {
        doomed.push(Holder::spawn(env!("CARGO_BIN_EXE_lock-holder"), &spec));
        until_queued(&fixture, key, i + 1).await;
    }
    let next = lock(key, backend(fixture.url()).await);
    let next = tokio::spawn(async move { next.acquire().await });
    until_queued(&fixture, key, 16).await;
    for dead in &mut doomed[..10] {
        dead.kill9().await;
    }
    let signal = |holder: &Holder, signal: Signal| {
        let pid = holder.pid().expect("the holder runs") as i32;
        kill(Pid::from_raw(pid), signal).expect("signal the holder");
    };
    for stopped in &doomed[10..] {
        signal(stopped, Signal::SIGSTOP);
    }
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the waiter behind 10 dead and 5 stopped ones gets the key within 20 s")
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    eprintln!("behind 10 killed and 5 stopped waiters: held {took:?} after the release");
    assert!(
        took < Duration::from_secs(2),
        "the live waiter waited {took:?} after the release: dead tickets stalled the line"
    );
    for stopped in &doomed[10..] {
        signal(stopped, Signal::SIGCONT);
    }
    // Resumed, they queue again (their tickets had lapsed) and wait.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        guard.is_held(),
        "a resumed waiter did not take the held key"
    );
    assert_eq!(
        fixture.redis_cli(&["GET", &lock_key(key)]),
        guard.token(),
        "the key is still the live waiter's"
    );
    guard.release().await.unwrap();
    for waiter in &mut doomed {
        waiter.kill9().await;
    }
}

/// Clients that do not queue are not starved by dlock's queue: 2 redis-py
/// `Lock` loops (redis-py's default blocking acquire, a `SET NX PX` every
/// 0.1 s) beside 3 dlock processes taking the same key in turns, each
/// critical section 50 ms, for 10 s. redis-py gets at least 10 % of the
/// critical sections (before: 0 of 147, the turn was written into the key),
/// and no two holders of either kind ever overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_gets_its_share_beside_queued_waiters() {
    let fixture = RedisFixture::single();
    let key = "queue-shared";
    let port: u16 = fixture
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the fixture's URL ends with its port");
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    let hold = Duration::from_millis(50);
    let spec = HolderSpec {
        url: fixture.url().to_owned(),
        key: key.to_owned(),
        ttl: Duration::from_secs(10),
        hold,
        cycles: 100_000,
        marks: Some(marks.clone()),
    };
    let mut dlocks: Vec<Holder> = (0..3)
        .map(|_| Holder::spawn(env!("CARGO_BIN_EXE_lock-holder"), &spec))
        .collect();
    let period = Duration::from_secs(10);
    let name = lock_key(key);
    let (a, b) = tokio::join!(
        py_lock_loop(&name, port, hold, period, &marks),
        py_lock_loop(&name, port, hold, period, &marks),
    );
    for dlock in &mut dlocks {
        dlock.kill9().await;
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    check_marks(&text);
    let by_dlock = text
        .lines()
        .filter(|l| l.starts_with("start ") && !l.ends_with(" py"))
        .count();
    let by_py = a + b;
    let total = by_py + by_dlock;
    eprintln!(
        "redis-py {by_py} ({a} + {b}) and dlock {by_dlock} critical sections in {period:?}: redis-py {:.1} %",
        100.0 * by_py as f64 / total.max(1) as f64
    );
    assert!(by_dlock > 0, "dlock's processes got the key");
    assert!(
        by_py * 10 >= total,
        "redis-py got {by_py} of {total} critical sections beside queued dlock waiters: starved"
    );
}

/// A waiter whose wait runs out leaves the queue at once, and a turn it
/// was given passes to the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let key = "queue-give-up";
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let impatient = lock(key, backend(fixture.url()).await).wait(Duration::from_millis(300));
    let impatient = tokio::spawn(async move { impatient.acquire().await });
    until_queued(&fixture, key, 1).await;
    let patient = lock(key, backend(fixture.url()).await);
    let patient = tokio::spawn(async move { patient.acquire().await });
    until_queued(&fixture, key, 2).await;
    assert!(matches!(
        impatient.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    until_queued(&fixture, key, 1).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), patient)
        .await
        .expect("the remaining waiter is served")
        .unwrap()
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_millis(900),
        "the turn went to the waiter that is still there, not to the one that left ({:?})",
        released.elapsed()
    );
    guard.release().await.unwrap();
}

/// A wait that runs out returns once its ticket is out of the queue, so a
/// `try_acquire` right after the holder's release (here, by the same
/// backend, as a caller that falls back to a try does) finds the free key
/// free. Before, the ticket's leave was sent after the return, and a try in
/// that window was refused: the free key was kept for the waiter that had
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_has_left_the_queue_when_it_returns() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let waiting = backend(fixture.url()).await;
    let holding = backend(fixture.url()).await;
    for round in 0..10 {
        let key = format!("queue-left-on-timeout-{round}");
        let holder = lock(&key, holding.clone()).acquire().await.unwrap();
        let waiter = lock(&key, waiting.clone()).wait(Duration::from_millis(300));
        assert!(matches!(
            waiter.acquire().await,
            Err(LockError::Timeout { .. })
        ));
        holder.release().await.unwrap();
        let taken = lock(&key, waiting.clone()).try_acquire().await.unwrap();
        let taken = taken.unwrap_or_else(|| panic!("round {round}: the free key was refused"));
        taken.release().await.unwrap();
    }
}

/// A waiter whose future is kept but not polled (a `select!` loop busy with
/// other work, a future stored for later) does not hold the line: its turn,
/// left untaken, passes to the waiter behind it within about a second
/// (grace 600 ms, then the next heartbeat), and it queues again, behind,
/// when it is polled again. Each waiter is a process of its own (within
/// one process the local line is tokio's: a future that is not polled
/// keeps its place there, as with `tokio::sync::Mutex`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_kept_but_not_polled_does_not_hold_the_line() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let key = "queue-kept";
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let kept_lock = lock(key, backend(fixture.url()).await);
    let mut kept = Box::pin(async move { kept_lock.acquire().await });
    // Polled long enough to queue, then kept without being polled.
    assert!(
        tokio::time::timeout(Duration::from_millis(400), &mut kept)
            .await
            .is_err(),
        "the key is held"
    );
    until_queued(&fixture, key, 1).await;
    let next = lock(key, backend(fixture.url()).await);
    let next = tokio::spawn(async move {
        let guard = next.acquire().await;
        (Instant::now(), guard)
    });
    until_queued(&fixture, key, 2).await;
    // The queue is visible to an operator: two processes wait.
    let info = lock(key, backend(fixture.url()).await)
        .inspect()
        .await
        .unwrap()
        .expect("held");
    let waiting = info.waiting.expect("the queue is shown");
    assert_eq!(waiting.processes, 2);
    assert!(waiting.oldest >= Duration::from_millis(300), "{waiting:?}");
    let released = Instant::now();
    holder.release().await.unwrap();
    let (served_at, guard) = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the waiter behind the kept one is served")
        .unwrap();
    let guard = guard.unwrap();
    let after = served_at - released;
    eprintln!("served {after:?} after the release, past a kept waiter not polled");
    assert!(
        after < Duration::from_secs(4),
        "the kept waiter held the line for {after:?}"
    );
    // Polled again, the kept waiter queues again and is served next.
    let polled_again = tokio::spawn(kept);
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await.unwrap();
    let kept_guard = tokio::time::timeout(Duration::from_secs(5), polled_again)
        .await
        .expect("the kept waiter, polled again, is served")
        .unwrap()
        .unwrap();
    kept_guard.release().await.unwrap();
}

/// What the queue reads from the server is bounded, whatever it says: a
/// ticket forged into the queue (any client that may write the prefix can
/// `ZADD` one, with a far-future life) does not block a free key, and a
/// hand-off record whose time lies ahead (what a step back of the server's
/// clock leaves) does not hold the head back longer than the gap's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_tickets_and_a_clock_step_do_not_block_the_queue() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0");
    let key = "queue-forged";
    let name = lock_key(key);
    let queue = format!("{name}:queue");
    let waiters = format!("{name}:waiters");
    let far = (u64::MAX / 4).to_string();
    fixture.redis_cli(&["ZADD", &queue, "0", "forged"]);
    fixture.redis_cli(&["ZADD", &waiters, &far, "forged"]);
    let taken = lock(key, backend(fixture.url()).await)
        .try_acquire()
        .await
        .unwrap()
        .expect("a forged ticket does not hold a free key");
    taken.release().await.unwrap();
    assert_eq!(queued(&fixture, key), 0, "the forged ticket was dropped");

    // A foreign holder for 1.5 s; a waiter queues behind it; then the
    // hand-off record says the key was vacated for that waiter ten minutes
    // from now, with a gap to leave.
    fixture.redis_cli(&["SET", &name, "someone-else", "PX", "1500"]);
    let waiter = lock(key, backend(fixture.url()).await).wait(Duration::from_secs(10));
    let asked = Instant::now();
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    let ticket = fixture.redis_cli(&["ZRANGE", &queue, "0", "0"]);
    let ticket = ticket.trim();
    let ahead = fixture.redis_cli(&["TIME"]);
    let seconds: u64 = ahead.lines().next().unwrap().trim().parse().unwrap();
    let record = format!("{} 1000 1 {ticket}", (seconds + 600) * 1000);
    // A step back of the clock stretches the record's expiry too.
    fixture.redis_cli(&["SET", &format!("{name}:handoff"), &record, "PX", "600000"]);
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the head is served")
        .unwrap()
        .expect("the head takes the key after at most the gap's cap");
    eprintln!(
        "served {:?} after asking (the holder had 1.5 s)",
        asked.elapsed()
    );
    guard.release().await.unwrap();
}

/// A queue of dlock waiters alone hands the key on without a gap: the
/// share for clients that do not queue is paid as a probe once a second on
/// a key handed on for longer than a second, and for 30 s after one was
/// seen (taking a key handed to a waiter, or holding a key a waiter meets,
/// by its value). Measured by `bench --first-handoff` and `bench
/// --processes=3 --hold-ms=100` (the performance guide); here, that a
/// first hand-off records the run and leaves no gap, that a run older
/// than a second probes, and that a foreign client taking a handed-over
/// key, or found holding one, switches the share on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_for_other_clients_is_paid_only_when_one_is_seen() {
    let fixture = RedisFixture::single();
    let key = "queue-share";
    let name = lock_key(key);
    let share = format!("{name}:share");
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let next = lock(key, backend(fixture.url()).await);
    let next = tokio::spawn(async move { next.acquire().await });
    until_queued(&fixture, key, 1).await;
    holder.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    let record = fixture.redis_cli(&["GET", &share]);
    assert!(
        record.trim().starts_with("hot "),
        "the first hand-off starts the key's run: {record:?}"
    );
    let handoff = fixture.redis_cli(&["GET", &format!("{name}:handoff")]);
    assert_eq!(
        handoff.split_whitespace().nth(2),
        Some("0"),
        "the first hand-off of a key leaves no gap: {handoff:?}"
    );
    next.release().await.unwrap();
    // A client that does not queue takes the key handed to a waiter, in the
    // gap of a probe: the key's run began over a second ago (planted), and
    // held 300 ms, the gap is the cap (100 ms).
    fixture.redis_cli(&["SET", &share, "hot 1", "PX", "30000"]);
    // A connection of its own, opened ahead: the `SET NX` goes out at once.
    let port = fixture
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .expect("the fixture's URL ends with its port");
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let waiter = lock(key, backend(fixture.url()).await).wait(Duration::from_secs(10));
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release().await.unwrap();
    let took = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        raw.write_all(format!("SET {name} redis-py NX PX 200\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = [0u8; 64];
        let n = raw.read(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer[..n]).into_owned()
    };
    assert!(
        took.starts_with("+OK"),
        "the key is free in the probe's gap: {took}"
    );
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("served after the foreign holder")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        fixture.redis_cli(&["GET", &share]).trim(),
        "foreign",
        "a foreign holder of a handed-over key switches the share on"
    );
    // A holder whose value is not a dlock token, met by a queued waiter,
    // switches it on as well (redis-py's token: 32 hex digits, no `@`).
    fixture.redis_cli(&["DEL", &share]);
    assert_eq!(
        fixture.redis_cli(&[
            "SET",
            &name,
            "0123456789abcdef0123456789abcdef",
            "NX",
            "PX",
            "30000"
        ]),
        "OK"
    );
    let waiter = lock(key, backend(fixture.url()).await).wait(Duration::from_secs(10));
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    assert_eq!(
        fixture.redis_cli(&["GET", &share]).trim(),
        "foreign",
        "a holder that is not a dlock token, met by a waiter, switches the share on"
    );
    fixture.redis_cli(&["DEL", &name]);
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("served after the foreign holder")
        .unwrap()
        .unwrap();
    // A dlock holder met by a waiter does not.
    fixture.redis_cli(&["DEL", &share]);
    let waiter = lock(key, backend(fixture.url()).await).wait(Duration::from_secs(10));
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    assert_eq!(
        fixture.redis_cli(&["GET", &share]).trim(),
        "",
        "a dlock holder met by a waiter is no foreign client"
    );
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Beside the queue: an operator's `DEL` of the held key publishes nothing,
/// yet the queue's head gets the key (the waiters' heartbeat notices it);
/// and a client that does not queue (a plain `SET NX`) cannot take a held
/// key but can take a free one, and queued waiters then wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_del_and_a_client_that_does_not_queue() {
    let fixture = RedisFixture::single();
    let key = "queue-foreign";
    let name = lock_key(key);
    let _holder = lock(key, backend(fixture.url()).await)
        .acquire()
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..2 {
        let lock = lock(key, backend(fixture.url()).await);
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await?;
            order.lock().unwrap().push(i);
            Ok::<_, LockError>(guard)
        }));
        until_queued(&fixture, key, i + 1).await;
    }
    // The operator frees the key behind the holder's back.
    assert_eq!(fixture.redis_cli(&["DEL", &name]), "1");
    let first = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the head is served after a DEL")
        .unwrap()
        .unwrap();
    assert_eq!(*order.lock().unwrap(), vec![0], "the head first");
    // A plain SET NX finds the key held.
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        ""
    );
    first.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), waiters.remove(0))
        .await
        .expect("the second waiter is served")
        .unwrap()
        .unwrap();
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        "",
        "a client that does not queue cannot take a held key"
    );
    second.release().await.unwrap();
    // With nobody queued, the free key is the foreign client's; a dlock
    // waiter queues behind it and gets the key when it goes.
    assert_eq!(
        fixture.redis_cli(&["SET", &name, "foreign", "NX", "PX", "30000"]),
        "OK"
    );
    let waiter = lock(key, backend(fixture.url()).await);
    let waiter = tokio::spawn(async move { waiter.acquire().await });
    until_queued(&fixture, key, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the foreign holder still holds");
    assert_eq!(fixture.redis_cli(&["DEL", &name]), "1");
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter behind a foreign holder is served")
        .unwrap()
        .unwrap();
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// The `calls` of `command` in the server's `INFO commandstats`.
fn calls(fixture: &RedisFixture, command: &str) -> u64 {
    let stats = fixture.redis_cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A process that waits for a key again within a second of its last wait
/// is still subscribed to the key's channel: no `SUBSCRIBE`, and its first
/// try queues at once (one try to queue, one to take its turn, one
/// release: no plain try first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_again_soon_reuses_the_subscription_and_queues_at_once() {
    let fixture = RedisFixture::single_with(RedisOptions::new(), "?recheck_ms=0&foreign_share=0");
    let key = "queue-warm";
    let a = lock(key, backend(fixture.url()).await);
    let b_backend = backend(fixture.url()).await;
    let b = lock(key, b_backend.clone());
    for round in 0..2 {
        let held = a.acquire().await.unwrap();
        let subscribes = tokio::task::block_in_place(|| calls(&fixture, "subscribe"));
        let sent = b_backend.metrics().round_trips;
        let b = b.clone();
        let waiter = tokio::spawn(async move {
            let guard = b.acquire().await?;
            guard.release().await
        });
        until_queued(&fixture, key, 1).await;
        held.release().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is served")
            .unwrap()
            .unwrap();
        let subscribed = tokio::task::block_in_place(|| calls(&fixture, "subscribe")) - subscribes;
        let sent = b_backend.metrics().round_trips - sent;
        if round == 0 {
            // (Twice on a subscriber's first use: its connection subscribes
            // to what is waited on, then the waiter's own request comes.)
            assert!(subscribed >= 1, "the first wait subscribes");
            assert_eq!(sent, 4, "plain try, queued try, the turn's try, release");
        } else {
            assert_eq!(subscribed, 0, "a wait within the linger needs no SUBSCRIBE");
            assert_eq!(sent, 3, "queued try, the turn's try, release: no plain try");
        }
    }
}
