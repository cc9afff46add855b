//! `connect(url)`: a URL's scheme looked up in the scheme table
//! (`backend/schemes.rs`), and the backend of that row connected. The one
//! module that knows every backend.

use std::sync::Arc;

use crate::backend::schemes::{self, Backend};
use crate::backend::LockBackend;
use crate::backends::memory::MemoryBackend;
use crate::LockError;

/// Connects to the lock service named by `url` and returns it as a backend.
///
/// Schemes: `memory://` always; `redis://`, `rediss://`, `redis+cluster://`,
/// `rediss+cluster://`, `redis+sentinel://`, `rediss+sentinel://`,
/// `redlock://`, `etcd://`, `etcds://`, `zk://`, `zks://`, `postgres://`,
/// `postgresql://`, `mysql://`, `mysqls://`, `file:///path/to/dir` (Linux) with
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
        Backend::Redis if crate::backends::redis::asks_for_redisson(url) => Ok(Arc::new(
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
        #[cfg(all(feature = "file", target_os = "linux"))]
        Backend::File => Ok(Arc::new(
            crate::backends::file::FileBackend::connect(url).await?,
        )),
        #[cfg(all(feature = "file", not(target_os = "linux")))]
        Backend::File => Err(LockError::invalid_option(format!(
            "`{shown}`: the file backend runs on Linux only (it waits with inotify); use a server backend here"
        ))),
        #[cfg(feature = "mysql")]
        Backend::Mysql => Ok(Arc::new(
            crate::backends::mysql::MysqlBackend::connect(url).await?,
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
