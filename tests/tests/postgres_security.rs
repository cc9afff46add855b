//! The PostgreSQL backend against roles that share its database (issue
//! 42): code another role planted never runs as dlock's role, namespaces
//! that cannot meet, bounded rows, and values PostgreSQL cannot store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::postgres::{advisory_key_in, PostgresBackend};
use dlock::{Election, Lock, LockBackend, LockError, RwLock, Semaphore};
use dlock_tests::acquisitions::acquire_and_release;
use dlock_tests::fixtures::postgres::PgFixture;

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    Arc::new(
        PostgresBackend::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}")),
    )
}

/// What `mallory` plants: a function for each array type dlock's
/// statements unnest (better matches than `pg_catalog.unnest(anyarray)`,
/// so they win wherever `public` is searched), each writing who ran it.
const PLANTED: &str = "SET ROLE mallory; \
    CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE sql AS \
      $$ INSERT INTO public.planted_log VALUES (current_user, 'unnest(bigint[])'); SELECT pg_catalog.unnest($1) $$; \
    CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS \
      $$ INSERT INTO public.planted_log VALUES (current_user, 'unnest(text[])'); SELECT pg_catalog.unnest($1) $$; \
    CREATE FUNCTION public.unnest(double precision[]) RETURNS SETOF double precision LANGUAGE sql AS \
      $$ INSERT INTO public.planted_log VALUES (current_user, 'unnest(float8[])'); SELECT pg_catalog.unnest($1) $$; \
    CREATE FUNCTION public.log_write() RETURNS trigger LANGUAGE plpgsql AS \
      $$ BEGIN INSERT INTO public.planted_log VALUES (current_user, TG_TABLE_NAME); RETURN NEW; END $$";

/// A table of dlock's name, made first by `mallory` in `schema`, with a
/// trigger that writes who wrote the table.
fn pre_created(schema: &str, table: &str, columns: &str) -> String {
    format!(
        "SET ROLE mallory; CREATE TABLE {schema}.{table} ({columns}); \
         CREATE TRIGGER spy BEFORE INSERT OR UPDATE ON {schema}.{table} \
         FOR EACH ROW EXECUTE FUNCTION public.log_write()"
    )
}

/// Issue 42, case 1: functions and tables another role planted in the
/// schemas dlock's role reaches never run as dlock's role; a table of
/// dlock's name that another role owns is refused, naming its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_functions_and_tables_never_run_as_dlocks_role() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    let port = server.port();
    server.psql(
        "CREATE ROLE mallory LOGIN; CREATE ROLE carol LOGIN; \
         GRANT CREATE ON SCHEMA public TO mallory, carol; \
         CREATE TABLE public.planted_log (who text, what text); \
         GRANT INSERT ON public.planted_log TO PUBLIC; \
         CREATE SCHEMA shared; GRANT CREATE, USAGE ON SCHEMA shared TO mallory, carol; \
         CREATE SCHEMA carol_s AUTHORIZATION carol",
    );
    server.psql(PLANTED);
    // The plant works: with the default `search_path`, carol's unqualified
    // `unnest` is mallory's.
    server.psql("SET ROLE carol; SELECT count(*) FROM unnest(ARRAY[1::bigint])");
    let log = || {
        server.psql("SELECT count(*) || ':' || coalesce(string_agg(DISTINCT who || '/' || what, ','), '') FROM public.planted_log")
    };
    assert_eq!(log(), "1:carol/unnest(bigint[])", "the plant must work");
    server.psql("TRUNCATE public.planted_log");

    // Before dlock made its tables: mallory's are refused, owner named.
    server.psql(&pre_created(
        "public",
        "dlock_fences",
        "name text PRIMARY KEY, counter bigint NOT NULL",
    ));
    server.psql(&pre_created(
        "public",
        "dlock_holders",
        "name text PRIMARY KEY, lock_id bigint NOT NULL, fence bigint NOT NULL, holder text, expires timestamptz",
    ));
    let err = PostgresBackend::connect(&format!("postgres://carol@127.0.0.1:{port}/postgres"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(
        text.contains("\"public\".dlock_fences")
            && text.contains("`mallory`")
            && text.contains("OWNER TO carol"),
        "{text}"
    );
    // In a schema both may create in: carol's tables are made (and
    // mallory may put no trigger on them), mallory's leaders' table is
    // refused when the first election needs it.
    server.psql(&pre_created(
        "shared",
        "dlock_leaders",
        "name text PRIMARY KEY, holder text NOT NULL, pid int4 NOT NULL, term bigint NOT NULL, value text NOT NULL",
    ));
    let shared = connect(&format!(
        "postgres://carol@127.0.0.1:{port}/postgres?schema=shared"
    ))
    .await;
    let spy = server.try_psql(
        "SET ROLE mallory; CREATE TRIGGER spy BEFORE INSERT ON shared.dlock_fences \
         FOR EACH ROW EXECUTE FUNCTION public.log_write()",
    );
    assert!(spy.is_err(), "mallory put a trigger on carol's table");
    let err = Election::new("shared-election")
        .with_backend(shared.clone())
        .campaign("node-a")
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(
        text.contains("\"shared\".dlock_leaders") && text.contains("`mallory`"),
        "{text}"
    );

    // carol's own schema: every kind of lease, renewed several times.
    let backend = connect(&format!(
        "postgres://carol@127.0.0.1:{port}/postgres?schema=carol_s"
    ))
    .await;
    let ttl = Duration::from_secs(3);
    let plain = Lock::new("job")
        .ttl(ttl)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let write = RwLock::new("prices")
        .ttl(ttl)
        .with_backend(backend.clone())
        .write()
        .await
        .unwrap();
    let read = RwLock::new("rates")
        .ttl(ttl)
        .with_backend(backend.clone())
        .read()
        .await
        .unwrap();
    let permit = Semaphore::new("pool", 2)
        .ttl(ttl)
        .with_backend(backend.clone())
        .acquire()
        .await
        .unwrap();
    let election = Election::new("scheduler").with_backend(backend.clone());
    let leadership = election.campaign("node-a").await.unwrap();
    assert_eq!(election.leader().await.unwrap().unwrap().value, "node-a");
    // Renewed every second or so: at least three rounds.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(plain.is_held() && write.is_held() && read.is_held() && permit.is_held());
    assert!(leadership.is_leader());
    leadership.resign().await.unwrap();
    permit.release().await.unwrap();
    read.release().await.unwrap();
    write.release().await.unwrap();
    plain.release().await.unwrap();
    assert_eq!(log(), "0:", "planted code ran as dlock's role");
}

/// Issue 42, case 3: a prefix with `:` is refused, so `?prefix=a` key
/// `b:c` and `?prefix=a:b` key `c` can no longer be one lock; a valid
/// prefix keeps its advisory keys (SQL interop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_a_colon_is_refused() {
    let fixture = PgFixture::start();
    let port = fixture.server().port();
    let base = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    for prefix in ["a:b", "a%3Ab", ":"] {
        let err = PostgresBackend::connect(&format!("{base}?prefix={prefix}"))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
        assert!(
            text.contains("contains `:`") && text.contains("prefix="),
            "{text}"
        );
    }
    let a = connect(&format!("{base}?prefix=a")).await;
    let guard = Lock::new("b:c").with_backend(a).acquire().await.unwrap();
    let id = advisory_key_in("a", "b:c");
    assert_eq!(
        fixture
            .server()
            .psql(&format!("SELECT pg_try_advisory_lock({id})")),
        "f",
        "SQL computes the same advisory key"
    );
    guard.release().await.unwrap();
}

/// Issue 42, case 5: keys idle past `?fence_retention=` leave no rows,
/// a key held all along keeps its row and lease, and a forgotten key's
/// next fence is still larger than any before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keys_leave_no_rows() {
    let fixture = PgFixture::start();
    let server = fixture.server();
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?fence_retention=1s",
        server.port()
    );
    let backend = connect(&url).await;
    let lock = |key: &str| Lock::new(key).with_backend(backend.clone());
    let kept = lock("kept")
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let mut last = Vec::new();
    let started = Instant::now();
    for i in 0..200 {
        let guard = lock(&format!("r/{i}")).acquire().await.unwrap();
        last.push(guard.fencing_token().unwrap());
        guard.release().await.unwrap();
    }
    println!("200 locks taken and released in {:?}", started.elapsed());
    let rows = || {
        server.psql(
            "SELECT (SELECT count(*) FROM public.dlock_fences WHERE name LIKE 'dlock:r/%') || '/' || \
             (SELECT count(*) FROM public.dlock_holders WHERE name LIKE 'dlock:r/%') || '/' || \
             (SELECT count(*) FROM public.dlock_holders WHERE name = 'dlock:kept')",
        )
    };
    // Releases send the sweep (at most once a second): release a key
    // each round until every idle row is gone, bounded.
    let released = Instant::now();
    let deadline = released + Duration::from_secs(30);
    loop {
        let now = rows();
        if now.starts_with("0/0/") {
            break;
        }
        assert!(Instant::now() < deadline, "rows left: {now}");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        acquire_and_release(&lock("tick")).await;
    }
    println!(
        "every idle row gone {:?} after the last release (retention 1 s)",
        released.elapsed()
    );
    assert_eq!(rows(), "0/0/1", "the held key keeps its holder row");
    assert!(kept.is_held());
    let info = backend.inspect("kept").await.unwrap();
    assert!(info.and_then(|i| i.holder).is_some(), "kept is held");
    for i in [0, 199] {
        let again = lock(&format!("r/{i}")).acquire().await.unwrap();
        assert!(
            again.fencing_token().unwrap() > last[i],
            "r/{i}: {:?} after {}",
            again.fencing_token(),
            last[i]
        );
        again.release().await.unwrap();
    }
    kept.release().await.unwrap();
}

/// Issue 42, case 9: a leader value with NUL, which PostgreSQL's `text`
/// cannot store, is `InvalidOption`, not the server's error, and the
/// published value stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_in_a_leader_value_is_invalid_option() {
    let fixture = PgFixture::start();
    let backend = connect(fixture.url()).await;
    let election = Election::new("nul").with_backend(backend.clone());
    let err = election.campaign("a\0b").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert!(err.to_string().contains("NUL"), "{err}");
    let leadership = election.campaign("node-a").await.unwrap();
    let err = leadership.proclaim("node\0b").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOption { .. }), "{err:?}");
    assert_eq!(election.leader().await.unwrap().unwrap().value, "node-a");
    leadership.resign().await.unwrap();
}
