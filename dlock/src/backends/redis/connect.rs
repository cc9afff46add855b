//! Connecting a [`RedisBackend`] (one server, a Cluster, or a Sentinel
//! deployment's master) and what the connection found out about the server:
//! its notifications, its `SET … IFEQ`, the request counts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, RedisResult};

#[cfg(feature = "redlock")]
use crate::backends::redis::calls::batching::MAX_MASTER_BATCH;
use crate::backends::redis::calls::batching::{LaneBatchers, MAX_BATCH};
use crate::backends::redis::config::{client, tls_cluster, RedisOptions};
use crate::backends::redis::topology::replicas::ReplicaAck;
use crate::backends::redis::topology::sentinel::Sentinel;
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::transport::cluster::ClusterConn;
use crate::backends::redis::transport::connection::{Connection, Reconnects};
use crate::backends::redis::waiting::recheck::notifies_releases;
use crate::backends::redis::waiting::subscriber::{Source, Subscriber};
use crate::backends::redis::waiting::turns::Beats;
use crate::backends::redis::{protocol::compare_set, Conn, Counters, RedisBackend, RedisMetrics};
use crate::LockError;

impl RedisBackend {
    /// Connects to the server or cluster named by `url`.
    ///
    /// Forms: `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS, needs
    /// the `tls` feature; `?ca=/path/ca.pem` to trust a private CA),
    /// `redis+cluster://[user:pass@]host:port,host:port,…`,
    /// `redis+sentinel://[user:pass@]host:port,host:port/<master>[?db=N&sentinel_user=..&sentinel_password=..]`
    /// (and `rediss+sentinel://`). Every form takes `?replicas=auto|N` and
    /// `?replica_timeout=` (replica acknowledgement of grants and renewals).
    ///
    /// # Errors
    /// [`LockError::InvalidOption`] for a malformed URL, naming it with the
    /// password redacted; for a server that may evict lock keys (a
    /// `maxmemory-policy` other than `noeviction`, unless `?eviction=accept`;
    /// read again after a reconnect or failover, when the next acquire is
    /// refused the same way); and, with `?replicas=auto` (the default), for
    /// a server that refuses `INFO` (set `?replicas=N` or `?replicas=0`).
    /// [`LockError::Backend`] if the server cannot be reached or refuses the
    /// credentials.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let options = RedisOptions::parse(url)?;
        let fail = |e: RedisError| LockError::backend(options.shown.clone(), e);
        let first = client(&options, &options.nodes[0])?;
        let mut db = first.get_connection_info().redis_settings().db();
        let replicas = Arc::new(ReplicaAck::new(
            options.replicas,
            options.replica_timeout,
            options.aof,
        ));
        let mut source = Source::Fixed(Box::new(first.clone()));
        let reconnects = Reconnects::default();
        let conn = if let Some(target) = &options.sentinel {
            // A failover moves the master: its replica counts are another's.
            let on_switch = {
                let replicas = replicas.clone();
                Box::new(move || replicas.forget())
            };
            let config = connection_config(&options);
            let sentinel =
                Sentinel::connect(&options, target, config, on_switch, &reconnects).await?;
            db = target.db;
            source = Source::Master(sentinel.clone());
            Conn::Single(Server::Followed(sentinel))
        } else if options.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(options.nodes.clone())
                .connection_timeout(Duration::from_secs(2))
                .response_timeout(options.response_timeout)
                .tcp_settings(crate::backends::redis::config::tcp_settings(&options));
            if options.tls {
                builder = tls_cluster(builder, &options)?;
            }
            let cluster = builder.build().map_err(fail)?;
            Conn::Cluster(
                ClusterConn::open(cluster, &reconnects)
                    .await
                    .map_err(fail)?,
            )
        } else {
            Conn::Single(Server::One(
                Connection::open(
                    first.clone(),
                    connection_config(&options),
                    true,
                    &reconnects,
                )
                .await
                .map_err(fail)?,
            ))
        };
        let batchers = match &conn {
            Conn::Single(c) => Some(LaneBatchers::new(c, MAX_BATCH)),
            Conn::Cluster(_) => None,
        };
        let mut backend = RedisBackend {
            conn,
            batchers,
            // In a cluster a PUBLISH reaches every node, so one subscriber
            // connection to any node hears every release.
            subscriber: Subscriber::new(source, &options.prefix),
            beats: Beats::default(),
            replicas,
            options,
            notifying_db: None,
            db,
            set_ifeq: AtomicBool::new(false),
            reconnects,
            eviction: Default::default(),
            metrics: Counters::default(),
        };
        // Prove the connection and credentials now, not at the first lock;
        // the setting and the server's commands are read in the same round
        // trip.
        let (loaded, notifying, set_ifeq, eviction, replicas) = tokio::join!(
            backend.load_scripts(),
            backend.read_notifications(),
            backend.probe_set_ifeq(),
            backend.check_eviction(),
            backend
                .replicas
                .probe_auto(&backend.conn, &backend.options.shown)
        );
        loaded.map_err(|e| backend.name_connect_refusal(e))?;
        eviction?;
        replicas?;
        backend.notifying_db = notifying.then_some(db);
        *backend.set_ifeq.get_mut() = set_ifeq;
        // Renewals by `SET … IFEQ` make `set` events of their own.
        backend.subscriber.set_alarms(!set_ifeq);
        Ok(backend)
    }

    /// This backend as a Redlock master: its batches carry up to
    /// `MAX_MASTER_BATCH` requests (see `MAX_BATCH` in `batching.rs` for why
    /// a master differs).
    #[cfg(feature = "redlock")]
    pub(crate) fn into_redlock_master(mut self) -> Self {
        if let Conn::Single(c) = &self.conn {
            self.batchers = Some(LaneBatchers::new(c, MAX_MASTER_BATCH));
        }
        self
    }

    /// The address (`host:port`) of the master this backend writes to: for
    /// a `redis+sentinel://` URL, the one the sentinels named last (it
    /// changes with a failover); `None` for one server or a Cluster.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let redis = dlock::backends::redis::RedisBackend::connect(
    ///     "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
    /// )
    /// .await?;
    /// println!("writing to {:?}", redis.sentinel_master());
    /// # Ok(()) }
    /// ```
    pub fn sentinel_master(&self) -> Option<String> {
        match &self.conn {
            Conn::Single(Server::Followed(sentinel)) => Some(sentinel.master_addr()),
            _ => None,
        }
    }

    /// Request counts so far.
    pub fn metrics(&self) -> RedisMetrics {
        let batches = self.batchers.as_ref().map_or(0, LaneBatchers::batches);
        RedisMetrics {
            round_trips: self.metrics.round_trips.load(Ordering::Relaxed) + batches,
            batches,
            renew_round_trips: self.metrics.renew_round_trips.load(Ordering::Relaxed),
            rechecks: self.metrics.rechecks.load(Ordering::Relaxed),
        }
    }

    /// Whether the server refused dlock's release channels to this user
    /// (an ACL that allows no `&dlock:*` channel): waiters then wake at the
    /// holder's expiry or by re-checking the key, not at a release. Known
    /// once a waiter has tried to subscribe; logged once as a warning.
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> Result<(), dlock::LockError> {
    /// let redis = dlock::backends::redis::RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// if redis.release_channels_refused() {
    ///     eprintln!("allow dlock's channels: ACL SETUSER <user> &dlock:*");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn release_channels_refused(&self) -> bool {
        self.subscriber.release_refused()
    }

    /// Reads `notify-keyspace-events` (single servers only: see
    /// [`keyspace_notifications`](Self::keyspace_notifications)). dlock
    /// never changes it. A server that refuses `CONFIG` (an ACL without it,
    /// a managed Redis that renames it) counts as not notifying: its
    /// waiters re-check.
    async fn read_notifications(&self) -> bool {
        let Conn::Single(mut conn) = self.conn.clone() else {
            return false;
        };
        self.count();
        let answer: RedisResult<std::collections::HashMap<String, String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("notify-keyspace-events")
            .query_async(&mut conn)
            .await;
        match answer {
            Ok(config) => config
                .get("notify-keyspace-events")
                .is_some_and(|flags| notifies_releases(flags)),
            Err(e) => {
                tracing::debug!(backend = %self.options.shown, error = %e,
                    "cannot read notify-keyspace-events; waiters re-check instead");
                false
            }
        }
    }

    async fn probe_set_ifeq(&self) -> bool {
        self.count();
        let prefix = &self.options.prefix;
        match self.conn.clone() {
            Conn::Single(mut c) => compare_set::probe(&mut c, prefix).await,
            Conn::Cluster(mut c) => compare_set::probe(&mut c, prefix).await,
        }
    }
}

/// How the connection to one server (or to a Sentinel deployment's master)
/// connects and retries.
pub(super) fn connection_config(options: &RedisOptions) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(options.response_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}
