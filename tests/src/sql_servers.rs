//! What the tests of the SQL backends (MySQL on MariaDB, PostgreSQL) do
//! alike against their servers: a command-line client's session kept open
//! (the SQL code that shares the locks), and the fault cases whose steps
//! and bounds are the same on both (a frozen holder process, an operator
//! ending one session). Each case takes what differs —
//! the backend, how to find and end a session — and names
//! the `server` in its messages.

use std::future::Future;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{Lock, LockBackend, LockError, LockGuard};

use crate::holder::{Holder, HolderSpec};

fn lock(backend: &Arc<dyn LockBackend>, key: &str) -> Lock {
    Lock::new(key).with_backend(backend.clone())
}

/// A command-line SQL client (`mariadb`, `psql`) that runs a statement
/// and keeps its session (and the locks it took) open until its stdin
/// closes. Killed on drop.
pub struct SqlClientSession {
    child: Child,
    /// The client's name in messages.
    name: String,
}

impl SqlClientSession {
    /// Runs `client` with `args` and sends it `sql`.
    #[track_caller]
    pub fn run<I, S>(client: &Path, args: I, sql: &str) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let name = client.file_name().map_or_else(
            || client.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let child = Command::new(client)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let mut session = Self { child, name };
        session.send(sql);
        session
    }

    /// Sends the client one more statement.
    #[track_caller]
    pub fn send(&mut self, sql: &str) {
        use std::io::Write;
        let name = &self.name;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .unwrap_or_else(|| panic!("{name} stdin"));
        writeln!(stdin, "{sql}").unwrap_or_else(|e| panic!("write to {name}: {e}"));
        stdin
            .flush()
            .unwrap_or_else(|e| panic!("flush {name}: {e}"));
    }

    /// Ends the session (stdin closes, the client exits, the server frees
    /// its locks).
    pub fn quit(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for SqlClientSession {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A holder process (the `lock-holder` binary `holder_bin`) on `url`
/// frozen with SIGSTOP: the server ends its silent session after
/// `session_timeout=2s`, a client of `backend` is granted the key within
/// 3 s more, and the resumed holder finds its lease lost.
pub async fn a_frozen_holder_is_freed_by_the_server(
    holder_bin: &str,
    url: &str,
    backend: Arc<dyn LockBackend>,
) {
    let session_timeout = Duration::from_secs(2);
    let url = format!("{url}?session_timeout=2s");
    let mut holder = Holder::spawn(
        holder_bin,
        &HolderSpec::once(
            &url,
            "frozen",
            Duration::from_secs(2),
            Duration::from_secs(6),
        ),
    );
    holder.acquired(Duration::from_secs(20)).await;
    let pid = holder.pid().expect("holder runs");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();
    let guard = lock(&backend, "frozen")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the frozen holder's lock is freed by the server");
    let freed = frozen.elapsed();
    eprintln!("a frozen holder's lock was granted to another client {freed:?} after SIGSTOP (session_timeout {session_timeout:?})");
    assert!(
        freed <= session_timeout + Duration::from_secs(3),
        "{freed:?}"
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        !holder.exit_success(Duration::from_secs(20)).await,
        "the resumed holder's release must fail: its lease was lost"
    );
    guard.release().await.unwrap();
}

/// One session of `a` ended by an operator (`end(session)`, `how` in
/// messages: "killed", "terminated"): exactly the leases on it are lost,
/// within their ttl; the other session's lease lives on through renewals;
/// a client of `b` is granted the key with a greater fence. `session_of`
/// names the session holding a key (`a` has two: one lease each).
pub async fn an_ended_session_loses_exactly_its_leases<S: PartialEq + std::fmt::Debug>(
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
    session_of: impl Fn(&str) -> Option<S>,
    end: impl FnOnce(S),
    how: &str,
) {
    let ttl = Duration::from_secs(3);
    let victim = lock(&a, "victim").ttl(ttl).acquire().await.unwrap();
    let bystander = lock(&a, "bystander").ttl(ttl).acquire().await.unwrap();
    let (victim_id, bystander_id) = (session_of("victim"), session_of("bystander"));
    assert!(victim_id.is_some(), "the victim's session is listed");
    assert_ne!(victim_id, bystander_id, "two sessions, one lease each");
    let lost = victim.lost();
    let ended = Instant::now();
    end(victim_id.unwrap());
    tokio::time::timeout(ttl, lost)
        .await
        .expect("lost() fired within the ttl");
    eprintln!(
        "loss of a {how} session reported after {:?} (ttl {ttl:?})",
        ended.elapsed()
    );
    let next = lock(&b, "victim")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("another client is granted the key");
    assert!(next.fencing_token() > victim.fencing_token());
    tokio::time::sleep(ttl + ttl / 2).await;
    assert!(bystander.is_held(), "a lease of another session was lost");
    assert!(matches!(
        victim.release().await,
        Err(LockError::NotHeld { .. })
    ));
    next.release().await.unwrap();
    bystander.release().await.unwrap();
}

/// The backend `connect(url)` makes (e.g. `MysqlBackend::connect`);
/// panics naming the URL and the error.
pub async fn connected<'a, B, Fut>(
    url: &'a str,
    connect: impl FnOnce(&'a str) -> Fut,
) -> Arc<dyn LockBackend>
where
    B: LockBackend + 'static,
    Fut: Future<Output = Result<B, LockError>>,
{
    Arc::new(
        connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

/// `connect(url)`'s error, checked to come within `within`; panics if it
/// connects.
pub async fn refused_within<'a, B, Fut>(
    url: &'a str,
    within: Duration,
    connect: impl FnOnce(&'a str) -> Fut,
) -> LockError
where
    Fut: Future<Output = Result<B, LockError>>,
{
    let started = Instant::now();
    let err = match connect(url).await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => e,
    };
    let took = started.elapsed();
    assert!(took < within, "{url}: refused after {took:?}");
    err
}

/// A lock held with a waiter queued behind it, over `url` (e.g. TLS).
pub struct HeldWithWaiter {
    a: Arc<dyn LockBackend>,
    b: Arc<dyn LockBackend>,
    held: LockGuard,
    first: u64,
    waiter: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
}

impl HeldWithWaiter {
    /// `a` releases: the waiter is served, with a greater fence. Returns
    /// its guard, how long after the release it was served, and the two
    /// clients (kept open while the caller checks their connections).
    pub async fn release_and_serve(self) -> (LockGuard, Duration, [Arc<dyn LockBackend>; 2]) {
        let released = Instant::now();
        self.held.release().await.unwrap();
        let next = self.waiter.await.unwrap().expect("the waiter is served");
        let took = released.elapsed();
        assert!(next.fencing_token().unwrap() > self.first);
        (next, took, [self.a, self.b])
    }
}

/// Two clients of `url` (made by `connect`): `a` takes `key`, `b`'s try is
/// refused, and `b` starts waiting for it (up to `wait`).
pub async fn held_with_a_waiter<'a, B, Fut>(
    url: &'a str,
    connect: impl Fn(&'a str) -> Fut,
    key: &str,
    wait: Duration,
) -> HeldWithWaiter
where
    B: LockBackend + 'static,
    Fut: Future<Output = Result<B, LockError>>,
{
    let a = connected(url, &connect).await;
    let b = connected(url, &connect).await;
    let held = lock(&a, key).acquire().await.unwrap();
    let first = held.fencing_token().unwrap();
    assert!(lock(&b, key).try_acquire().await.unwrap().is_none());
    let waiter = tokio::spawn({
        let waiting = lock(&b, key).wait(wait);
        async move { waiting.acquire().await }
    });
    HeldWithWaiter {
        a,
        b,
        held,
        first,
        waiter,
    }
}

/// How a dlock waiter behind SQL code is served (see
/// [`a_sql_holder_is_waited_for`]).
pub struct SqlHolder {
    /// The SQL client in messages, e.g. "psql".
    pub who: &'static str,
    /// How long the waiter waits before the SQL session ends.
    pub pause: Duration,
    /// The bound on the grant after the session ends.
    pub within: Duration,
    /// What serves the waiter, in the printed figure.
    pub how: &'static str,
}

/// `key` held by SQL code (`session`): dlock's try is refused, `inspect`
/// shows a holder that is not dlock, and a dlock waiter (started
/// `holder.pause` before the session ends) is granted within
/// `holder.within` of its end.
pub async fn a_sql_holder_is_waited_for(
    backend: &Arc<dyn LockBackend>,
    key: &str,
    session: SqlClientSession,
    holder: &SqlHolder,
) {
    let SqlHolder {
        who,
        pause,
        within,
        how,
    } = *holder;
    let busy = lock(backend, key).try_acquire().await.unwrap();
    assert!(busy.is_none(), "granted while {who} holds the key");
    let info = lock(backend, key).inspect().await.unwrap();
    assert_eq!(
        info.map(|i| i.holder),
        Some(None),
        "held by a client that is not dlock"
    );
    let waiter = tokio::spawn({
        let waiting = lock(backend, key).wait(Duration::from_secs(20));
        async move { waiting.acquire().await }
    });
    tokio::time::sleep(pause).await;
    let quit_at = Instant::now();
    session.quit();
    let guard = waiter.await.unwrap();
    let after = quit_at.elapsed();
    let guard = guard.unwrap_or_else(|e| panic!("not granted once {who}'s session ended: {e}"));
    eprintln!("granted {after:?} after {who}'s session ended ({how})");
    assert!(after < within, "{after:?}");
    guard.release().await.unwrap();
}

/// A lease of `backend` on `key` (with `ttl`, else the default) held
/// through a fault of the server: `fault(server)` (a restart, a freeze),
/// then the lease is lost within `lost_within` (else `lost`, the
/// message); `mend(server)` (a resume, or nothing), then the key is taken
/// again (waiting up to 20 s, else `retaken`) with a greater fence.
/// Returns how long after the fault the loss was seen.
pub async fn a_lease_held_through<S>(
    server: &mut S,
    backend: &Arc<dyn LockBackend>,
    (key, ttl): (&str, Option<Duration>),
    (fault, lost_within, lost): (impl FnOnce(&mut S), Duration, &str),
    (mend, retaken): (impl FnOnce(&mut S), &str),
) -> Duration {
    let with_ttl = |l: Lock| match ttl {
        Some(ttl) => l.ttl(ttl),
        None => l,
    };
    let before = with_ttl(lock(backend, key)).acquire().await.unwrap();
    let fence = before.fencing_token().unwrap();
    let lost_now = before.lost();
    let faulted = Instant::now();
    tokio::task::block_in_place(|| fault(server));
    tokio::time::timeout(lost_within, lost_now)
        .await
        .expect(lost);
    let at = faulted.elapsed();
    tokio::task::block_in_place(|| mend(server));
    let next = with_ttl(lock(backend, key))
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect(retaken);
    assert!(next.fencing_token().unwrap() > fence);
    next.release().await.unwrap();
    at
}
