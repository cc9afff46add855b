//! Redis: dlock against the loop people write by hand (`SET NX PX` + a
//! compare-and-delete script, polling every 10 ms while waiting) and against
//! the `rslock` crate on the same single server, in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::backends::redis::RedisBackend;
use dlock::LockBackend;
use redis::aio::MultiplexedConnection;

use super::allocations;
use super::observed::{self, Observability, Setting};
use super::rslock::{self, RsLock};
use super::stats::{print_table, Row, Summary};
use super::workloads::{
    alternating, distinct_dlock, handoff_dlock, handoff_rows, hot_key, hot_key_dlock, hot_key_rows,
    uncontended_dlock, BoxError, HotLock, Sizes, TTL,
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
/// `uncontended_only` runs (a) and (b) alone: the rows that the fence's
/// cost shows in, quick enough to repeat in one sitting.
///
/// (a) and (b) also run dlock with `?fence=off` (no fencing token, no
/// counter), against rslock and the bare loop in the same run.
pub async fn run(url: &str, detail: bool, uncontended_only: bool) -> Result<(), BoxError> {
    // Installed first and switched off: the recorder and subscriber are
    // global for the process and cannot be removed, so every row but the
    // observed ones runs with both off.
    let obs = Observability::install()?;
    let backend: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let joint = if url.contains('?') { '&' } else { '?' };
    let unfenced: Arc<dyn LockBackend> =
        Arc::new(RedisBackend::connect(&format!("{url}{joint}fence=off")).await?);
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

    // rslock on this one server: the plain `SET NX PX` lock of the Rust
    // ecosystem, with its own token and compare-and-delete.
    let rs = rslock::manager(&[url.to_owned()])?;
    let rs_key = format!("bench:{run_id}:a-rs");
    let rs_ref = &rs;
    let (ours_a3, rslock_a) = alternating(
        &SIZES,
        |n| Box::pin(uncontended_dlock(n, backend_ref, &key)),
        |n| Box::pin(rslock::uncontended(rs_ref, n, &rs_key)),
    )
    .await?;
    let unfenced_ref = &unfenced;
    let unfenced_key = format!("bench:{run_id}:a-nofence");
    let (unfenced_a, rslock_a2) = alternating(
        &SIZES,
        |n| Box::pin(uncontended_dlock(n, unfenced_ref, &unfenced_key)),
        |n| Box::pin(rslock::uncontended(rs_ref, n, &rs_key)),
    )
    .await?;

    // (b), four sides in rotating order over several rounds, so that load
    // from elsewhere lands on all of them alike; the server's CPU per cycle
    // is read around every round.
    let round_sizes = Sizes {
        distinct_cycles: SIZES.distinct_cycles / DISTINCT_ROUNDS,
        ..SIZES
    };
    let (hand_ref, rs_ref, sizes_ref) = (&hand, &rs, &round_sizes);
    let id = run_id.to_string();
    let rs_prefix = format!("bench:{run_id}:b-rs");
    let unfenced_id = format!("{run_id}-nofence");
    let (id_ref, rs_prefix_ref, unfenced_id_ref) = (&id, &rs_prefix, &unfenced_id);
    let mut b_sides = [
        DistinctSide::new(move || Box::pin(distinct_dlock(sizes_ref, backend_ref, id_ref))),
        DistinctSide::new(move || {
            Box::pin(distinct_hand(
                sizes_ref,
                hand_ref,
                run_id,
                Protocol::Minimal,
            ))
        }),
        DistinctSide::new(move || {
            Box::pin(distinct_hand(sizes_ref, hand_ref, run_id, Protocol::Dlock))
        }),
        DistinctSide::new(move || Box::pin(rslock::distinct(sizes_ref, rs_ref, rs_prefix_ref))),
        DistinctSide::new(move || {
            Box::pin(distinct_dlock(sizes_ref, unfenced_ref, unfenced_id_ref))
        }),
        DistinctSide::new(move || {
            Box::pin(distinct_hand(
                sizes_ref,
                hand_ref,
                run_id,
                Protocol::Transaction,
            ))
        }),
    ];
    for round in 0..DISTINCT_ROUNDS {
        for i in 0..b_sides.len() {
            let sides = b_sides.len();
            let side = &mut b_sides[(round + i) % sides];
            let before = hand.server_micros().await?;
            let client_before = observed::cpu_time();
            let allocations_before = allocations::count();
            let rate = (side.run)().await?;
            let allocations_after = allocations::count();
            let client_after = observed::cpu_time();
            let after = hand.server_micros().await?;
            let cycles = (round_sizes.distinct_tasks * round_sizes.distinct_cycles) as f64;
            let client_us = client_before
                .zip(client_after)
                .map(|(b, a)| a.saturating_sub(b).as_secs_f64() * 1e6 / cycles);
            side.record(cycles, rate, (after - before) as f64 / cycles, client_us);
            side.allocations.push(allocations::per_cycle(
                allocations_before,
                allocations_after,
                cycles,
            ));
        }
    }
    let [ours_b, base_b, same_protocol_b, rslock_b, unfenced_b, transaction_b] =
        b_sides.map(|side| side.summary());
    let unfenced_vs_hand = [
        Row::throughput(
            "(b) cycles, dlock with `?fence=off`",
            unfenced_b.0,
            base_b.0,
        ),
        Row::latency(
            "(b) Redis CPU per cycle, dlock with `?fence=off`",
            unfenced_b.1,
            base_b.1,
        ),
    ];
    let unfenced_vs_rslock = [
        Row::latency(
            "(a) p50, dlock with `?fence=off`",
            unfenced_a.p50,
            rslock_a2.p50,
        ),
        Row::latency(
            "(a) p99, dlock with `?fence=off`",
            unfenced_a.p99,
            rslock_a2.p99,
        ),
        Row::throughput(
            "(b) cycles, dlock with `?fence=off`",
            unfenced_b.0,
            rslock_b.0,
        ),
        Row::latency(
            "(b) Redis CPU per cycle, dlock with `?fence=off`",
            unfenced_b.1,
            rslock_b.1,
        ),
        Row::latency(
            "(b) client CPU per cycle, dlock with `?fence=off`",
            unfenced_b.2,
            rslock_b.2,
        ),
        // Issue 69's candidate, hand-written: what a fenced cycle without
        // a script would reach, against rslock in the same run.
        Row::throughput(
            "(b) cycles, hand-written fenced `MULTI` cycle (no script to acquire)",
            transaction_b.0,
            rslock_b.0,
        ),
        Row::latency(
            "(b) Redis CPU per cycle, hand-written fenced `MULTI` cycle",
            transaction_b.1,
            rslock_b.1,
        ),
        Row::latency(
            "(b) client CPU per cycle, hand-written fenced `MULTI` cycle",
            transaction_b.2,
            rslock_b.2,
        ),
        Row::throughput(
            "(b) cycles, hand-written with dlock's two scripts",
            same_protocol_b.0,
            rslock_b.0,
        ),
        Row::latency(
            "(b) Redis CPU per cycle, hand-written with dlock's two scripts",
            same_protocol_b.1,
            rslock_b.1,
        ),
        Row::latency(
            "(b) client CPU per cycle, hand-written with dlock's two scripts",
            same_protocol_b.2,
            rslock_b.2,
        ),
    ];
    let uncontended_vs_hand = [
        Row::latency("(a) 1 task, acquire+release, p50", ours_a.p50, base_a.p50),
        Row::latency("(a) 1 task, acquire+release, p99", ours_a.p99, base_a.p99),
        Row::latency(
            "(a) p50, baseline running dlock's two scripts",
            ours_a2.p50,
            same_protocol_a.p50,
        ),
        Row::throughput("(b) 64 tasks, distinct keys, cycles", ours_b.0, base_b.0),
        Row::latency(
            "(b) Redis CPU per cycle (INFO cpu, median of rounds)",
            ours_b.1,
            base_b.1,
        ),
        Row::throughput(
            "(b) same, baseline running dlock's two scripts",
            ours_b.0,
            same_protocol_b.0,
        ),
        Row::latency(
            "(b) Redis CPU per cycle, baseline running dlock's two scripts",
            ours_b.1,
            same_protocol_b.1,
        ),
        Row::latency(
            "(b) client CPU per cycle (this process, median of rounds)",
            ours_b.2,
            base_b.2,
        ),
        Row::per_op(
            "(b) allocations per cycle (this process, median of rounds)",
            ours_b.3,
            base_b.3,
        ),
    ];
    let uncontended_vs_rslock = [
        Row::latency(
            "(a) 1 task, acquire+release, p50",
            ours_a3.p50,
            rslock_a.p50,
        ),
        Row::latency(
            "(a) 1 task, acquire+release, p99",
            ours_a3.p99,
            rslock_a.p99,
        ),
        Row::throughput("(b) 64 tasks, distinct keys, cycles", ours_b.0, rslock_b.0),
        Row::latency(
            "(b) Redis CPU per cycle (INFO cpu, median of rounds)",
            ours_b.1,
            rslock_b.1,
        ),
        Row::latency(
            "(b) client CPU per cycle (this process, median of rounds)",
            ours_b.2,
            rslock_b.2,
        ),
        Row::per_op(
            "(b) allocations per cycle (this process, median of rounds)",
            ours_b.3,
            rslock_b.3,
        ),
    ];
    if uncontended_only {
        let mut rows = uncontended_vs_hand.to_vec();
        rows.extend(unfenced_vs_hand);
        print_table(
            "Redis, uncontended: dlock vs a hand-written SET NX PX loop",
            "hand-written",
            &rows,
        );
        let mut rows = uncontended_vs_rslock.to_vec();
        rows.extend(unfenced_vs_rslock);
        print_table(
            "Redis, uncontended: dlock vs rslock 0.10 on the same single server",
            "rslock",
            &rows,
        );
        println!("\n{}", SIZES.describe());
        return Ok(());
    }

    let ours_c = hot_key_dlock(&SIZES, &backend, &format!("bench:{run_id}:c")).await?;
    let base_c = hot_key(
        &SIZES,
        HandLock::new(&hand, &format!("bench:{run_id}:c-hand")),
    )
    .await?;
    let rslock_c = hot_key(&SIZES, RsLock::new(&rs, &format!("bench:{run_id}:c-rs"))).await?;

    // Hand-off crosses clients, as between two processes: the waiter has its own connection.
    let waiter: Arc<dyn LockBackend> = Arc::new(RedisBackend::connect(url).await?);
    let ours_d = handoff_dlock(&SIZES, &backend, &waiter, &format!("bench:{run_id}:d")).await?;
    let base_d = handoff_hand(
        &hand,
        &HandWritten::connect(url).await?,
        &format!("bench:{run_id}:d-hand"),
    )
    .await?;

    let mut rows = uncontended_vs_hand.to_vec();
    rows.extend(unfenced_vs_hand);
    rows.extend(hot_key_rows(&ours_c, &base_c));
    rows.extend(handoff_rows(&ours_d, &base_d));
    print_table(
        "Redis: dlock vs a hand-written SET NX PX loop (10 ms polling)",
        "hand-written",
        &rows,
    );

    let mut rslock_rows = uncontended_vs_rslock.to_vec();
    rslock_rows.extend(unfenced_vs_rslock);
    rslock_rows.extend(hot_key_rows(&ours_c, &rslock_c));
    print_table(
        "Redis: dlock vs rslock 0.10 on the same single server",
        "rslock",
        &rslock_rows,
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
    /// dlock's own two scripts (fence counter and clock, release `PUBLISH`), sent
    /// the same way: what the protocol itself costs, without dlock.
    Dlock,
    /// A fenced acquire without a script (issue 69's candidate): one
    /// `MULTI` of `EXISTS <queue>`, `SET NX PX`, and the fence counter
    /// raised by `SET <client clock µs> NX` then `INCR` (its expiry
    /// refreshed), then dlock's uncontended release script (`GET`,
    /// `EXISTS <waiters>`, `DEL`): what the script-free cycle costs the
    /// server and the client, without dlock.
    Transaction,
}

/// How many rounds (b) is split into, per side.
const DISTINCT_ROUNDS: usize = 5;

/// One side of (b) over its rounds.
struct DistinctSide<'a> {
    run: Box<dyn FnMut() -> Round<'a> + 'a>,
    cycles: f64,
    seconds: f64,
    server_us: Vec<f64>,
    client_us: Vec<f64>,
    /// Heap allocations per cycle, every thread of this process.
    allocations: Vec<f64>,
}

/// One round of one side of (b): its cycles per second.
type Round<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<f64, BoxError>> + 'a>>;

impl<'a> DistinctSide<'a> {
    fn new(run: impl FnMut() -> Round<'a> + 'a) -> Self {
        DistinctSide {
            run: Box::new(run),
            cycles: 0.0,
            seconds: 0.0,
            server_us: Vec::new(),
            client_us: Vec::new(),
            allocations: Vec::new(),
        }
    }

    fn record(&mut self, cycles: f64, rate: f64, server_us: f64, client_us: Option<f64>) {
        self.cycles += cycles;
        self.seconds += cycles / rate;
        self.server_us.push(server_us);
        self.client_us.extend(client_us);
    }

    /// Cycles per second over all rounds, the median round's server and
    /// client CPU per cycle (the client's zero if it could not be read),
    /// and the median round's allocations per cycle.
    fn summary(self) -> (f64, Duration, Duration, f64) {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let micros = |v: Vec<f64>| Duration::from_nanos((median(v) * 1000.0) as u64);
        (
            self.cycles / self.seconds,
            micros(self.server_us),
            micros(self.client_us),
            median(self.allocations),
        )
    }
}

async fn distinct_hand(
    sizes: &Sizes,
    hand: &HandWritten,
    run_id: u32,
    protocol: Protocol,
) -> Result<f64, BoxError> {
    let sizes = *sizes;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..sizes.distinct_tasks {
        let (hand, key) = (
            hand.clone(),
            format!("bench:{{{run_id}:b-hand:{t}:{protocol:?}}}"),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..sizes.distinct_cycles {
                hand.cycle(&key, protocol).await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((sizes.distinct_tasks * sizes.distinct_cycles) as f64 / start.elapsed().as_secs_f64())
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

/// (c)'s side for the hand-written loop: polls every 10 ms while held.
#[derive(Clone)]
struct HandLock {
    hand: HandWritten,
    key: Arc<str>,
}

impl HandLock {
    fn new(hand: &HandWritten, key: &str) -> Self {
        HandLock {
            hand: hand.clone(),
            key: key.into(),
        }
    }
}

impl HotLock for HandLock {
    type Held = String;

    async fn lock(&self) -> Result<String, BoxError> {
        self.hand.lock_polling(&self.key).await
    }

    async fn unlock(&self, token: String) -> Result<(), BoxError> {
        self.hand.unlock(&self.key, &token).await
    }
}

/// The minimal lock people write by hand with the `redis` crate.
#[derive(Clone)]
struct HandWritten {
    conn: MultiplexedConnection,
    unlock: Arc<redis::Script>,
    /// dlock's acquire and release scripts, for [`Protocol::Dlock`].
    lock_fenced: Arc<redis::Script>,
    unlock_announced: Arc<redis::Script>,
    /// dlock's release with nobody waiting, for [`Protocol::Transaction`].
    unlock_waited: Arc<redis::Script>,
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
             local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) \
             local last = tonumber(redis.call('SET', KEYS[2], now, 'GET')) \
             if last and last >= now then redis.call('SET', KEYS[2], last + 1) return {1, last + 1} end \
             return {1, now} end \
             return {0, redis.call('PTTL', KEYS[1])}",
        );
        let unlock_announced = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', ARGV[2], '1') return 1 end return 0",
        );
        let unlock_waited = redis::Script::new(
            "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
             if redis.call('EXISTS', KEYS[1] .. ':waiters') == 0 then redis.call('DEL', KEYS[1]) return 1 end \
             return 0",
        );
        Ok(HandWritten {
            conn,
            unlock: Arc::new(unlock),
            lock_fenced: Arc::new(lock_fenced),
            unlock_announced: Arc::new(unlock_announced),
            unlock_waited: Arc::new(unlock_waited),
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
            Protocol::Transaction => {
                let token = self.try_lock_transaction(key).await?;
                self.unlock_waited(key, &token).await
            }
        }
    }

    /// One try with the script-free fenced acquire (see
    /// [`Protocol::Transaction`]). The key is free, so it must succeed.
    async fn try_lock_transaction(&self, key: &str) -> Result<String, BoxError> {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed).to_string();
        let ttl = TTL.as_millis() as u64;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros() as u64;
        let fence = format!("{key}:fence");
        let (queued, taken, _, issued, _): (i64, Option<String>, Option<String>, i64, i64) =
            redis::pipe()
                .atomic()
                .cmd("EXISTS")
                .arg(format!("{key}:queue"))
                .cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl)
                .cmd("SET")
                .arg(&fence)
                .arg(now_us)
                .arg("NX")
                .arg("PX")
                .arg(ttl)
                .cmd("INCR")
                .arg(&fence)
                .cmd("PEXPIRE")
                .arg(&fence)
                .arg(ttl)
                .query_async(&mut self.conn.clone())
                .await?;
        match (queued, taken, issued) {
            (0, Some(_), fence) if fence > 0 => Ok(token),
            _ => Err("free key was busy".into()),
        }
    }

    /// Release with dlock's uncontended release script: compare, then
    /// `DEL` when nobody waits.
    async fn unlock_waited(&self, key: &str, token: &str) -> Result<(), BoxError> {
        self.unlock_with(&self.unlock_waited, key, token).await
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
        self.unlock_with(&self.unlock, key, token).await
    }

    /// Runs a release `script` of one key and its token.
    async fn unlock_with(
        &self,
        script: &redis::Script,
        key: &str,
        token: &str,
    ) -> Result<(), BoxError> {
        let _: i64 = script
            .key(key)
            .arg(token)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
