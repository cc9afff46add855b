//! Observability that can be switched on and off inside one process, so a
//! suite can measure dlock with and without it in the same run.
//!
//! A global `metrics` recorder and a global `tracing` subscriber cannot be
//! uninstalled, so [`Observability::install`] installs both once, switchable:
//! a recorder that forwards to a Prometheus recorder while switched on and
//! hands out no-op handles while off, and a `tracing-subscriber` registry
//! whose fmt layer sits behind a reloadable level filter (`OFF` or `INFO`).
//! Off, dlock pays what it pays with nothing installed: the `metrics`
//! macros build their key before asking the recorder either way, and a
//! level filter of `OFF` disables every span at its callsite.
//!
//! The fmt layer writes to [`std::io::sink`], so what is measured is
//! dlock's cost of emitting, not a terminal's speed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, Registry};

use super::stats::fmt_duration;
use super::workloads::BoxError;

/// What is switched on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Metrics go to the Prometheus recorder.
    pub recorder: bool,
    /// The fmt subscriber is at `INFO` (else `OFF`).
    pub subscriber: bool,
}

impl Setting {
    /// Nothing on: as if nothing were installed.
    pub const OFF: Setting = Setting {
        recorder: false,
        subscriber: false,
    };
    /// A Prometheus recorder and a subscriber at `INFO`.
    pub const ON: Setting = Setting {
        recorder: true,
        subscriber: true,
    };
    /// The recorder alone (a diagnostic).
    pub const RECORDER: Setting = Setting {
        recorder: true,
        subscriber: false,
    };
    /// The subscriber alone (a diagnostic).
    pub const SUBSCRIBER: Setting = Setting {
        recorder: false,
        subscriber: true,
    };
}

impl Setting {
    /// What the setting is, for a table row.
    pub fn describe(self) -> &'static str {
        match (self.recorder, self.subscriber) {
            (false, false) => "observability off",
            (true, true) => "Prometheus recorder + fmt subscriber at INFO",
            (true, false) => "Prometheus recorder only",
            (false, true) => "fmt subscriber at INFO only",
        }
    }
}

/// The installed recorder and subscriber, and their switches.
pub struct Observability {
    recording: Arc<AtomicBool>,
    level: reload::Handle<LevelFilter, Registry>,
    prometheus: PrometheusHandle,
}

impl Observability {
    /// Installs the process's global recorder and subscriber, both off.
    /// Fails if either is already installed (they are once per process).
    pub fn install() -> Result<Observability, BoxError> {
        let prometheus = PrometheusBuilder::new().build_recorder();
        let handle = prometheus.handle();
        let recording = Arc::new(AtomicBool::new(false));
        metrics::set_global_recorder(Switchable {
            inner: prometheus,
            on: recording.clone(),
        })
        .map_err(|_| "a global metrics recorder was already installed")?;

        let (filter, level) = reload::Layer::new(LevelFilter::OFF);
        let subscriber = tracing_subscriber::registry().with(filter).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::io::sink),
        );
        subscriber
            .try_init()
            .map_err(|e| format!("installing the tracing subscriber: {e}"))?;
        Ok(Observability {
            recording,
            level,
            prometheus: handle,
        })
    }

    /// Switches the recorder and the subscriber, and checks that the
    /// subscriber's level took effect (the reload rebuilds callsite interest).
    pub fn set(&self, setting: Setting) -> Result<(), BoxError> {
        self.recording.store(setting.recorder, Ordering::SeqCst);
        let level = if setting.subscriber {
            LevelFilter::INFO
        } else {
            LevelFilter::OFF
        };
        self.level
            .reload(level)
            .map_err(|e| format!("switching the subscriber to {level}: {e}"))?;
        if LevelFilter::current() != level {
            return Err(format!(
                "subscriber switched to {level} but tracing reports {}",
                LevelFilter::current()
            )
            .into());
        }
        Ok(())
    }

    /// What an exporter's periodic upkeep does (drains histogram samples
    /// into their summaries); run between rounds, outside the timed part.
    pub fn upkeep(&self) {
        self.prometheus.run_upkeep();
    }

    /// The Prometheus exposition of everything recorded so far.
    pub fn render(&self) -> String {
        self.prometheus.render()
    }
}

/// A recorder that forwards to `inner` while `on`, and hands out no-op
/// handles otherwise. Descriptions always go through: they are registered
/// once, not per call.
struct Switchable {
    inner: PrometheusRecorder,
    on: Arc<AtomicBool>,
}

impl Switchable {
    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }
}

impl Recorder for Switchable {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on() {
            self.inner.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on() {
            self.inner.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on() {
            self.inner.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// The sum of the `dlock_acquire_total` series with `outcome="acquired"`
/// in a Prometheus exposition: how many acquisitions the recorder saw.
pub fn acquired(exposition: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| {
            line.starts_with("dlock_acquire_total{") && line.contains("outcome=\"acquired\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// How many `dlock_` series an exposition holds (sample lines, comments
/// excluded: a summary counts its quantiles, `_sum` and `_count`).
pub fn dlock_series(exposition: &str) -> usize {
    exposition
        .lines()
        .filter(|line| line.starts_with("dlock_"))
        .count()
}

/// Throughput of one workload under each of several settings.
#[derive(Debug, Clone)]
pub struct Compared {
    /// The settings, in the order given.
    pub settings: Vec<Setting>,
    /// Per setting: work done per second over all its rounds.
    pub rates: Vec<f64>,
    /// Per setting: this process's CPU time (all threads) per unit of work,
    /// if the platform tells. Less at the mercy of neighbours than `rates`:
    /// what observability adds to dlock's client, the server's part aside.
    pub cpu_per_work: Vec<Option<Duration>>,
    /// Per setting after the first: its rate over the first setting's, round
    /// by round (how much the ratio moves within one run).
    pub round_ratios: Vec<Vec<f64>>,
    /// Rounds run with the recorder on, so the work it must have seen.
    pub recorded_work: u64,
}

/// Runs `round` under each setting, `rounds` times, in an order that
/// reverses every round (A B, B A, A B, ...) so that drift on a shared
/// machine (a neighbour's build, CPU frequency, warm-up) falls on both
/// sides alike rather than always on whichever runs second. `round` gives
/// how much work it did; only its own duration is timed, not the upkeep
/// that an exporter would run in the background every few seconds.
pub async fn compare<'a, F>(
    obs: &Observability,
    settings: &[Setting],
    rounds: usize,
    mut round: F,
) -> Result<Compared, BoxError>
where
    F: FnMut() -> Pin<Box<dyn Future<Output = Result<u64, BoxError>> + Send + 'a>>,
{
    if settings.is_empty() || rounds == 0 {
        return Err(format!(
            "compare needs a setting and a round; got {} settings, {rounds} rounds",
            settings.len()
        )
        .into());
    }
    let mut work = vec![0u64; settings.len()];
    let mut time = vec![Duration::ZERO; settings.len()];
    let mut cpu = vec![Some(Duration::ZERO); settings.len()];
    let mut per_round = vec![Vec::with_capacity(rounds); settings.len()];
    let mut recorded_work = 0;
    for r in 0..rounds {
        let mut order: Vec<usize> = (0..settings.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for i in order {
            obs.set(settings[i])?;
            let (start, cpu_start) = (Instant::now(), cpu_time());
            let done = round().await?;
            let took = start.elapsed();
            cpu[i] = match (cpu[i], cpu_start, cpu_time()) {
                (Some(sum), Some(from), Some(to)) => Some(sum + to.saturating_sub(from)),
                _ => None,
            };
            obs.set(Setting::OFF)?;
            obs.upkeep();
            work[i] += done;
            time[i] += took;
            per_round[i].push(done as f64 / took.as_secs_f64());
            if settings[i].recorder {
                recorded_work += done;
            }
        }
    }
    let rates = work
        .iter()
        .zip(&time)
        .map(|(w, t)| *w as f64 / t.as_secs_f64())
        .collect();
    let cpu_per_work = cpu
        .iter()
        .zip(&work)
        .map(|(cpu, w)| cpu.map(|c| Duration::from_secs_f64(c.as_secs_f64() / (*w).max(1) as f64)))
        .collect();
    let round_ratios = per_round[1..]
        .iter()
        .map(|rates| {
            rates
                .iter()
                .zip(&per_round[0])
                .map(|(x, base)| x / base)
                .collect()
        })
        .collect();
    Ok(Compared {
        settings: settings.to_vec(),
        rates,
        cpu_per_work,
        round_ratios,
        recorded_work,
    })
}

/// The CPU time this process has used so far, all threads together.
pub fn cpu_time() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .ok()
        .map(Duration::from)
}

/// Prints `compared` as a Markdown table: each setting's rate and its ratio
/// to the first setting's, overall and round by round (median, range).
pub fn print_compared(title: &str, what: &str, compared: &Compared) {
    println!("\n### {title}\n");
    println!(
        "| workload | cycles/s | vs {} | round by round | client CPU per cycle |",
        compared.settings[0].describe()
    );
    println!("|---|---:|---:|---:|---:|");
    let base = compared.rates[0];
    for (i, (setting, rate)) in compared.settings.iter().zip(&compared.rates).enumerate() {
        let range = match i {
            0 => "".to_owned(),
            _ => {
                let mut ratios = compared.round_ratios[i - 1].clone();
                ratios.sort_by(f64::total_cmp);
                let (min, max) = (ratios[0], ratios[ratios.len() - 1]);
                let mid = ratios.len() / 2;
                let median = if ratios.len().is_multiple_of(2) {
                    (ratios[mid - 1] + ratios[mid]) / 2.0
                } else {
                    ratios[mid]
                };
                format!("median {median:.2}×, {min:.2}–{max:.2}×")
            }
        };
        let cpu = compared.cpu_per_work[i].map_or("?".to_owned(), fmt_duration);
        println!(
            "| {what}, {} | {rate:.0}/s | {:.2}× | {range} | {cpu} |",
            setting.describe(),
            rate / base
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_of_an_exposition() {
        let text = "# TYPE dlock_acquire_total counter\n\
                    dlock_acquire_total{backend=\"redis\",kind=\"lock\",outcome=\"acquired\"} 42\n\
                    dlock_acquire_total{backend=\"redis\",kind=\"lock\",outcome=\"busy\"} 1\n\
                    dlock_acquire_total{backend=\"etcd\",kind=\"lock\",outcome=\"acquired\"} 8\n\
                    other_total 3\n";
        assert_eq!(acquired(text), 50.0);
        assert_eq!(dlock_series(text), 3);
    }

    /// The only test that installs: the recorder and subscriber are global.
    #[tokio::test]
    async fn records_and_logs_only_while_on() {
        let obs = Observability::install().unwrap();
        assert!(Observability::install().is_err(), "installs once");
        let info_rounds = std::sync::atomic::AtomicU64::new(0);
        let info_rounds = &info_rounds;
        let compared = compare(&obs, &[Setting::OFF, Setting::ON], 3, || {
            Box::pin(async move {
                metrics::counter!("dlock_acquire_total", "outcome" => "acquired").increment(2);
                if LevelFilter::current() == LevelFilter::INFO {
                    info_rounds.fetch_add(1, Ordering::SeqCst);
                }
                Ok(2)
            })
        })
        .await
        .unwrap();
        assert_eq!(compared.recorded_work, 6);
        assert_eq!(acquired(&obs.render()), 6.0, "{}", obs.render());
        assert_eq!(info_rounds.load(Ordering::SeqCst), 3);
        assert_eq!(LevelFilter::current(), LevelFilter::OFF, "left off");
        assert_eq!(compared.rates.len(), 2);
        assert_eq!(compared.round_ratios[0].len(), 3);

        let none = compare(&obs, &[], 3, || Box::pin(async { Ok(0) })).await;
        assert!(none.unwrap_err().to_string().contains("0 settings"));
    }
}
