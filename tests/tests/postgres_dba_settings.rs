//! The PostgreSQL backend under a DBA's role defaults that would cut its
//! sessions (`ALTER ROLE … SET statement_timeout = '1s'`,
//! `idle_session_timeout = '2s'`, `idle_in_transaction_session_timeout =
//! '1s'`): dlock sets its own on every session, so a long wait is granted,
//! an idle backend works again at once, and a session the server ends is
//! still heard as lost.

use std::time::{Duration, Instant};

use dlock::Lock;
use dlock_tests::servers::PgServer;

/// The role whose defaults a DBA set.
const ROLE: &str = "dlock_limited";

fn limited_url(server: &PgServer) -> String {
    format!("postgres://{ROLE}@127.0.0.1:{}/postgres", server.port())
}

fn start_with_limited_role() -> PgServer {
    let server = PgServer::start();
    server.psql(&format!(
        "CREATE ROLE {ROLE} LOGIN SUPERUSER; \
         ALTER ROLE {ROLE} SET statement_timeout = '1s'; \
         ALTER ROLE {ROLE} SET idle_session_timeout = '2s'; \
         ALTER ROLE {ROLE} SET idle_in_transaction_session_timeout = '1s'"
    ));
    // The defaults bite an ordinary session of the role.
    let mut args = server.psql_args();
    args[5] = ROLE.to_owned();
    let shown = std::process::Command::new(server.psql_path())
        .args(&args)
        .args(["-c", "SHOW statement_timeout"])
        .output()
        .expect("run psql");
    assert_eq!(String::from_utf8_lossy(&shown.stdout).trim(), "1s");
    server
}

/// A 20 s wait behind a holder is granted; the holder, idle meanwhile,
/// keeps its lock; a backend idle 4 s works again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_timeouts_cut_neither_waits_nor_idle_sessions() {
    let server = start_with_limited_role();
    let url = limited_url(&server);
    let holder = dlock::connect(&url).await.unwrap();
    let waiter = dlock::connect(&url).await.unwrap();
    let idle = dlock::connect(&url).await.unwrap();
    let held = Lock::new("dba")
        .with_backend(holder.clone())
        .acquire()
        .await
        .unwrap();
    let hold = Duration::from_secs(20);
    let release = tokio::spawn(async move {
        tokio::time::sleep(hold).await;
        let was_held = held.is_held();
        held.release().await.map(|()| was_held)
    });
    let idle_check = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        let asked = Instant::now();
        let guard = Lock::new("dba-idle").with_backend(idle).try_acquire().await;
        (asked.elapsed(), guard.map(|g| g.is_some()))
    });
    let asked = Instant::now();
    let granted = Lock::new("dba")
        .wait(Duration::from_secs(40))
        .with_backend(waiter.clone())
        .acquire()
        .await;
    let waited = asked.elapsed();
    let (idle_took, idle_granted) = idle_check.await.unwrap();
    eprintln!(
        "role defaults statement_timeout=1s, idle_session_timeout=2s, idle_in_transaction_session_timeout=1s: \
         a wait behind a {hold:?} holder granted after {waited:?}; a backend idle 4 s took a lock in {idle_took:?}"
    );
    let granted = granted.expect("the wait is granted, not cut by statement_timeout");
    assert!(
        waited >= hold - Duration::from_secs(1),
        "granted after {waited:?} while held"
    );
    assert!(
        waited < hold + Duration::from_secs(10),
        "granted only after {waited:?}"
    );
    assert!(
        release.await.unwrap().unwrap(),
        "the idle holder kept its lock"
    );
    assert!(idle_granted.unwrap(), "the idle backend works again");
    assert!(
        idle_took < Duration::from_secs(2),
        "the idle backend took {idle_took:?}"
    );
    granted.release().await.unwrap();
}

/// A holder whose session the server ends hears `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_is_heard_as_lost_under_role_timeouts() {
    let server = start_with_limited_role();
    let holder = dlock::connect(&limited_url(&server)).await.unwrap();
    let held = Lock::new("dba-lost")
        .with_backend(holder)
        .acquire()
        .await
        .unwrap();
    let lost = held.lost();
    // Idle past the role's idle_session_timeout first: still held.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        held.is_held(),
        "lost while idle 3 s (the role's 2 s idle_session_timeout)"
    );
    let terminated = tokio::task::block_in_place(|| {
        server.psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE usename = '{ROLE}' AND pid <> pg_backend_pid()"
        ))
    });
    let ended = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), lost)
        .await
        .expect("lost() within 10 s of pg_terminate_backend");
    eprintln!(
        "pg_terminate_backend of {terminated} session(s): the holder heard lost() after {:?}",
        ended.elapsed()
    );
    assert!(!held.is_held());
}
