//! One ZooKeeper session, and the tokio runtime that carries it.
//!
//! `zookeeper-client` runs a session's connection (requests, heartbeats) as a
//! task spawned on the runtime that opened it. Requests from any other
//! runtime reach that task through a channel, so guards taken on any runtime
//! share the backend's session; but work that must outlive its caller's
//! runtime (deleting a node whose lease ran out, a background delete) has to
//! run where the session runs. The backend opens sessions on dlock's
//! background runtime, which always runs; this module keeps that runtime
//! with the session all the same, and notices when it is gone, for the one
//! case where a session runs elsewhere (the background runtime could not be
//! started): then the session's task died with its runtime, the server will
//! expire the session (and its nodes) after the session timeout, and the
//! backend must open another one.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::runtime::Handle;
use zookeeper_client::{Client, Connector, Error as ZkError};

/// A session and the runtime its connection task runs on.
pub(super) struct Session {
    pub(super) client: Client,
    /// The runtime `zookeeper-client` spawned the session's task on.
    runtime: Handle,
    /// Cleared when that runtime drops its tasks (it shut down).
    alive: Arc<AtomicBool>,
    /// Dropped with the session: ends the task that watches the runtime.
    _watching: tokio::sync::oneshot::Sender<()>,
}

/// Clears the flag when dropped: by the runtime's shutdown, which drops
/// every task it holds, or when the session goes.
struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// How many times a session is tried when no host could be connected to
/// (the connector fails eagerly, after one pass over the hosts), and the
/// first pause between tries, doubled after each. A few connections cut
/// short (a reset, a TLS handshake a loaded server dropped: seen in
/// parallel test runs right after another client's session opened, three
/// times in a row once, 100 ms apart) are then not the caller's error,
/// while a server that is down or refuses the handshake still fails within
/// about 1.5 s (pauses of 100, 200, 400 and 800 ms).
const OPEN_ATTEMPTS: u32 = 5;
const OPEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// One pass over the hosts of `connect_string`, over TLS if `secure`.
async fn connect(
    connector: Connector,
    connect_string: &str,
    secure: bool,
) -> Result<Client, ZkError> {
    #[cfg(feature = "tls")]
    if secure {
        return connector.secure_connect(connect_string).await;
    }
    // Without the feature, the URL parser refuses `zks://`.
    #[cfg(not(feature = "tls"))]
    debug_assert!(!secure, "zks:// without the tls feature");
    connector.connect(connect_string).await
}

impl Session {
    /// Opens a session, over TLS to every server if `secure` (`zks://`;
    /// the connector then carries the TLS options); `runtime` must be the
    /// current runtime, the one `zookeeper-client` spawns the session's
    /// task on (dlock's background runtime, see `ZooKeeperBackend::session`).
    pub(super) async fn open(
        runtime: Handle,
        connector: Connector,
        connect_string: &str,
        secure: bool,
    ) -> Result<Self, ZkError> {
        let mut attempt = 1;
        let mut pause = OPEN_PAUSE;
        let client = loop {
            match connect(connector.clone(), connect_string, secure).await {
                Err(ZkError::NoHosts) if attempt < OPEN_ATTEMPTS => {
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                answer => break answer?,
            }
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (watching, session_gone) = tokio::sync::oneshot::channel::<()>();
        let flag = ClearOnDrop(alive.clone());
        runtime.spawn(async move {
            let _flag = flag;
            // Returns when the session is dropped; the runtime's shutdown
            // drops this task (and the flag) first.
            let _ = session_gone.await;
        });
        Ok(Session {
            client,
            runtime,
            alive,
            _watching: watching,
        })
    }

    /// Whether the runtime that carries the session still runs. If not, the
    /// session's task is gone: nothing is sent any more, and the server
    /// expires the session one session timeout after its last heartbeat.
    pub(super) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Whether new work can use the session: its runtime runs, and it has
    /// not expired, been closed or failed authentication.
    pub(super) fn is_usable(&self) -> bool {
        self.is_alive() && !self.client.state().is_terminated()
    }

    /// The runtime the session runs on.
    pub(super) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    /// Runs `work` on the session's runtime, whatever runtime (if any) the
    /// caller is on. If that runtime is gone, `work` is dropped unrun; the
    /// session's nodes then end with the session.
    pub(super) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        drop(self.runtime.spawn(work));
    }
}
