//! Building a [`RedlockBackend`]: from a `redlock://` URL, from one URL a
//! master or from connected Redis backends, and its settings (the per-node
//! timeout, the restart quarantine).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{check_count, parse_url};
use super::quorum::Undos;
use super::RedlockBackend;
use crate::backend::LockBackend;
use crate::backends::redis::RedisBackend;
use crate::LockError;

impl RedlockBackend {
    /// Connects to the masters named by a `redlock://` URL (see the
    /// [module docs](super#url)).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] naming the URL (password redacted) if it
    /// is malformed, names fewer than three masters or one master twice;
    /// [`LockError::Backend`] if a master cannot be reached.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let backend = dlock::backends::redlock::RedlockBackend::connect(
    ///     "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003?node_timeout_ms=50",
    /// )
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = parse_url(url)?;
        let nodes = connect_all(&parsed.nodes).await?;
        let mut backend = Self::assemble(nodes, parsed.shown)?;
        backend.node_timeout = parsed.node_timeout;
        backend.restart_quarantine = parsed.restart_quarantine;
        Ok(backend)
    }

    /// Connects to one master per URL (`redis://…` or `rediss://…`, each
    /// with its own credentials and parameters).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for fewer than three URLs, a repeated
    /// one, a malformed one or a cluster URL; [`LockError::Backend`] if a
    /// master cannot be reached.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::redlock::RedlockBackend;
    /// let backend = RedlockBackend::from_urls([
    ///     "redis://:pw1@10.0.0.1:6379",
    ///     "redis://:pw2@10.0.0.2:6379",
    ///     "redis://:pw3@10.0.0.3:6379",
    /// ])
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_urls<I, S>(urls: I) -> Result<Self, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let shown = format!(
            "redlock[{}]",
            urls.iter()
                .map(|u| crate::url::redact(u))
                .collect::<Vec<_>>()
                .join(",")
        );
        check_count(urls.len(), &shown)?;
        let nodes = connect_all(&urls).await?;
        Self::assemble(nodes, shown)
    }

    /// Builds a Redlock set from already connected single-server Redis
    /// backends, one per master.
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for fewer than three backends, a
    /// repeated address, or a Redis Cluster backend (a cluster is one
    /// service, not independent masters).
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use dlock::backends::{redis::RedisBackend, redlock::RedlockBackend};
    /// let mut masters = Vec::new();
    /// for port in [7001, 7002, 7003] {
    ///     masters.push(RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).await?);
    /// }
    /// let backend = RedlockBackend::from_backends(masters)?;
    /// # Ok(()) }
    /// ```
    pub fn from_backends(
        backends: impl IntoIterator<Item = RedisBackend>,
    ) -> Result<Self, LockError> {
        let nodes: Vec<Arc<RedisBackend>> = backends
            .into_iter()
            .map(|b| Arc::new(b.into_redlock_master()))
            .collect();
        let shown = format!(
            "redlock[{}]",
            nodes
                .iter()
                .map(|n| n.describe())
                .collect::<Vec<_>>()
                .join(",")
        );
        check_count(nodes.len(), &shown)?;
        Self::assemble(nodes, shown)
    }

    pub(super) fn assemble(
        nodes: Vec<Arc<RedisBackend>>,
        shown: String,
    ) -> Result<Self, LockError> {
        check_count(nodes.len(), &shown)?;
        let mut seen = std::collections::HashSet::new();
        for node in &nodes {
            if node.is_cluster() {
                return Err(LockError::invalid_option(format!(
                    "`{shown}`: `{}` is a Redis Cluster; Redlock needs independent masters",
                    node.describe()
                )));
            }
            if !seen.insert(node.describe()) {
                return Err(LockError::invalid_option(format!(
                    "`{shown}` names the master `{}` twice; a repeated master would vote twice",
                    node.describe()
                )));
            }
        }
        Ok(RedlockBackend {
            suspect_until: nodes.iter().map(|_| Mutex::default()).collect(),
            undos: Undos::default(),
            quorum: nodes.len() / 2 + 1,
            nodes,
            node_timeout: None,
            restart_quarantine: None,
            shown,
        })
    }

    /// Sets the per-node timeout of every request instead of the default
    /// (ttl/100, at least [`MIN_NODE_TIMEOUT`](super::MIN_NODE_TIMEOUT)). Keep it small against the
    /// ttl: the validity of a lease is what is left of the ttl after the
    /// slowest master needed for the quorum answered. A zero is raised to
    /// 1 ms.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// let backend = dlock::backends::redlock::RedlockBackend::connect("redlock://h1:6379,h2:6379,h3:6379")
    ///     .await?
    ///     .node_timeout(Duration::from_millis(50));
    /// assert_eq!(backend.node_timeout_for(Duration::from_secs(30)), Duration::from_millis(50));
    /// # Ok(()) }
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout.max(Duration::from_millis(1)));
        self
    }

    /// Makes every master refuse to vote for `quarantine` after it lost its
    /// data: the "delayed restart" that antirez's Redlock analysis asks
    /// operators for, enforced by the masters themselves. Set it to at
    /// least the longest ttl any client uses on these masters, and in every
    /// client that locks on them (one that does not set it ignores the
    /// quarantine).
    ///
    /// Without it, a master that restarts without persistence while a lock
    /// is held on a bare quorum forgets the lock, and a second client can
    /// reach a quorum with it: two holders. With it, each master keeps a
    /// boot marker (`<prefix>:boot`, no expiry); a master without one (a
    /// restart, a flush, or a master never used with a quarantine before)
    /// writes it and answers "held" until the quarantine is over, by which
    /// time every lease granted before the loss has expired. The cost: the
    /// first acquisitions after the option is turned on, and after each
    /// data loss, wait out the quarantine on that master. Acquisition is
    /// never batched with this option. A quarantine above [`MAX_TTL`](crate::MAX_TTL) makes
    /// every acquisition fail with [`LockError::InvalidOption`].
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// use std::time::Duration;
    /// let backend = dlock::backends::redlock::RedlockBackend::connect("redlock://h1:6379,h2:6379,h3:6379")
    ///     .await?
    ///     .restart_quarantine(Duration::from_secs(30));
    /// # Ok(()) }
    /// ```
    pub fn restart_quarantine(mut self, quarantine: Duration) -> Self {
        self.restart_quarantine = Some(quarantine.max(Duration::from_millis(1)));
        self
    }
}

async fn connect_all(urls: &[String]) -> Result<Vec<Arc<RedisBackend>>, LockError> {
    // `connect` loads the scripts too: a NOSCRIPT retry would not fit in
    // a short per-node timeout.
    let connecting = urls.iter().map(|u| RedisBackend::connect(u));
    futures_util::future::join_all(connecting)
        .await
        .into_iter()
        .map(|r| r.map(|b| Arc::new(b.into_redlock_master())))
        .collect()
}
