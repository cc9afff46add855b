//! Redis: dlock against the loop people write by hand (`SET NX PX` + a
//! compare-and-delete script, polling every 10 ms while waiting), on the same
//! server in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::LockBackend;
use redis::aio::MultiplexedConnection;

use super::observed::{self, Observability, Setting};
use super::stats::{print_table, Row, Summary};
use super::workloads::{
    alternating, check_counter, critical_increment, distinct_dlock, handoff_dlock, hot_key_dlock,
    uncontended_dlock, BoxError, Sizes, TTL,
};

/// The workload sizes of this suite.
const SIZES: Sizes = Sizes {
    uncontended_cycles: 2_000,
    distinct_tasks: 64,
    distinct_cycles: 500,
    hot_tasks: 16,
    hot_increments: 500,
    handoffs: 200,
};
const POLL: Duration = Duration::from_millis(10);
/// (b) with observability on against off: rounds per setting, and cycles
/// per task in each round (64 tasks).
/// Many short rounds rather than a few long ones: a neighbour's burst on a
/// shared machine then lands on both settings more evenly.
const OBSERVED_ROUNDS: usize = 16;
const OBSERVED_CYCLES: usize = 125;

/// Runs the four workloads against `url` and prints the table, then (b)
/// with observability on against off. `detail` adds (b) with only the
/// recorder and with only the subscriber on, to tell their costs apart.
pub async fn run(url: &str, detail: bool) -> Result<(), Box<dyn std::error::Error>> {
    run_inner(url, detail)
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)
}

async fn run_inner(url: &str, detail: bool) -> Result<(), BoxError> {
    // Installed first and switched off: the recorder and subscriber are
    // global for the process and cannot be removed, so every row but the
    // observed ones runs with both off.
    let obs = Observability::install()?;
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let hand = HandWritten::connect(url).await?;
    let run_id = std::process::id();
    println!("Redis benchmark against {}", dlock::url::redact(url));

    let (key, hand_key) = (
        format!("bench:{run_id}:a"),
        format!("bench:{run_id}:a-hand"),
    );
    let (backend_ref, hand_ref) = (&backend, &hand);
    let (ours_a, base_a) = alternating(
        &SIZES,
        |n| Box::pin(uncontended_dlock(n, backend_ref, &key)),
        |n| Box::pin(uncontended_hand(hand_ref, n, &hand_key, Protocol::Minimal)),
    )
    .await?;
    let same_key = format!("bench:{{{run_id}:a-same}}");
    let (ours_a2, same_protocol_a) = alternating(
        &SIZES,
        |n| Box::pin(uncontended_dlock(n, backend_ref, &key)),
        |n| Box::pin(uncontended_hand(hand_ref, n, &same_key, Protocol::Dlock)),
    )
    .await?;

    let before = hand.server_micros().await?;
    let ours_b = distinct_dlock(&SIZES, &backend, &run_id.to_string()).await?;
    let between = hand.server_micros().await?;
    let base_b = distinct_hand(&hand, run_id, Protocol::Minimal).await?;
    let after = hand.server_micros().await?;
    let same_protocol_b = distinct_hand(&hand, run_id, Protocol::Dlock).await?;
    let cycles = (SIZES.distinct_tasks * SIZES.distinct_cycles) as f64;
    let server_us =
        |from: u64, to: u64| Duration::from_nanos(((to - from) as f64 * 1000.0 / cycles) as u64);

    let ours_c = hot_key_dlock(&SIZES, &backend, &format!("bench:{run_id}:c")).await?;
    let base_c = hot_key_hand(&hand, &format!("bench:{run_id}:c-hand")).await?;

    // Hand-off crosses clients, as between two processes: the waiter has its own connection.
    let waiter: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let ours_d = handoff_dlock(&SIZES, &backend, &waiter, &format!("bench:{run_id}:d")).await?;
    let base_d = handoff_hand(
        &hand,
        &HandWritten::connect(url).await?,
        &format!("bench:{run_id}:d-hand"),
    )
    .await?;

    let rows = [
        Row::latency("(a) 1 task, acquire+release, p50", ours_a.p50, base_a.p50),
        Row::latency("(a) 1 task, acquire+release, p99", ours_a.p99, base_a.p99),
        Row::latency(
            "(a) p50, baseline running dlock's two scripts",
            ours_a2.p50,
            same_protocol_a.p50,
        ),
        Row::throughput("(b) 64 tasks, distinct keys, cycles", ours_b, base_b),
        Row::latency(
            "(b) Redis CPU per cycle (INFO cpu)",
            server_us(before, between),
            server_us(between, after),
        ),
        Row::throughput(
            "(b) same, baseline running dlock's two scripts",
            ours_b,
            same_protocol_b,
        ),
        Row::throughput("(c) 16 tasks, one key, critical sections", ours_c, base_c),
        Row::latency(
            "(d) hand-off release→next holder, p50",
            ours_d.p50,
            base_d.p50,
        ),
        Row::latency(
            "(d) hand-off release→next holder, p99",
            ours_d.p99,
            base_d.p99,
        ),
    ];
    print_table(
        "Redis: dlock vs a hand-written SET NX PX loop (10 ms polling)",
        "hand-written",
        &rows,
    );
    println!("\n{}", SIZES.describe());

    observed_b(&obs, &backend, run_id, detail).await
}

/// (b) with observability on against off, alternating rounds, and a check
/// that the recorder saw exactly the acquisitions of its rounds.
async fn observed_b(
    obs: &Observability,
    backend: &Arc<dyn LockBackend>,
    run_id: u32,
    detail: bool,
) -> Result<(), BoxError> {
    let mut settings = vec![Setting::OFF, Setting::ON];
    if detail {
        settings.extend([Setting::RECORDER, Setting::SUBSCRIBER]);
    }
    let sizes = Sizes {
        distinct_cycles: OBSERVED_CYCLES,
        ..SIZES
    };
    let cycles = (sizes.distinct_tasks * sizes.distinct_cycles) as u64;
    // The same keys under every setting, so only the setting differs.
    let keys = format!("{run_id}-observed");
    let (sizes_ref, keys_ref) = (&sizes, &keys);
    let compared = observed::compare(obs, &settings, OBSERVED_ROUNDS, || {
        Box::pin(async move {
            distinct_dlock(sizes_ref, backend, keys_ref).await?;
            Ok(cycles)
        })
    })
    .await?;
    observed::print_compared(
        "Redis: dlock with observability on vs off (same run, alternating rounds)",
        "(b) 64 tasks, distinct keys",
        &compared,
    );

    let exposition = obs.render();
    let seen = observed::acquired(&exposition);
    println!(
        "\n{OBSERVED_ROUNDS} rounds of {}×{} per setting; the fmt layer writes to io::sink. \
         Prometheus rendered {} dlock_ series; acquisitions recorded {seen}, expected {}",
        sizes.distinct_tasks,
        sizes.distinct_cycles,
        observed::dlock_series(&exposition),
        compared.recorded_work,
    );
    if seen != compared.recorded_work as f64 {
        return Err(format!(
            "the recorder saw {seen} acquisitions, but its rounds made {}",
            compared.recorded_work
        )
        .into());
    }
    Ok(())
}

async fn uncontended_hand(
    hand: &HandWritten,
    cycles: usize,
    key: &str,
    protocol: Protocol,
) -> Result<Vec<Duration>, BoxError> {
    let mut samples = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let start = Instant::now();
        hand.cycle(key, protocol).await?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// What the hand-written loop sends for one cycle.
#[derive(Debug, Clone, Copy)]
enum Protocol {
    /// `SET NX PX`, then compare-and-delete: what people write by hand.
    Minimal,
    /// dlock's own two scripts (fencing `INCR`, release `PUBLISH`), sent
    /// the same way: what the protocol itself costs, without dlock.
    Dlock,
}

async fn distinct_hand(
    hand: &HandWritten,
    run_id: u32,
    protocol: Protocol,
) -> Result<f64, BoxError> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..SIZES.distinct_tasks {
        let (hand, key) = (
            hand.clone(),
            format!("bench:{{{run_id}:b-hand:{t}:{protocol:?}}}"),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..SIZES.distinct_cycles {
                hand.cycle(&key, protocol).await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((SIZES.distinct_tasks * SIZES.distinct_cycles) as f64 / start.elapsed().as_secs_f64())
}

async fn hot_key_hand(hand: &HandWritten, key: &str) -> Result<f64, BoxError> {
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..SIZES.hot_tasks {
        let (hand, key, counter) = (hand.clone(), key.to_owned(), counter.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..SIZES.hot_increments {
                let token = hand.lock_polling(&key).await?;
                critical_increment(&counter).await;
                hand.unlock(&key, &token).await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = start.elapsed();
    check_counter(&counter, SIZES.hot_tasks as u64 * SIZES.hot_increments)?;
    Ok(counter.load(Ordering::SeqCst) as f64 / elapsed.as_secs_f64())
}

async fn handoff_hand(
    holder: &HandWritten,
    waiter: &HandWritten,
    key: &str,
) -> Result<Summary, BoxError> {
    let mut samples = Vec::with_capacity(SIZES.handoffs);
    for _ in 0..SIZES.handoffs {
        let token = holder.lock_polling(key).await?;
        let (waiter, key2) = (waiter.clone(), key.to_owned());
        let waiting = tokio::spawn(async move {
            let token = waiter.lock_polling(&key2).await?;
            let got = Instant::now();
            waiter.unlock(&key2, &token).await?;
            Ok::<_, BoxError>(got)
        });
        tokio::time::sleep(Duration::from_millis(3)).await;
        let released = Instant::now();
        holder.unlock(key, &token).await?;
        samples.push(waiting.await??.saturating_duration_since(released));
    }
    Ok(Summary::of(&mut samples).expect("samples"))
}

/// The minimal lock people write by hand with the `redis` crate.
#[derive(Clone)]
struct HandWritten {
    conn: MultiplexedConnection,
    unlock: Arc<redis::Script>,
    /// dlock's acquire and release scripts, for [`Protocol::Dlock`].
    lock_fenced: Arc<redis::Script>,
    unlock_announced: Arc<redis::Script>,
    next_token: Arc<AtomicU64>,
}

impl HandWritten {
    async fn connect(url: &str) -> Result<Self, BoxError> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let unlock = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        // dlock's acquire script, fence floor included (see `scripts.rs`).
        let lock_fenced = redis::Script::new(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then \
             local t = redis.call('TIME') \
             local floor = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
             local fence = redis.call('INCR', KEYS[2]) \
             if fence < floor then redis.call('SET', KEYS[2], floor) fence = floor end \
             return {1, fence} end \
             return {0, redis.call('PTTL', KEYS[1])}",
        );
        let unlock_announced = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0",
        );
        Ok(HandWritten {
            conn,
            unlock: Arc::new(unlock),
            lock_fenced: Arc::new(lock_fenced),
            unlock_announced: Arc::new(unlock_announced),
            next_token: Arc::new(AtomicU64::new(std::process::id() as u64 * 1_000_000_000)),
        })
    }

    /// The server process's CPU time so far (user + system, from `INFO
    /// cpu`), in µs: what a workload costs the one Redis that every client
    /// of a deployment shares.
    async fn server_micros(&self) -> Result<u64, BoxError> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.conn.clone())
            .await?;
        let seconds: f64 = info
            .lines()
            .filter(|line| line.starts_with("used_cpu_sys:") || line.starts_with("used_cpu_user:"))
            .filter_map(|line| line.split(':').nth(1)?.trim().parse::<f64>().ok())
            .sum();
        Ok((seconds * 1e6) as u64)
    }

    async fn try_lock(&self, key: &str) -> Result<Option<String>, BoxError> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed).to_string();
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(set.map(|_| token))
    }

    /// Takes the free `key` and gives it back, in `protocol`.
    async fn cycle(&self, key: &str, protocol: Protocol) -> Result<(), BoxError> {
        match protocol {
            Protocol::Minimal => {
                let token = self.try_lock(key).await?.ok_or("free key was busy")?;
                self.unlock(key, &token).await
            }
            Protocol::Dlock => {
                let token = self.try_lock_fenced(key).await?;
                self.unlock_announced(key, &token).await
            }
        }
    }

    /// One try with dlock's acquire script (the fence is dropped: the
    /// cost is the point). The key is free, so it must succeed.
    async fn try_lock_fenced(&self, key: &str) -> Result<String, BoxError> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed).to_string();
        let answer: (i64, i64) = self
            .lock_fenced
            .key(key)
            .key(format!("{key}:fence"))
            .arg(&token)
            .arg(TTL.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        match answer {
            (1, _) => Ok(token),
            _ => Err("free key was busy".into()),
        }
    }

    /// Release with dlock's script: compare-and-delete, then `PUBLISH`.
    async fn unlock_announced(&self, key: &str, token: &str) -> Result<(), BoxError> {
        let _: i64 = self
            .unlock_announced
            .key(key)
            .arg(token)
            .arg(format!("{key}:released"))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    async fn lock_polling(&self, key: &str) -> Result<String, BoxError> {
        loop {
            if let Some(token) = self.try_lock(key).await? {
                return Ok(token);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BoxError> {
        let _: i64 = self
            .unlock
            .key(key)
            .arg(token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
