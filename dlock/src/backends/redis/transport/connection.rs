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

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::backends::redis::transport::lanes::PerRuntime;
use crate::backends::redis::transport::retiring::{Numbered, Retiring};
use crate::lease::background;

/// How many times a connection of one backend may have reached a server
/// process other than the one checked last: bumped when a connection is
/// opened to a server (a Sentinel switch's new master) or in place of a
/// retired one, when a request finds one broken (the `ConnectionManager` then
/// opens a new one, perhaps to a restarted server on the same address), and,
/// on RESP3, when the manager hears its connection close (it reconnects on
/// its own then, before any request fails). `eviction.rs` reads the server's
/// settings again when this moved. Cheap to clone: clones share the count.
///
/// Why not a hook in the client: `redis`'s `ConnectionManager` reconnects
/// inside itself and tells no one; a RESP2 connection reconnects only after
/// a request failed on it, which every request here sees (`Connection::on`).
/// Asking the server who it is (`INFO server`'s `run_id`) on every request
/// would cost a round trip each; this costs an atomic add per failure.
#[derive(Clone, Default)]
pub(crate) struct Reconnects(Arc<AtomicU64>);

impl Reconnects {
    /// The count now.
    pub(crate) fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// A connection may now reach another server process.
    pub(in crate::backends::redis) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// Bumps if `answer` failed in a way after which the connection is
    /// opened anew (broken, refused, no answer in time); returns `answer`.
    pub(in crate::backends::redis) fn after<T>(&self, answer: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &answer
            && (e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout())
        {
            self.bump();
        }
        answer
    }
}

/// A `ConnectionManager` whose driver and reconnects stay on dlock's
/// background runtime, and one per multi-thread runtime that makes
/// requests. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub(crate) struct Connection {
    background: Arc<Retiring<ConnectionManager>>,
    /// `None`: every request takes the background connection (Sentinel's
    /// masters: a failover replaces the connection, see `sentinel.rs`).
    lanes: Option<Arc<Lanes>>,
    opener: Arc<Opener>,
    db: i64,
}

/// What opens a new connection to the server.
struct Opener {
    client: redis::Client,
    config: ConnectionManagerConfig,
    reconnects: Reconnects,
}

impl Opener {
    /// Opens a connection whose driver runs where this is polled.
    async fn open(&self) -> RedisResult<ConnectionManager> {
        self.client
            .get_connection_manager_with_config(self.config.clone())
            .await
    }

    /// [`open`](Self::open) in place of `slot`'s connection: counted in
    /// `reconnects` when it replaces one. A lane's first connection is not
    /// counted: it reaches the server the backend's connection reaches (a
    /// restart that connection has not seen yet is counted when its next
    /// request, a renewal or a heartbeat, finds it broken), and counting it
    /// would read the server again at every runtime's first request.
    async fn open_in(&self, slot: &Retiring<ConnectionManager>) -> RedisResult<ConnectionManager> {
        let replacing = !slot.is_empty();
        let opened = self.open().await;
        if replacing {
            self.reconnects.bump();
        }
        opened
    }
}

/// The lanes' connections.
struct Lanes {
    conns: PerRuntime<Retiring<ConnectionManager>>,
}

impl Connection {
    /// Connects on the background runtime; with `lanes`, each multi-thread
    /// runtime that makes a request gets its own connection too.
    /// Every connection it opens, and every one a request finds broken,
    /// counts in `reconnects`.
    pub(crate) async fn open(
        client: redis::Client,
        mut config: ConnectionManagerConfig,
        lanes: bool,
        reconnects: &Reconnects,
    ) -> RedisResult<Self> {
        if client
            .get_connection_info()
            .redis_settings()
            .protocol()
            .supports_resp3()
        {
            // On RESP3 the manager reconnects as soon as it hears the
            // connection close, with no request failing: it says so here.
            let heard = reconnects.clone();
            config = config.set_push_sender(move |info: redis::PushInfo| {
                if info.kind == redis::PushKind::Disconnection {
                    heard.bump();
                }
                Ok::<(), ()>(())
            });
        }
        let lanes = lanes.then(|| {
            Arc::new(Lanes {
                conns: PerRuntime::default(),
            })
        });
        let db = client.get_connection_info().redis_settings().db();
        let opener = Arc::new(Opener {
            client,
            config,
            reconnects: reconnects.clone(),
        });
        let opening = opener.clone();
        let background = background::run(async move { opening.open().await }).await?;
        // A new server, perhaps (a Sentinel switch opens a connection anew).
        reconnects.bump();
        Ok(Connection {
            background: Arc::new(Retiring::with(background)),
            lanes,
            opener,
            db,
        })
    }

    /// Retires every connection (the background one and each lane's): the
    /// next request on each opens a new one. For a caller that bounds its
    /// requests by a timeout of its own, shorter than the response
    /// timeout, and so never sees one time out here: a Redlock round waits
    /// for each master only its per-node timeout.
    #[cfg(feature = "redlock")]
    pub(crate) fn retire_all(&self) {
        self.background.retire();
        if let Some(lanes) = &self.lanes {
            for lane in lanes.conns.all() {
                lane.retire();
            }
        }
    }

    /// The lane here, if it is not the background one: made (without a
    /// connection yet) on a runtime's first request. A task that follows a
    /// lane with no connection takes the background one: nothing went out
    /// on that lane for it to follow (or what did went on a connection
    /// that is retired).
    fn lane(&self) -> Option<Arc<Retiring<ConnectionManager>>> {
        let lanes = self.lanes.as_deref()?;
        // Once dlock is shut down, requests answer as the background
        // connection does (refused), not on a lane.
        if background::check().is_err() {
            return None;
        }
        let lane = lanes.conns.here(|_| Retiring::default())?;
        if lane.is_empty() && crate::backends::redis::transport::lanes::is_following() {
            return None;
        }
        Some(lane)
    }

    /// `send` on `slot`'s connection (opened here if it has none); on a
    /// lane (`resend`), a request that finds the connection dropped is sent
    /// once more, on the connection the manager opens anew (the background
    /// connection learns of a drop from the watchdog's renewals); a request
    /// that times out retires the connection.
    async fn on<T, F>(
        slot: &Retiring<ConnectionManager>,
        opener: &Opener,
        resend: bool,
        send: impl Fn(ConnectionManager) -> F,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let following = crate::backends::redis::transport::lanes::is_following();
        let Numbered { number, conn } =
            slot.get_or_open(|| opener.open_in(slot), following).await?;
        let counted = |answer| opener.reconnects.after(answer);
        let answer = match counted(send(conn.clone()).await) {
            Err(e) if resend && e.is_connection_dropped() => counted(send(conn).await),
            answer => answer,
        };
        slot.check(number, answer)
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let send =
            move |mut conn: ConnectionManager| async move { conn.send_packed_command(cmd).await };
        // The lane first: a task following a lane runs on dlock's thread.
        let opener = &*self.opener;
        if let Some(lane) = self.lane() {
            return Box::pin(async move { Self::on(&lane, opener, true, send).await });
        }
        let slot = &*self.background;
        if background::is_current() {
            return Box::pin(Self::on(slot, opener, false, send));
        }
        let (slot, opener, cmd) = (self.background.clone(), self.opener.clone(), cmd.clone());
        Box::pin(background::run(async move {
            let send = |mut conn: ConnectionManager| {
                let cmd = &cmd;
                async move { conn.send_packed_command(cmd).await }
            };
            Self::on(&slot, &opener, false, send).await
        }))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let send = move |mut conn: ConnectionManager| async move {
            conn.send_packed_commands(pipeline, offset, count).await
        };
        let opener = &*self.opener;
        if let Some(lane) = self.lane() {
            return Box::pin(async move { Self::on(&lane, opener, true, send).await });
        }
        let slot = &*self.background;
        if background::is_current() {
            return Box::pin(Self::on(slot, opener, false, send));
        }
        let (slot, opener, pipeline) = (
            self.background.clone(),
            self.opener.clone(),
            pipeline.clone(),
        );
        Box::pin(background::run(async move {
            let send = |mut conn: ConnectionManager| {
                let pipeline = &pipeline;
                async move { conn.send_packed_commands(pipeline, offset, count).await }
            };
            Self::on(&slot, &opener, false, send).await
        }))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}
