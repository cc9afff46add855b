// `ttl`, `wait`, `hold_at_least` and `backend` from expressions evaluated at
// each call: a static configuration, a method on `self`, a parameter.
use std::sync::LazyLock;
use std::time::Duration;

use dlock::{distributed_lock, LockError, LockGuard};

struct Config {
    lock_ttl: Duration,
    lock_wait: Duration,
    lock_backend: String,
}

static CONFIG: LazyLock<Config> = LazyLock::new(|| Config {
    lock_ttl: Duration::from_millis(400),
    lock_wait: Duration::ZERO,
    lock_backend: "jobs".to_owned(),
});

#[distributed_lock(key = "report", ttl = CONFIG.lock_ttl, wait = CONFIG.lock_wait, backend = CONFIG.lock_backend.as_str(), renew = false)]
async fn report(guard: &LockGuard) -> Result<Duration, LockError> {
    Ok(guard.remaining())
}

struct Settings {
    ttl: Duration,
}

impl Settings {
    fn ttl(&self) -> Duration {
        self.ttl
    }
}

struct Service {
    settings: Settings,
    backend: String,
}

impl Service {
    #[distributed_lock(key = "job:{id}", ttl = self.settings.ttl(), backend = &self.backend, hold_at_least = Duration::from_millis(50))]
    async fn run(&self, id: u64, guard: &LockGuard) -> Result<Duration, LockError> {
        let _ = id;
        Ok(guard.remaining())
    }
}

// A parameter can feed a setting too.
#[distributed_lock(key = "export", wait = wait)]
async fn export(wait: Duration) -> Result<(), LockError> {
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), LockError> {
    dlock::registry().set_default(dlock::connect("memory://").await?);
    dlock::registry().register("jobs", dlock::connect("memory://").await?);
    let left = report().await?;
    assert!(left <= Duration::from_millis(400) && left > Duration::from_millis(100), "{left:?}");
    let service = Service {
        settings: Settings { ttl: Duration::from_secs(5) },
        backend: "jobs".to_owned(),
    };
    let left = service.run(7).await?;
    assert!(left > Duration::from_secs(1) && left <= Duration::from_secs(5), "{left:?}");
    export(Duration::from_secs(1)).await?;
    Ok(())
}
