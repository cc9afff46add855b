//! The global registry of named backends, and `connect(url)`.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, RwLock};

use crate::backend::schemes::{self, Backend};
use crate::backend::LockBackend;
use crate::backends::memory::MemoryBackend;
use crate::LockError;

/// The name under which the default backend is reported in errors.
pub const DEFAULT_NAME: &str = "default";

/// Named backends, and the default one, shared by the whole process.
///
/// `Lock` and `#[distributed_lock]` look their backend up here when it is
/// used, not when the lock is built, so the registry can be filled at startup
/// after locks are declared.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let registry = dlock::Registry::new();
/// registry.set_default(dlock::connect("memory://").await?);
/// registry.register("jobs", dlock::connect("memory://").await?);
/// assert!(registry.get("jobs").is_ok());
/// let err = registry.get("etcd").unwrap_err();
/// assert!(err.to_string().contains("registered: jobs"));
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct Registry {
    default: RwLock<Option<Arc<dyn LockBackend>>>,
    named: RwLock<BTreeMap<String, Arc<dyn LockBackend>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("default", &*read(&self.default))
            .field("named", &*read(&self.named))
            .finish()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Writers only swap whole values, so a poisoned lock still holds a consistent value.
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    /// An empty registry (most code uses the global one, [`registry()`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `backend` the one used by locks that name no backend. Replaces any earlier default.
    pub fn set_default(&self, backend: Arc<dyn LockBackend>) {
        *write(&self.default) = Some(backend);
    }

    /// Registers `backend` under `name`, replacing any backend of that name.
    pub fn register(&self, name: impl Into<String>, backend: Arc<dyn LockBackend>) {
        write(&self.named).insert(name.into(), backend);
    }

    /// Removes and returns the backend registered under `name`.
    pub fn unregister(&self, name: &str) -> Option<Arc<dyn LockBackend>> {
        write(&self.named).remove(name)
    }

    /// The backend registered under `name`.
    ///
    /// # Errors
    /// [`LockError::NoBackend`], listing the registered names.
    pub fn get(&self, name: &str) -> Result<Arc<dyn LockBackend>, LockError> {
        read(&self.named)
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_backend(name))
    }

    /// The default backend.
    ///
    /// # Errors
    /// [`LockError::NoBackend`] with name `"default"` when none is set: dlock
    /// never falls back silently to an in-process backend, because that would
    /// quietly stop excluding other processes.
    pub fn default_backend(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        read(&self.default)
            .clone()
            .ok_or_else(|| self.no_backend(DEFAULT_NAME))
    }

    /// The names of the registered backends, sorted.
    pub fn names(&self) -> Vec<String> {
        read(&self.named).keys().cloned().collect()
    }

    fn no_backend(&self, name: &str) -> LockError {
        LockError::NoBackend {
            name: name.to_owned(),
            registered: self.names(),
        }
    }
}

/// The process-wide registry used by `Lock` and `#[distributed_lock]`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let guard = dlock::Lock::new("migrations").acquire().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub fn registry() -> &'static Registry {
    static GLOBAL: LazyLock<Registry> = LazyLock::new(Registry::new);
    &GLOBAL
}

/// Connects to the lock service named by `url` and returns it as a backend.
///
/// Schemes: `memory://` always; `redis://`, `rediss://`, `redis+cluster://`,
/// `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://`,
/// `redlock://`, `etcd://`, `etcds://`, `zk://`, `zks://`, `postgres://`,
/// `postgresql://` with
/// their cargo features (the table in [`backends`](crate::backends)).
///
/// # Errors
/// [`LockError::InvalidOption`] naming the URL (password redacted) if the
/// scheme is unknown, its feature is off, or the URL is malformed;
/// [`LockError::Backend`] if the service cannot be reached;
/// [`LockError::ShutDown`] after [`dlock::shutdown`](crate::shutdown).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let memory = dlock::connect("memory://").await.unwrap();
/// assert_eq!(memory.describe(), "memory://");
/// let err = dlock::connect("mongo://u:hunter2@db").await.unwrap_err();
/// assert!(err.to_string().contains("mongo://u:***@db"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, LockError> {
    crate::lease::background::check()?;
    let shown = crate::url::redact(url);
    let Some(scheme) = crate::url::scheme(url) else {
        return Err(LockError::invalid_option(format!(
            "`{shown}` is not a lock service URL; write `scheme://address`, e.g. `redis://127.0.0.1:6379` or `memory://`"
        )));
    };
    let Some(row) = schemes::find(scheme) else {
        return Err(LockError::invalid_option(format!(
            "`{shown}` has the unknown scheme `{scheme}`; dlock knows {}",
            schemes::all_listed()
        )));
    };
    match row.backend {
        Backend::Memory => Ok(Arc::new(MemoryBackend::connect(url).await?)),
        #[cfg(feature = "redis")]
        Backend::Redis if crate::backends::redis::redisson::asks_for_redisson(url) => Ok(Arc::new(
            crate::backends::redis::redisson::RedissonBackend::connect(url).await?,
        )),
        #[cfg(feature = "redis")]
        Backend::Redis => Ok(Arc::new(
            crate::backends::redis::RedisBackend::connect(url).await?,
        )),
        #[cfg(feature = "redlock")]
        Backend::Redlock => Ok(Arc::new(
            crate::backends::redlock::RedlockBackend::connect(url).await?,
        )),
        #[cfg(feature = "etcd")]
        Backend::Etcd => Ok(Arc::new(
            crate::backends::etcd::EtcdBackend::connect(url).await?,
        )),
        #[cfg(feature = "zookeeper")]
        Backend::ZooKeeper => Ok(Arc::new(
            crate::backends::zookeeper::ZooKeeperBackend::connect(url).await?,
        )),
        #[cfg(feature = "postgres")]
        Backend::Postgres => Ok(Arc::new(
            crate::backends::postgres::PostgresBackend::connect(url).await?,
        )),
        // A backend whose cargo feature is off in this build.
        #[allow(unreachable_patterns)]
        _ => {
            let feature = row.feature.unwrap_or(scheme);
            Err(LockError::invalid_option(format!(
                "`{shown}` needs dlock's `{feature}` cargo feature; enable it: dlock-rs = {{ version = \"0.1\", features = [\"{feature}\"] }}"
            )))
        }
    }
}
