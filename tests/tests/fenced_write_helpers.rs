//! Fenced writes to a table or keys of the caller's (issue 66): the
//! statements `dlock::fence::FencedUpdate` builds, run with bound
//! parameters on a real PostgreSQL and a real MariaDB, and
//! `dlock::fence::redis_fenced_set` on a real Redis and a Redis Cluster. In each, the holder
//! after a paused one writes, then the paused holder wakes and writes with
//! its old token: refused (0 rows, `false`), and the current holder's
//! values stand.
//!
//! The tables have names that need quoting (a space, a quote, mixed case,
//! a schema) and two columns to set; the fence column is nullable, so a
//! row no fenced write has touched yet is taken by the first one.

use dlock::fence::{redis_fenced_set, FenceError, FencedUpdate, SqlDialect};
use dlock_tests::paused_holder::stale_and_current;
use dlock_tests::servers::mariadb::MariaDbServer;
use dlock_tests::servers::postgres::PgServer;
use dlock_tests::servers::redis::{RedisCluster, RedisServer};
use mysql_async::prelude::Queryable;

/// The fenced write of both SQL tests: `Status` and `paid by` of the row
/// `Order ID` of `Order "Book"` in the schema `Shop`, fenced by `Fence`.
fn order_book() -> FencedUpdate {
    FencedUpdate::new("Order \"Book\"", "Order ID")
        .schema("Shop")
        .set("Status")
        .set("paid by")
        .fence_column("Fence")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_the_paused_holders_update_and_upsert() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let (stale, current) = (stale as i64, current as i64);
    let pg = PgServer::start();
    pg.psql(
        r#"CREATE SCHEMA "Shop"; CREATE TABLE "Shop"."Order ""Book""" ("Order ID" BIGINT PRIMARY KEY, "Status" TEXT, "paid by" TEXT, "Fence" BIGINT);
           INSERT INTO "Shop"."Order ""Book""" ("Order ID", "Status") VALUES (43, 'new');"#,
    );
    let (db, connection) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .expect("a direct connection");
    tokio::spawn(connection);
    let update = order_book().postgres().unwrap();
    let upsert = order_book().upsert_sql(SqlDialect::Postgres).unwrap();
    let write = |sql: &str, id: i64, token: i64, status: &str, by: &str| {
        let (db, sql) = (&db, sql.to_owned());
        let (status, by) = (status.to_owned(), by.to_owned());
        async move {
            db.execute(&sql, &[&status, &by, &id, &token])
                .await
                .unwrap()
        }
    };

    // No row 42 yet: the update finds nothing; the upsert inserts it.
    assert_eq!(write(&update, 42, current, "paid", "B").await, 0);
    assert_eq!(write(&upsert, 42, current, "paid", "B").await, 1, "insert");
    assert_eq!(
        write(&update, 42, current, "shipped", "B").await,
        1,
        "the same lease writes again"
    );
    // The paused holder wakes and writes.
    assert_eq!(write(&update, 42, stale, "paid twice", "A").await, 0);
    assert_eq!(write(&upsert, 42, stale, "paid twice", "A").await, 0);
    let row = db
        .query_one(
            r#"SELECT "Status", "paid by", "Fence" FROM "Shop"."Order ""Book""" WHERE "Order ID" = 42"#,
            &[],
        )
        .await
        .unwrap();
    let row: (String, String, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(row, ("shipped".into(), "B".into(), current));

    // A row no fenced write touched (fence NULL) is taken by the first one,
    // whatever its token.
    assert_eq!(write(&update, 43, stale, "paid", "A").await, 1);
    assert_eq!(write(&upsert, 43, current, "paid", "B").await, 1);
    assert_eq!(write(&upsert, 43, stale, "paid twice", "A").await, 0);
}

/// The fenced writes of [`order_book`] on one MariaDB connection, each
/// answering the rows the server counted.
struct MariaDbBook {
    conn: mysql_async::Conn,
    fenced: FencedUpdate,
}

impl MariaDbBook {
    async fn update(&mut self, id: i64, token: u64, status: &str, by: &str) -> u64 {
        let sql = self.fenced.mysql().unwrap();
        let args = self
            .fenced
            .arguments(
                SqlDialect::MySql,
                [status.into(), by.into()],
                mysql_async::Value::from(id),
                mysql_async::Value::from(token),
            )
            .unwrap();
        self.run(&sql, args).await
    }

    /// The upsert binds the set values, the key and the token, in order.
    async fn upsert(&mut self, id: i64, token: u64, status: &str, by: &str) -> u64 {
        let sql = self.fenced.upsert_sql(SqlDialect::MySql).unwrap();
        let args = vec![status.into(), by.into(), id.into(), token.into()];
        self.run(&sql, args).await
    }

    async fn run(&mut self, sql: &str, args: Vec<mysql_async::Value>) -> u64 {
        self.conn.exec_drop(sql, args).await.unwrap();
        self.conn.affected_rows()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refuses_the_paused_holders_update_and_upsert() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let db = MariaDbServer::start();
    db.sql(
        "CREATE DATABASE `Shop`; CREATE TABLE `Shop`.`Order \"Book\"` (`Order ID` BIGINT PRIMARY KEY, `Status` TEXT, `paid by` TEXT, `Fence` BIGINT NULL);
         INSERT INTO `Shop`.`Order \"Book\"` (`Order ID`, `Status`) VALUES (43, 'new');",
    );
    // `client_found_rows` stays off (the default), as the upsert asks.
    let opts = mysql_async::Opts::from_url(&db.url()).expect("the harness URL");
    let mut book = MariaDbBook {
        conn: mysql_async::Conn::new(opts).await.expect("a connection"),
        fenced: order_book(),
    };
    // No row 42 yet: the update finds nothing.
    assert_eq!(book.update(42, current, "paid", "B").await, 0);
    assert_eq!(book.upsert(42, current, "paid", "B").await, 1, "insert");
    assert_eq!(
        book.upsert(42, current, "shipped", "B").await,
        2,
        "an update counts 2"
    );
    // The paused holder wakes and writes.
    assert_eq!(book.upsert(42, stale, "paid twice", "A").await, 0);
    assert_eq!(book.update(42, current, "delivered", "B").await, 1);
    assert_eq!(book.update(42, stale, "paid twice", "A").await, 0);
    // The first fenced write takes a row whose fence is NULL.
    assert_eq!(book.upsert(43, stale, "paid", "A").await, 2);
    assert_eq!(book.update(43, current, "paid", "B").await, 1);
    assert_eq!(book.update(43, stale, "paid twice", "A").await, 0);

    let rows = db.sql(
        "SELECT `Order ID`, `Status`, `paid by`, `Fence` FROM `Shop`.`Order \"Book\"` ORDER BY 1",
    );
    assert_eq!(
        rows,
        format!("42\tdelivered\tB\t{current}\n43\tpaid\tB\t{current}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fenced_set_refuses_the_paused_holder() {
    let redis = RedisServer::start();
    let (stale, current) = stale_and_current(&redis.url(), "order:42").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (value_key, fence_key) = ("{Order \"Book\" 42}:status", "{Order \"Book\" 42}:fence");
    let mut set = async |token: u64, value: &str| {
        redis_fenced_set(&mut conn, value_key, fence_key, value, token)
            .await
            .unwrap()
    };
    assert!(set(current, "paid").await, "the current holder's write");
    assert!(set(current, "shipped").await, "the same lease writes again");
    assert!(!set(stale, "paid twice").await, "the paused holder's write");
    assert_eq!(redis.redis_cli(&["GET", value_key]).trim(), "shipped");
    assert_eq!(
        redis.redis_cli(&["GET", fence_key]).trim(),
        current.to_string()
    );

    // Keys a Cluster would keep apart are refused before anything is sent.
    let err = redis_fenced_set(
        &mut conn,
        "order:7:status",
        "order:7:fence",
        "paid",
        current,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, FenceError::KeysInDifferentSlots { value_key, .. } if value_key == "order:7:status"),
        "{err}"
    );
    assert_eq!(redis.redis_cli(&["EXISTS", "order:7:status"]).trim(), "0");
}

/// On a Redis Cluster, through the `redis` crate's cluster connection: the
/// hash-tagged keys meet on one node, and the paused holder is refused there
/// as on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fenced_set_runs_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let (stale, current) = stale_and_current(&cluster.url(), "order:42").await;
    let client = redis::cluster::ClusterClient::new(cluster.node_urls()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let (value_key, fence_key) = ("{order:42}:status", "{order:42}:fence");
    let mut set = async |token: u64, value: &str| {
        redis_fenced_set(&mut conn, value_key, fence_key, value, token)
            .await
            .unwrap()
    };
    assert!(set(current, "paid").await, "the current holder's write");
    assert!(!set(stale, "paid twice").await, "the paused holder's write");
    let value: String = redis::cmd("GET")
        .arg(value_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(value, "paid");
}
