//! A single server's connection: on dlock's background runtime, and on a
//! multi-thread runtime that makes requests, one of that runtime's own (its
//! lane, see `lanes.rs`).
//!
//! Why the background runtime: a `ConnectionManager` spawns its
//! connection's driver (the task that writes requests and reads answers) on
//! whatever runtime is current when it connects, and when a request finds
//! the connection broken, the request itself reconnects, on *its* runtime.
//! A driver on a current-thread runtime stops when that runtime idles (no
//! one blocks on it) or ends: the watchdog's renewals, which run on dlock's
//! own runtime, would then queue unsent while the leases expire. So the
//! background connection is created there, and a request made from a
//! current-thread runtime (or outside any) runs there, as a task of its own
//! that the caller awaits. A request's task is aborted if its caller drops
//! it before it reached the connection, as the request itself would have
//! been; once on the connection it is sent either way, and requests handed
//! over one after the other reach the connection in that order.
//!
//! Why lanes: that hand-over costs two cross-thread wake-ups and a task per
//! request. A multi-thread runtime drives its tasks as long as it exists, so
//! a request made there goes on that runtime's own connection, opened at
//! its first request (which waits for it); the watchdog, the subscriber and
//! the releases of guards dropped outside a runtime keep the background
//! connection.
//!
//! A lane's connection may sit unused while the server restarts (the
//! background one learns of it from the renewals): a request that finds it
//! dropped is sent once more, on the connection the manager opens anew.
//! Every dlock script is made to be sent twice (an acquire whose answer was
//! lost is granted again with the first fence, a release or renewal compares
//! the token), as the Cluster client already resends a script whose
//! connection broke before the answer.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use super::lanes::PerRuntime;
use crate::lease::background;

/// A `ConnectionManager` whose driver and reconnects stay on dlock's
/// background runtime, and one per multi-thread runtime that makes
/// requests. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub(crate) struct Connection {
    background: ConnectionManager,
    /// `None`: every request takes the background connection (Sentinel's
    /// masters: a failover replaces the connection, see `sentinel.rs`).
    lanes: Option<Arc<Lanes>>,
}

/// What opens a lane's connection, and the lanes' connections.
struct Lanes {
    client: redis::Client,
    config: ConnectionManagerConfig,
    conns: PerRuntime<OnceCell<ConnectionManager>>,
}

impl Connection {
    /// Connects on the background runtime; with `lanes`, each multi-thread
    /// runtime that makes a request gets its own connection too.
    pub(crate) async fn open(
        client: redis::Client,
        config: ConnectionManagerConfig,
        lanes: bool,
    ) -> RedisResult<Self> {
        let lanes = lanes.then(|| {
            Arc::new(Lanes {
                client: client.clone(),
                config: config.clone(),
                conns: PerRuntime::default(),
            })
        });
        let background =
            background::run(async move { client.get_connection_manager_with_config(config).await })
                .await?;
        Ok(Connection { background, lanes })
    }

    /// The connection of the lane here, if it is not the background one:
    /// made (not yet connected) on a runtime's first request. A task that
    /// follows a lane whose connection was never opened takes the
    /// background one: nothing went out on that lane for it to follow.
    /// (Of the `lanes` field alone, so that the background connection can
    /// still be borrowed beside it.)
    fn lane(lanes: &Option<Arc<Lanes>>) -> Option<(&Lanes, Arc<OnceCell<ConnectionManager>>)> {
        let lanes = lanes.as_deref()?;
        // Once dlock is shut down, requests answer as the background
        // connection does (refused), not on a lane.
        if background::check().is_err() {
            return None;
        }
        let cell = lanes.conns.here(|_| OnceCell::new())?;
        if cell.get().is_none() && super::lanes::is_following() {
            return None;
        }
        Some((lanes, cell))
    }

    /// The lane's connection, connected on this runtime the first time.
    async fn connected(
        lanes: &Lanes,
        cell: &OnceCell<ConnectionManager>,
    ) -> RedisResult<ConnectionManager> {
        let conn = cell
            .get_or_try_init(|| {
                lanes
                    .client
                    .get_connection_manager_with_config(lanes.config.clone())
            })
            .await?;
        Ok(conn.clone())
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // The lane first: a task following a lane runs on dlock's thread.
        if let Some((lanes, cell)) = Self::lane(&self.lanes) {
            if let Some(conn) = cell.get() {
                let mut conn = conn.clone();
                return Box::pin(async move {
                    match conn.send_packed_command(cmd).await {
                        Err(e) if e.is_connection_dropped() => conn.send_packed_command(cmd).await,
                        answer => answer,
                    }
                });
            }
            return Box::pin(async move {
                let mut conn = Self::connected(lanes, &cell).await?;
                conn.send_packed_command(cmd).await
            });
        }
        if background::is_current() {
            return self.background.req_packed_command(cmd);
        }
        let (mut conn, cmd) = (self.background.clone(), cmd.clone());
        Box::pin(background::run(async move {
            conn.send_packed_command(&cmd).await
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if let Some((lanes, cell)) = Self::lane(&self.lanes) {
            return Box::pin(async move {
                let mut conn = Self::connected(lanes, &cell).await?;
                match conn.send_packed_commands(pipeline, offset, count).await {
                    Err(e) if e.is_connection_dropped() => {
                        conn.send_packed_commands(pipeline, offset, count).await
                    }
                    answer => answer,
                }
            });
        }
        if background::is_current() {
            return self.background.req_packed_commands(pipeline, offset, count);
        }
        let (mut conn, pipeline) = (self.background.clone(), pipeline.clone());
        Box::pin(background::run(async move {
            conn.send_packed_commands(&pipeline, offset, count).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.background.get_db()
    }
}

/// What a backend of one server talks to: that server, or the master a
/// Sentinel deployment names now (followed across failovers). Cheap to
/// clone: clones share the connection.
#[derive(Clone)]
pub(crate) enum Server {
    One(Connection),
    Followed(super::sentinel::Sentinel),
}

impl ConnectionLike for Server {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Server::One(c) => c.req_packed_command(cmd),
            Server::Followed(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Server::One(c) => c.req_packed_commands(pipeline, offset, count),
            Server::Followed(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Server::One(c) => c.get_db(),
            Server::Followed(c) => c.get_db(),
        }
    }
}
