//! A Cluster's connection, which a request left without an answer retires
//! (see `retiring.rs`), as one server's does.
//!
//! Why: `redis`'s cluster client reconnects to a node when it sees that
//! node's connection drop, and a request that times out is tried again on
//! the same connection. A flow that a NAT or a load balancer forgot drops
//! nothing, so every request timed out on it for good (tried here behind a
//! proxy that froze the flows: no lock within 20 s, where a new client
//! worked at once). So a request that times out, or finds no connection to
//! any node left (every one reset: `ClusterConnectionNotFound`, after which
//! the client did not recover), retires the whole cluster
//! connection (a connection per node and the slot map), and the next
//! request opens a new one from the URL's nodes, on dlock's background
//! runtime, where its driver lives.

use std::future::Future;
use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::RoutingInfo;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::backends::redis::transport::connection::Reconnects;
use crate::backends::redis::transport::retiring::{Numbered, Retiring};

/// A Cluster's connection, replaced after a request gets no answer in
/// time. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    conn: Arc<Retiring<ClusterConnection>>,
    client: Arc<ClusterClient>,
    /// Counts a cluster connection opened and a request that failed on
    /// one (see `Reconnects`; the client follows a failover inside itself,
    /// so a new master is seen here only through such a failure).
    reconnects: Reconnects,
}

impl ClusterConn {
    /// Connects to the Cluster on dlock's background runtime.
    pub(in crate::backends::redis) async fn open(
        client: ClusterClient,
        reconnects: &Reconnects,
    ) -> RedisResult<Self> {
        let client = Arc::new(client);
        let first = open_on_background(client.clone()).await?;
        Ok(ClusterConn {
            conn: Arc::new(Retiring::with(first)),
            client,
            reconnects: reconnects.clone(),
        })
    }

    /// `send` on the connection in use (a new one if it is retired); a
    /// request that times out retires it.
    async fn on<T, F>(&self, send: impl FnOnce(ClusterConnection) -> F) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let following = crate::backends::redis::transport::lanes::is_following();
        // The client is cloned only when a connection is opened, not per request.
        let reconnects = &self.reconnects;
        let open = || async move {
            let opened = open_on_background(self.client.clone()).await;
            reconnects.bump();
            opened
        };
        let Numbered { number, conn } = self.conn.get_or_open(open, following).await?;
        let answer = self.reconnects.after(send(conn).await);
        self.conn
            .check_by(number, answer, retires_the_cluster_connection)
    }

    /// `cmd` sent where `routing` says (a given node, every master).
    pub(crate) async fn route_command(
        &mut self,
        cmd: Cmd,
        routing: RoutingInfo,
    ) -> RedisResult<Value> {
        self.on(|mut c| async move { c.route_command(cmd, routing).await })
            .await
    }
}

/// Whether `e` leaves the cluster connection unusable: no answer in time
/// (see the module docs), or no connection left to any node (every node's
/// connection reset at once: the client library's own advice for it is to
/// start again from the URL's nodes).
fn retires_the_cluster_connection(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
}

/// A new cluster connection, whose driver runs on dlock's background
/// runtime.
async fn open_on_background(client: Arc<ClusterClient>) -> RedisResult<ClusterConnection> {
    crate::lease::background::run(async move { client.get_async_connection().await }).await
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.on(move |mut c| async move { c.req_packed_command(cmd).await }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.on(
                move |mut c| async move { c.req_packed_commands(pipeline, offset, count).await },
            ),
        )
    }

    fn get_db(&self) -> i64 {
        0
    }
}
