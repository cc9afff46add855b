//! The seeds' GETSET race as an executable lesson, on a real Redis.
//!
//! The classic lock from the old `SETNX` documentation stores an expiry
//! timestamp: take it with `SETNX key <now + ttl>`; if that fails and the
//! stored timestamp is in the past, take it over with `GETSET key <now +
//! ttl>` and hold it if the old value `GETSET` returned was still expired;
//! release with `DEL key`. Two clients that find the same expired lock both
//! run `GETSET`: one wins, the other's `GETSET` has overwritten the
//! winner's expiry anyway, and when the loser cleans up (a `finally { DEL }`)
//! it deletes a lock it does not own, so a third client takes it while the
//! winner still works. The holder whose lock expired while it was paused
//! never learns either.
//!
//! The first test runs that algorithm with the interleaving forced by
//! barriers (two threads, each command on its own `redis-cli` connection)
//! and shows the double holder and the foreign delete; the second runs the
//! same story against dlock and shows neither. The guarantees guide's
//! "Lessons" section tells it in prose.

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::backends::redis::RedisBackend;
use dlock::{Lock, LockError};
use dlock_tests::fixtures::redis::lock_key;
use dlock_tests::servers::redis::RedisServer;

/// The first holder's ttl: it "pauses" past it.
const SHORT_TTL: Duration = Duration::from_millis(200);
/// The ttl of the clients that take over: long enough that nothing expires
/// by itself while the test looks.
const LONG_TTL: Duration = Duration::from_secs(10);

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(since.as_millis()).unwrap()
}

/// One client of the naive algorithm; every command is a `redis-cli` call,
/// so each client talks over connections of its own.
struct NaiveClient<'a> {
    name: &'static str,
    server: &'a RedisServer,
    key: &'a str,
}

impl NaiveClient<'_> {
    fn setnx(&self, expiry_ms: u64) -> bool {
        self.server
            .redis_cli(&["SETNX", self.key, &expiry_ms.to_string()])
            == "1"
    }

    fn get(&self) -> Option<u64> {
        self.server.redis_cli(&["GET", self.key]).parse().ok()
    }

    fn getset(&self, expiry_ms: u64) -> Option<u64> {
        self.server
            .redis_cli(&["GETSET", self.key, &expiry_ms.to_string()])
            .parse()
            .ok()
    }

    fn del(&self) {
        self.server.redis_cli(&["DEL", self.key]);
    }
}

/// What one taking-over client saw and did.
#[derive(Debug, Default)]
struct TakeOver {
    /// The timestamp its `GET` read (the expired one, for both clients).
    saw: Option<u64>,
    /// It believes it holds the lock.
    won: bool,
    /// The expiry it wrote with `GETSET`.
    wrote: u64,
    /// The stored expiry right after its `GETSET`.
    stored_after_getset: Option<u64>,
}

#[test]
fn naive_setnx_getset_has_two_holders_and_a_foreign_delete() {
    let server = RedisServer::start();
    let key = "lesson:getset";
    let client = |name| NaiveClient {
        name,
        server: &server,
        key,
    };
    let (a, b, c, d) = (client("A"), client("B"), client("C"), client("D"));
    let mut holders: Vec<&str> = Vec::new();

    // A takes the lock, then stalls past its expiry (a GC pause, SIGSTOP).
    let a_expiry = now_ms() + SHORT_TTL.as_millis() as u64;
    assert!(a.setnx(a_expiry), "A takes the free lock");
    holders.push(a.name);
    std::thread::sleep(SHORT_TTL + Duration::from_millis(50));

    // B and C find the same expired lock; B runs GETSET first, then C.
    let both_saw_it = Barrier::new(2);
    let b_went = Barrier::new(2);
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|threads| {
        for (who, first) in [(&b, true), (&c, false)] {
            let (both_saw_it, b_went, outcomes) = (&both_saw_it, &b_went, &outcomes);
            threads.spawn(move || {
                let mut seen = TakeOver::default();
                let mine = now_ms() + LONG_TTL.as_millis() as u64;
                assert!(!who.setnx(mine), "{}: the key is still there", who.name);
                seen.saw = who.get();
                assert!(
                    seen.saw.is_some_and(|t| t < now_ms()),
                    "{} sees it expired",
                    who.name
                );
                both_saw_it.wait();
                if !first {
                    b_went.wait();
                }
                let old = who.getset(mine);
                seen.wrote = mine;
                seen.stored_after_getset = who.get();
                // The old value was still expired: nobody took it over first.
                seen.won = old.is_some_and(|t| t < now_ms());
                if first {
                    b_went.wait();
                }
                outcomes.lock().unwrap().push((who.name, seen));
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    let outcome = |name| &outcomes.iter().find(|(n, _)| *n == name).unwrap().1;
    let (b_seen, c_seen) = (outcome("B"), outcome("C"));
    println!("B: {b_seen:?}\nC: {c_seen:?}");
    assert_eq!(b_seen.saw, c_seen.saw, "both saw the same expired lock");
    assert!(b_seen.won && !c_seen.won, "B's GETSET won, C's lost");
    holders.push(b.name);
    assert_eq!(
        c_seen.stored_after_getset,
        Some(c_seen.wrote),
        "C's losing GETSET overwrote B's expiry ({}) with its own",
        b_seen.wrote
    );

    // C gives up; its cleanup (`finally { DEL }`) deletes B's lock.
    c.del();
    assert!(
        b.get().is_none(),
        "the foreign delete: B's lock is gone while B works"
    );
    // D finds the key free and takes it while B still believes it holds it.
    assert!(
        d.setnx(now_ms() + LONG_TTL.as_millis() as u64),
        "D takes the deleted lock"
    );
    holders.push(d.name);

    // A resumes: nothing told it that its lock expired; it writes too.
    println!("holders that believe they hold `{key}` at once: {holders:?}");
    assert_eq!(holders, ["A", "B", "D"], "three holders of one lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_under_the_same_interleaving_has_one_holder_and_no_foreign_delete() {
    let server = RedisServer::start();
    let key = "lesson:getset";
    // One backend per client: separate connections, as separate processes.
    let client = || async {
        let backend = RedisBackend::connect(&server.url()).await.unwrap();
        Arc::new(backend) as Arc<dyn dlock::LockBackend>
    };
    let (a, b, c, d) = (
        client().await,
        client().await,
        client().await,
        client().await,
    );
    let lock = |backend: &Arc<dyn dlock::LockBackend>, ttl| {
        Lock::new(key).ttl(ttl).with_backend(backend.clone())
    };

    // A takes the lock, then stalls past its lease (renewal off stands for
    // a process whose watchdog was stopped with it).
    let a_guard = lock(&a, SHORT_TTL).renew(false).acquire().await.unwrap();
    std::thread::sleep(SHORT_TTL + Duration::from_millis(50));

    // B and C find the expired lock at the same moment. Taking it is one
    // atomic script (`SET NX PX` + the fence counter): there is no read
    // between the check and the write for the other to slip into.
    let (b_lock, c_lock) = (lock(&b, LONG_TTL), lock(&c, LONG_TTL));
    let (b_got, c_got) = tokio::join!(b_lock.try_acquire(), c_lock.try_acquire());
    let (b_got, c_got) = (b_got.unwrap(), c_got.unwrap());
    assert!(
        b_got.is_some() != c_got.is_some(),
        "exactly one of B and C holds the lock"
    );
    let winner = if b_got.is_some() { b_got } else { c_got };
    let winner = winner.unwrap();
    let held = || async { lock(&d, LONG_TTL).inspect().await.unwrap().expect("held") };
    let info = held().await;
    assert_eq!(info.fencing_token, winner.fencing_token());
    assert!(
        winner.fencing_token() > a_guard.fencing_token(),
        "the new holder's fence is larger"
    );
    // The loser wrote nothing: the winner's expiry is its own.
    assert!(
        info.remaining > LONG_TTL / 2,
        "the winner's ttl is intact: {:?}",
        info.remaining
    );

    // The loser has no guard, so it has nothing to release; and A, the
    // stale holder, cannot release what is no longer its own: the release
    // is compare-and-delete on A's token.
    assert!(
        matches!(a_guard.ensure(), Err(LockError::Lost { .. })),
        "A is told before it writes"
    );
    let stale_release = a_guard.release().await;
    assert!(
        matches!(stale_release, Err(LockError::NotHeld { .. })),
        "{stale_release:?}"
    );
    assert_eq!(
        held().await.fencing_token,
        winner.fencing_token(),
        "no foreign delete: the winner still holds the key"
    );
    assert_eq!(
        server.redis_cli(&["EXISTS", &lock_key(key)]),
        "1",
        "the key is still on the server"
    );
    // D finds the key held: one holder at a time.
    assert!(lock(&d, LONG_TTL).try_acquire().await.unwrap().is_none());
    winner.release().await.unwrap();
    assert!(lock(&d, LONG_TTL).try_acquire().await.unwrap().is_some());
}
