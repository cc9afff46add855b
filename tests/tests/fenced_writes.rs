//! Fenced writes (issue 54): a holder paused past its lease wakes and
//! writes with its old fencing token after a later holder wrote with a
//! higher one; each store refuses the stale write, through the helpers and
//! recipes of `dlock::fence`:
//! - `FenceKeeper`, in process;
//! - `REDIS_FENCED_SET`, the Lua script, run by `redis-cli EVAL` on a real
//!   Redis;
//! - `SQL_FENCED_UPDATE`, prepared and executed by `psql` on a real
//!   PostgreSQL.
//!
//! The tokens are real: two leases on one key of a Redis backend, the first
//! taken without renewal (a holder that stopped renewing: paused) and left
//! to expire before the second is granted (`dlock_tests::paused_holder`).
//! The helpers for a table or keys of the caller's (`FencedUpdate`,
//! `redis_fenced_set`) are tested in `fenced_write_helpers.rs`.

use dlock::fence::{FenceKeeper, REDIS_FENCED_SET, SQL_FENCED_UPDATE};
use dlock_tests::paused_holder::stale_and_current;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_keeper_refuses_the_paused_holder() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let keeper = FenceKeeper::new();
    let mut status = "new";
    keeper
        .write("order:42", current, || {
            status = "paid by the current holder"
        })
        .unwrap();
    let refused = keeper
        .write("order:42", stale, || status = "paid twice")
        .unwrap_err();
    assert_eq!((refused.token, refused.highest), (stale, current));
    assert_eq!(status, "paid by the current holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_script_refuses_the_paused_holder() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let set = |token: u64, value: &str| {
        redis.redis_cli(&[
            "EVAL",
            REDIS_FENCED_SET,
            "2",
            "{order:42}:status",
            "{order:42}:fence",
            &token.to_string(),
            value,
        ])
    };
    assert_eq!(
        set(current, "paid").trim(),
        "1",
        "the current holder's write"
    );
    assert_eq!(
        set(current, "paid").trim(),
        "1",
        "the same lease writes again"
    );
    assert_eq!(
        set(stale, "paid twice").trim(),
        "0",
        "the paused holder's write"
    );
    assert_eq!(
        redis.redis_cli(&["GET", "{order:42}:status"]).trim(),
        "paid"
    );
    assert_eq!(
        redis.redis_cli(&["GET", "{order:42}:fence"]).trim(),
        current.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_update_refuses_the_paused_holder() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let pg = PgServer::start();
    pg.psql(
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, status TEXT NOT NULL, \
         fence BIGINT NOT NULL DEFAULT 0); INSERT INTO orders (id, status) VALUES (42, 'new');",
    );
    // The recipe as written, prepared with its `$1` and `$2`; the count of
    // rows it changed read through a `RETURNING` around it (psql runs quiet).
    let update = |token: u64| {
        pg.psql(&format!(
            "PREPARE fenced(BIGINT, BIGINT) AS WITH changed AS ({SQL_FENCED_UPDATE} RETURNING 1) \
             SELECT count(*) FROM changed; EXECUTE fenced({token}, 42);"
        ))
    };
    assert_eq!(update(current), "1", "the current holder's write");
    assert_eq!(update(current), "1", "the same lease writes again");
    assert_eq!(update(stale), "0", "the paused holder's write");
    let row = pg.psql("SELECT status, fence FROM orders WHERE id = 42");
    assert!(
        row.contains("paid") && row.contains(&current.to_string()),
        "{row}"
    );
}
