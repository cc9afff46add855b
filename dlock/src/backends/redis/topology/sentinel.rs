//! `redis+sentinel://`: the master of a Sentinel deployment, followed across
//! failovers.
//!
//! Connect asks the sentinels for the master (`SENTINEL MASTERS`, through
//! the `redis` crate's sentinel client, which also checks with `ROLE` that
//! the node it names is a master) and opens one [`Connection`] to it.
//! Every request goes to the current master; the master is asked for again
//! (and, when the sentinels name another node, a connection to that one
//! replaces the old):
//! - when a request fails because the node is gone (connection refused,
//!   dropped or timed out), or answers `READONLY` (it was demoted to a
//!   replica). The request is then sent once more to the new master: every
//!   request dlock sends is idempotent for its owner token (an acquire
//!   answered again with the fence it first issued, a compare-and-delete, a
//!   compare-and-extend);
//! - when a sentinel announces `+switch-master` for this master (a task on
//!   dlock's background runtime listens on one sentinel at a time).
//!
//! During a failover's first seconds the sentinels still name the dead
//! master: requests fail (`Backend`), the watchdog retries renewals until
//! each lease's deadline, and the guard reports lost only when it passes;
//! a lock's `acquire` with a wait tries again until the wait ends
//! (`ride_through.rs`).
//!
//! `listed.rs` asks the sentinels which replicas the master has, connected
//! or not, for `?replicas=auto`.
//!
//! All of it runs on dlock's background runtime (see `connection.rs`), so
//! following the master does not depend on any caller's runtime.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

use crate::backends::redis::config::{RedisOptions, SentinelTarget};
use crate::backends::redis::transport::connection::{Connection, Reconnects};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::lease::background;
use crate::LockError;

mod listed;

/// The channel on which sentinels announce a new master:
/// `<name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// A connection to the current master of one Sentinel deployment. Cheap to
/// clone: clones share it.
#[derive(Clone)]
pub(crate) struct Sentinel {
    inner: Arc<Inner>,
}

struct Inner {
    /// Asks the sentinels; one question at a time (it caches connections).
    sentinels: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    current: Mutex<Master>,
    /// One switch at a time.
    switching: tokio::sync::Mutex<()>,
    target: SentinelTarget,
    /// The URL as shown (redacted), for logs.
    shown: String,
    /// Told of every switch (the replica counts then belong to another node).
    on_switch: Box<dyn Fn() + Send + Sync>,
    /// Counts the master's connections opened (a switch opens one) and
    /// broken (see `Reconnects`).
    reconnects: Reconnects,
    /// A connection to one sentinel for `SENTINEL REPLICAS` (see
    /// `listed.rs`), opened at the first question.
    listing: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    /// `?timeout_ms=`: the longest a question to the sentinels may take.
    response_timeout: Duration,
    /// Dropped with the backend: stops the `+switch-master` listener.
    _stop_watching: DropGuard,
}

/// The master requests go to now.
#[derive(Clone)]
struct Master {
    addr: String,
    client: redis::Client,
    conn: Connection,
    /// Counts switches, so that concurrent failures switch once.
    generation: u64,
}

impl Sentinel {
    /// Finds the master and connects to it, within `options.response_timeout`.
    pub(crate) async fn connect(
        options: &RedisOptions,
        target: &SentinelTarget,
        config: ConnectionManagerConfig,
        on_switch: Box<dyn Fn() + Send + Sync>,
        reconnects: &Reconnects,
    ) -> Result<Self, LockError> {
        let mut sentinels = sentinel_client(options, target)?;
        let shown = options.shown.clone();
        let limit = options.response_timeout;
        let found = background::run({
            let config = config.clone();
            let reconnects = reconnects.clone();
            async move {
                let client = master_client(&mut sentinels).await?;
                let conn = Connection::open(client.clone(), config, false, &reconnects).await?;
                Ok::<_, RedisError>((sentinels, client, conn))
            }
        });
        let (sentinels, client, conn) = tokio::time::timeout(limit, found)
            .await
            .map_err(|_| {
                LockError::backend(
                    shown.clone(),
                    format!(
                        "no sentinel named a reachable master `{}` within {limit:?}",
                        target.master
                    ),
                )
            })?
            .map_err(|e| LockError::backend(shown.clone(), explain(e, &target.master)))?;
        let addr = address_of(&client);
        tracing::debug!(backend = %shown, master = %addr, "the sentinels named the master");
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            sentinels: tokio::sync::Mutex::new(sentinels),
            config,
            current: Mutex::new(Master {
                addr,
                client,
                conn,
                generation: 0,
            }),
            switching: tokio::sync::Mutex::new(()),
            target: target.clone(),
            shown,
            on_switch,
            reconnects: reconnects.clone(),
            listing: tokio::sync::Mutex::new(None),
            response_timeout: limit,
            _stop_watching: stop.clone().drop_guard(),
        });
        background::spawn_daemon(watch_switches(Arc::downgrade(&inner), stop));
        Ok(Sentinel { inner })
    }

    /// A client of the current master (for the pub/sub connection, which
    /// follows the master by asking again whenever it reconnects).
    pub(crate) fn master_client(&self) -> redis::Client {
        self.inner.master().client
    }

    /// Counts the switches to another master so far: a reply written by
    /// the master of an older count may be one the new master never saw.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.master().generation
    }

    /// The current master's address (`host:port`).
    pub(crate) fn master_addr(&self) -> String {
        self.inner.master().addr
    }

    /// Asks the sentinels for the master again and follows it if it moved:
    /// `Ok(true)` if requests now go to another node.
    pub(crate) async fn refresh(&self) -> RedisResult<bool> {
        let seen = self.inner.master().generation;
        let inner = self.inner.clone();
        background::run(async move { inner.switch(seen).await }).await
    }
}

impl Inner {
    fn master(&self) -> Master {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Follows the master if the sentinels name another node than the one
    /// of generation `seen`; `Ok(true)` if requests now go elsewhere.
    async fn switch(&self, seen: u64) -> RedisResult<bool> {
        let _one = self.switching.lock().await;
        let now = self.master();
        if now.generation != seen {
            return Ok(true); // another request switched meanwhile
        }
        let client = {
            let mut sentinels = self.sentinels.lock().await;
            master_client(&mut sentinels).await?
        };
        let addr = address_of(&client);
        if addr == now.addr {
            return Ok(false);
        }
        let conn =
            Connection::open(client.clone(), self.config.clone(), false, &self.reconnects).await?;
        tracing::info!(master = %self.target.master, from = %now.addr, to = %addr, "dlock: following the Redis master after a failover");
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Master {
            addr,
            client,
            conn,
            generation: seen + 1,
        };
        (self.on_switch)();
        Ok(true)
    }

    /// Sends `request` to the master; if the master is gone or demoted and
    /// the sentinels name another, once more to that one.
    async fn send<T, F, Fut>(self: Arc<Self>, request: F) -> RedisResult<T>
    where
        F: Fn(Connection) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let master = self.master();
        match request(master.conn).await {
            Err(e) if master_is_gone(&e) => {
                // On dlock's runtime: the sentinels' cached connections, and
                // the new master's, must not land on the caller's.
                let inner = self.clone();
                let switched =
                    background::run(async move { inner.switch(master.generation).await }).await;
                match switched {
                    Ok(true) => request(self.master().conn).await,
                    _ => Err(e),
                }
            }
            answer => answer,
        }
    }
}

impl ConnectionLike for Sentinel {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let inner = self.inner.clone();
        Box::pin(inner.send(move |mut conn| async move { conn.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let inner = self.inner.clone();
        Box::pin(inner.send(move |mut conn| async move {
            conn.req_packed_commands(pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.inner.target.db
    }
}

/// Whether `e` says the node is no master any more, or not there: then the
/// sentinels are asked again.
fn master_is_gone(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        // A script's write on a replica comes back as a script error.
        || e.to_string().contains("READONLY")
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_io_error()
        || e.is_timeout()
}

/// The sentinels' client for `target`, with both sets of credentials and TLS.
fn sentinel_client(
    options: &RedisOptions,
    target: &SentinelTarget,
) -> Result<SentinelClient, LockError> {
    let addrs = target
        .sentinels
        .iter()
        .map(|(host, port)| sentinel_addr(options, host, *port));
    let bad = |e: RedisError| LockError::invalid_option(format!("`{}`: {e}", options.shown));
    let mut builder = SentinelClientBuilder::new(addrs, &target.master, SentinelServerType::Master)
        .map_err(bad)?;
    builder = builder.set_client_to_redis_db(target.db);
    // Keep-alive and the user timeout on the master's and the sentinels'
    // sockets too (`config.rs`'s `tcp_settings`).
    let tcp = crate::backends::redis::config::tcp_settings(options);
    builder = builder
        .set_client_to_redis_tcp_settings(tcp.clone())
        .set_client_to_sentinel_tcp_settings(tcp);
    if let Some(user) = &target.user {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = &target.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(user) = &target.sentinel_user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &target.sentinel_password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    builder = tls::apply(builder, options)?;
    builder.build().map_err(bad)
}

fn sentinel_addr(options: &RedisOptions, host: &str, port: u16) -> ConnectionAddr {
    if options.tls {
        ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_owned(), port)
    }
}

#[cfg(feature = "tls")]
mod tls {
    use redis::sentinel::SentinelClientBuilder;
    use redis::TlsMode;

    use crate::backends::redis::config::{tls_certificates, RedisOptions};
    use crate::LockError;

    /// `rediss+sentinel://`: TLS to the sentinels and to the master, both
    /// trusting `?ca=` when given.
    pub(in crate::backends::redis) fn apply(
        builder: SentinelClientBuilder,
        options: &RedisOptions,
    ) -> Result<SentinelClientBuilder, LockError> {
        if !options.tls {
            return Ok(builder);
        }
        let builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        Ok(match tls_certificates(options)? {
            Some(certs) => builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs),
            None => builder,
        })
    }
}

#[cfg(not(feature = "tls"))]
mod tls {
    use redis::sentinel::SentinelClientBuilder;

    use crate::backends::redis::config::RedisOptions;
    use crate::LockError;

    pub(in crate::backends::redis) fn apply(
        builder: SentinelClientBuilder,
        options: &RedisOptions,
    ) -> Result<SentinelClientBuilder, LockError> {
        if options.tls {
            return Err(LockError::invalid_option(format!(
                "`{}` asks for TLS, but dlock was built without its `tls` feature; enable it in Cargo.toml",
                options.shown
            )));
        }
        Ok(builder)
    }
}

/// A client of the master the sentinels name now (checked with `ROLE`).
async fn master_client(sentinels: &mut SentinelClient) -> RedisResult<redis::Client> {
    sentinels.async_get_client().await
}

/// `host:port` of the node `client` connects to.
fn address_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    }
}

/// What went wrong when no master could be found, in words that name the
/// master and say what to check.
fn explain(e: RedisError, master: &str) -> String {
    match e.kind() {
        ErrorKind::MasterNameNotFoundBySentinel => format!(
            "no sentinel knows a master named `{master}`; check the name after the hosts (sentinel monitor <name> ...): {e}"
        ),
        ErrorKind::AuthenticationFailed => format!(
            "a sentinel or the master `{master}` refused the credentials; the sentinels' own go in ?sentinel_user= and ?sentinel_password=, the master's before the @: {e}"
        ),
        _ if e.is_connection_refusal() || e.is_io_error() || e.is_timeout() => format!(
            "no sentinel could be reached to find master `{master}`: {e}"
        ),
        _ => format!("cannot find master `{master}` through the sentinels: {e}"),
    }
}

/// Listens for `+switch-master` on one sentinel after another and follows
/// the master at once, instead of at the next failed request. Ends when the
/// backend is dropped (`stop`). Between attempts it waits a second.
async fn watch_switches(inner: Weak<Inner>, stop: CancellationToken) {
    stop.run_until_cancelled(async move {
        loop {
            listen_for_switches(&inner).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
}

/// One sentinel's `+switch-master` announcements, until its connection ends.
async fn listen_for_switches(inner: &Weak<Inner>) {
    let Some(strong) = inner.upgrade() else {
        return;
    };
    let name = strong.target.master.clone();
    let sentinel = strong
        .sentinels
        .lock()
        .await
        .async_get_sentinel_client()
        .await;
    drop(strong);
    let Ok(sentinel) = sentinel else {
        return;
    };
    let Ok(mut pubsub) = sentinel.get_async_pubsub().await else {
        return;
    };
    if pubsub.subscribe(SWITCH_MASTER).await.is_err() {
        return;
    }
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let payload: String = message.get_payload().unwrap_or_default();
        if payload.split(' ').next() != Some(name.as_str()) {
            continue;
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let seen = strong.master().generation;
        if let Err(e) = strong.switch(seen).await {
            tracing::debug!(backend = %strong.shown, error = %e, "following +switch-master failed; the next request asks again");
        }
    }
}
