//! dlock's `CountDownLatch` with `?layout=redisson` against Redisson's own
//! `RCountDownLatch` scripts, both ways, on a real Redis server.
//!
//! No JVM here: the Java side is what Redisson sends on the wire, replayed
//! with the `redis` crate. The scripts below are Redisson's
//! (`RedissonCountDownLatch.trySetCountAsync` and `countDownAsync`, current
//! on its master branch), sent as Redisson sends them: `EVAL` with
//! `KEYS = [<name>, redisson_countdownlatch__channel__{<name>}]` and
//! `ARGV = [message, (count,) publish command]`, the messages being
//! `CountDownLatchPubSub.NEW_COUNT_MESSAGE` (1) and `ZERO_COUNT_MESSAGE`
//! (0) in `LongCodec` (decimal text). `getCount` is a `GET` read as a long,
//! nil as 0; `await` subscribes to the channel and reads the count again on
//! each message until it is 0.

use std::time::{Duration, Instant};

use dlock::CountDownLatch;
use dlock_tests::fixtures::redisson::RedissonFixture;
use futures_util::StreamExt;

/// Redisson's `trySetCountAsync` script, verbatim.
const REDISSON_TRY_SET_COUNT: &str = "if redis.call('exists', KEYS[1]) == 0 then \
     redis.call('set', KEYS[1], ARGV[2]); \
     redis.call(ARGV[3], KEYS[2], ARGV[1]); \
     return 1 \
     else \
     return 0 \
     end";

/// Redisson's `countDownAsync` script, verbatim.
const REDISSON_COUNT_DOWN: &str = "local v = redis.call('decr', KEYS[1]);\
     if v <= 0 then redis.call('del', KEYS[1]) end;\
     if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end;";

fn channel(name: &str) -> String {
    format!("redisson_countdownlatch__channel__{{{name}}}")
}

/// The Java side: Redisson's calls on its own connection.
struct Redisson {
    conn: redis::aio::MultiplexedConnection,
}

impl Redisson {
    async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("the plain URL");
        Redisson {
            conn: client
                .get_multiplexed_async_connection()
                .await
                .expect("Redis answers"),
        }
    }

    async fn try_set_count(&mut self, name: &str, count: u64) -> bool {
        let set: Option<i64> = redis::cmd("EVAL")
            .arg(REDISSON_TRY_SET_COUNT)
            .arg(2)
            .arg(name)
            .arg(channel(name))
            .arg(1)
            .arg(count)
            .arg("publish")
            .query_async(&mut self.conn)
            .await
            .expect("Redisson's trySetCount");
        set == Some(1)
    }

    async fn count_down(&mut self, name: &str) {
        let _: Option<i64> = redis::cmd("EVAL")
            .arg(REDISSON_COUNT_DOWN)
            .arg(2)
            .arg(name)
            .arg(channel(name))
            .arg(0)
            .arg("publish")
            .query_async(&mut self.conn)
            .await
            .expect("Redisson's countDown");
    }

    /// `getCount`: `GET` as a long, nil as 0.
    async fn count(&mut self, name: &str) -> i64 {
        let value: Option<i64> = redis::cmd("GET")
            .arg(name)
            .query_async(&mut self.conn)
            .await
            .expect("GET");
        value.unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_counts_down_and_dlocks_waiter_returns() {
    let fixture = RedissonFixture::single();
    let backend = dlock::connect(fixture.url()).await.unwrap();
    let mut java = Redisson::connect(fixture.plain_url()).await;
    let name = "interop:shards-ready";

    assert!(java.try_set_count(name, 3).await);
    let latch = CountDownLatch::new(name)
        .with_backend(backend.clone())
        .wait(Duration::from_secs(30));
    assert_eq!(
        latch.count().await.unwrap(),
        3,
        "dlock reads Redisson's count"
    );
    assert!(
        !latch.try_set_count(5).await.unwrap(),
        "Redisson's live count is not replaced"
    );
    let waiting = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait_zero().await.map(|()| Instant::now()) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    java.count_down(name).await;
    java.count_down(name).await;
    assert_eq!(latch.count().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "dlock's waiter returned before zero"
    );
    let last = Instant::now();
    java.count_down(name).await;
    let woke = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("dlock's waiter heard Redisson's 0")
        .unwrap()
        .unwrap();
    eprintln!(
        "interop: Redisson's last countDown -> dlock's wait_zero returned in {:?}",
        woke.saturating_duration_since(last)
    );
    assert_eq!(latch.count().await.unwrap(), 0);
    // A dlock count_down past Redisson's zero leaves no negative count.
    latch.count_down().await.unwrap();
    assert_eq!(java.count(name).await, 0);
    assert!(latch.try_set_count(2).await.unwrap(), "set again at zero");
    assert!(
        !java.try_set_count(name, 9).await,
        "Redisson sees dlock's count"
    );
    assert_eq!(java.count(name).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_counts_down_and_a_redisson_subscriber_hears_zero() {
    let fixture = RedissonFixture::single();
    let backend = dlock::connect(fixture.url()).await.unwrap();
    let mut java = Redisson::connect(fixture.plain_url()).await;
    let name = "interop:batch-7";

    // Redisson's await: subscribe to the latch's channel first.
    let client = redis::Client::open(fixture.plain_url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe(channel(name)).await.unwrap();
    let mut messages = pubsub.into_on_message();

    let latch = CountDownLatch::new(name).with_backend(backend);
    assert!(latch.try_set_count(2).await.unwrap());
    let heard = |m: Option<redis::Msg>| -> String {
        m.expect("a message").get_payload::<String>().unwrap()
    };
    let first = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("Redisson's subscriber hears the new count");
    assert_eq!(heard(first), "1", "NEW_COUNT_MESSAGE");
    assert_eq!(
        java.count(name).await,
        2,
        "Redisson's getCount reads dlock's count"
    );
    assert!(
        !java.try_set_count(name, 4).await,
        "Redisson sees a live count"
    );

    latch.count_down().await.unwrap();
    assert_eq!(java.count(name).await, 1);
    let last = Instant::now();
    latch.count_down().await.unwrap();
    let zero = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("Redisson's subscriber hears zero");
    let took = last.elapsed();
    assert_eq!(heard(zero), "0", "ZERO_COUNT_MESSAGE");
    eprintln!("interop: dlock's last count_down -> Redisson's subscriber heard 0 in {took:?}");
    assert_eq!(java.count(name).await, 0, "getCount after zero");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(name)
        .query_async(&mut java.conn)
        .await
        .unwrap();
    assert_eq!(
        exists, 0,
        "the key goes at zero, as Redisson's countDown deletes it"
    );
    assert!(
        java.try_set_count(name, 1).await,
        "Redisson may set it again"
    );
    // And dlock's count_down wakes Redisson's waiter for that count too.
    latch.count_down().await.unwrap();
    let zero = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .expect("the 1 of Redisson's set, then dlock's 0");
    let payload = heard(zero);
    let payload = if payload == "1" {
        heard(
            tokio::time::timeout(Duration::from_secs(5), messages.next())
                .await
                .expect("zero"),
        )
    } else {
        payload
    };
    assert_eq!(payload, "0");
}
