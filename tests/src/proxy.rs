//! A TCP fault proxy between a client under test and a real server, on loopback only.
//!
//! `FaultProxy::start(upstream)` listens on `127.0.0.1:<free port>`; point the client at
//! [`FaultProxy::addr`] instead of the server. Its mode can be changed at any time:
//!
//! - [`FaultProxy::pass`]: bytes are forwarded both ways (the default).
//! - [`FaultProxy::blackhole`]: every connection, current and new, stays open but all bytes
//!   in both directions are read and **dropped** (not delayed): a silent network partition.
//!   New connections are accepted and connected upstream, then blackholed too. Bytes dropped
//!   are lost for good, so after `pass()` an old connection's protocol stream is usually
//!   broken; clients are expected to time out and reconnect, as after a real partition.
//! - [`FaultProxy::drop_replies`]: bytes from the client reach the server, bytes from the
//!   server are read and dropped: the server runs every request and the client hears nothing,
//!   as when an answer is lost after the request was written. Connections stay open.
//! - [`FaultProxy::delay_replies`]: bytes from the client reach the server at once, bytes
//!   from the server reach the client after the given delay, in order: a slow path back, as
//!   when the server ran a request at once and its answer arrives late.
//! - [`FaultProxy::reset`]: every current connection is closed abruptly (`SO_LINGER` 0, so the
//!   peer sees a TCP RST on both the client and the upstream side), and while the mode lasts
//!   each new connection is accepted and immediately reset too (the peer sees a connection
//!   reset or EOF on its first read/write, not a refused connect). `pass()` ends it.
//! - [`FaultProxy::hold`]: nothing is read from either side while the mode lasts, so bytes
//!   wait in the sockets' buffers and are delivered late, in order, once `pass()` is set: a
//!   network that stalls (a paused VM, a congested link) and then recovers. New connections
//!   are accepted and held too.
//! - [`FaultProxy::freeze_flows`]: every connection open now is silently dead for good (its
//!   bytes are dropped both ways, whatever the mode later), while new connections pass: a NAT
//!   or load balancer that forgot the flows. Not a mode: it applies to the flows of the
//!   moment, and the mode stays what it was.
//! - [`FaultProxy::hold_flows`]: every connection open now is held as [`FaultProxy::hold`]
//!   holds (nothing read, bytes delivered late) until [`FaultProxy::release_flows`], while new
//!   connections pass: one path that stalls and recovers after the client moved to another
//!   connection, so that what it sent on the old one lands after what it sent since.
//!
//! Dropping the proxy stops the listener and every connection task. Nothing busy-loops: each
//! task waits on socket readiness or on a mode change.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward both ways.
    Pass,
    /// Keep connections open, drop all bytes.
    Blackhole,
    /// Forward the client's bytes, drop the server's.
    DropReplies,
    /// Forward the client's bytes at once, the server's after this delay.
    DelayReplies(Duration),
    /// Reset current connections and every new one.
    Reset,
    /// Read nothing from either side: bytes wait and are delivered once the mode changes.
    Hold,
}

/// A TCP proxy with switchable faults, stopped on drop.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    accepted: Arc<AtomicUsize>,
    /// Connections numbered below this are frozen for good (`freeze_flows`).
    frozen_below: Arc<AtomicUsize>,
    /// Connections numbered below this are held (`hold_flows`) until `release_flows`.
    held_below: Arc<AtomicUsize>,
    listener: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` in [`ProxyMode::Pass`]. Must be called inside a tokio
    /// runtime (its tasks run there). Panics if it cannot bind a loopback port.
    pub async fn start(upstream: SocketAddr) -> Self {
        match Self::try_start(upstream).await {
            Ok(proxy) => proxy,
            Err(e) => panic!("fault proxy to {upstream}: {e}"),
        }
    }

    /// Fallible [`FaultProxy::start`]. `upstream` must be a loopback address.
    pub async fn try_start(upstream: SocketAddr) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the fault proxy only targets loopback addresses, not {upstream}"),
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Pass);
        let accepted = Arc::new(AtomicUsize::new(0));
        let frozen_below = Arc::new(AtomicUsize::new(0));
        let held_below = Arc::new(AtomicUsize::new(0));
        let listener = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            Arc::clone(&accepted),
            [Arc::clone(&frozen_below), Arc::clone(&held_below)],
        ));
        Ok(Self {
            addr,
            upstream,
            mode,
            accepted,
            frozen_below,
            held_below,
            listener,
        })
    }

    /// The address clients connect to (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// How many client connections the proxy has accepted so far (in any mode).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Forward traffic both ways again.
    pub fn pass(&self) {
        self.set_mode(ProxyMode::Pass);
    }

    /// Silently drop all bytes of current and new connections, keeping them open.
    pub fn blackhole(&self) {
        self.set_mode(ProxyMode::Blackhole);
    }

    /// Let requests through but drop every answer, keeping connections open.
    pub fn drop_replies(&self) {
        self.set_mode(ProxyMode::DropReplies);
    }

    /// Let requests through at once and deliver every answer `delay` late, in order.
    pub fn delay_replies(&self, delay: Duration) {
        self.set_mode(ProxyMode::DelayReplies(delay));
    }

    /// Reset all current connections and each new one until [`FaultProxy::pass`].
    pub fn reset(&self) {
        self.set_mode(ProxyMode::Reset);
    }

    /// Read nothing from either side until the mode changes: bytes are delivered late.
    pub fn hold(&self) {
        self.set_mode(ProxyMode::Hold);
    }

    /// Makes every connection open now silently dead for good (bytes dropped both ways, no
    /// FIN, no RST), while new connections pass as the mode says.
    pub fn freeze_flows(&self) {
        self.frozen_below
            .fetch_max(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
        // Wakes the connection tasks, so that none forwards another byte.
        self.mode.send_modify(|_| {});
    }

    /// Holds every connection open now (nothing read from either side, bytes delivered
    /// late) until [`FaultProxy::release_flows`], while new connections pass as the mode says.
    pub fn hold_flows(&self) {
        self.held_below
            .fetch_max(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
        self.mode.send_modify(|_| {});
    }

    /// Ends [`FaultProxy::hold_flows`]: the held connections deliver what waited, in order.
    pub fn release_flows(&self) {
        self.held_below.store(0, Ordering::SeqCst);
        self.mode.send_modify(|_| {});
    }

    /// Sets `mode` (the named methods are shorthands).
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Connection tasks end when they see the mode channel closed (the sender is dropped
        // right after this); the accept loop is aborted outright.
        self.listener.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    accepted: Arc<AtomicUsize>,
    [frozen_below, held_below]: [Arc<AtomicUsize>; 2],
) {
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let Ok((client, _)) = conn else { continue };
                let number = accepted.fetch_add(1, Ordering::SeqCst);
                if *mode.borrow() == ProxyMode::Reset {
                    abort_connection(&client);
                    continue;
                }
                let flow = Flow {
                    number,
                    frozen_below: frozen_below.clone(),
                    held_below: held_below.clone(),
                };
                tokio::spawn(connection(client, upstream, mode.clone(), flow));
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return; // proxy dropped
                }
            }
        }
    }
}

/// Sets `SO_LINGER` 0 so that dropping the socket sends RST instead of FIN.
fn abort_connection(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// One connection, and whether [`FaultProxy::freeze_flows`] froze it or
/// [`FaultProxy::hold_flows`] holds it.
struct Flow {
    number: usize,
    frozen_below: Arc<AtomicUsize>,
    held_below: Arc<AtomicUsize>,
}

impl Flow {
    fn frozen(&self) -> bool {
        self.number < self.frozen_below.load(Ordering::SeqCst)
    }

    fn held(&self) -> bool {
        self.number < self.held_below.load(Ordering::SeqCst)
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
    flow: Flow,
) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        abort_connection(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_server = vec![0u8; 16 * 1024];
    // Answers held back by `DelayReplies`, each with when it is due; while any is held,
    // later answers queue behind it, so the order is kept whatever the mode.
    let mut delayed: VecDeque<(tokio::time::Instant, Vec<u8>)> = VecDeque::new();
    let reset = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        loop {
            let current = *mode.borrow_and_update();
            if current == ProxyMode::Reset {
                break true;
            }
            let next_due = delayed.front().map(|(due, _)| *due);
            let reading = current != ProxyMode::Hold && !flow.held();
            tokio::select! {
                n = client_read.read(&mut from_client), if reading => match n {
                    Ok(0) | Err(_) => {
                        let _ = server_write.shutdown().await;
                        break false;
                    }
                    Ok(n) => {
                        // Bytes read just before a switch to `Hold` are delivered: a hold
                        // delays what it has not read, it never drops (dropped, a request
                        // went unanswered and shifted every later answer by one).
                        let forward = !flow.frozen() && matches!(
                            *mode.borrow(),
                            ProxyMode::Pass
                                | ProxyMode::DropReplies
                                | ProxyMode::DelayReplies(_)
                                | ProxyMode::Hold
                        );
                        if forward && server_write.write_all(&from_client[..n]).await.is_err()
                        {
                            break true;
                        }
                    }
                },
                n = server_read.read(&mut from_server), if reading => match n {
                    Ok(0) | Err(_) => {
                        let _ = client_write.shutdown().await;
                        break false;
                    }
                    Ok(n) => {
                        if flow.frozen() {
                            continue;
                        }
                        let now = tokio::time::Instant::now();
                        let due = match *mode.borrow() {
                            ProxyMode::DelayReplies(delay) => Some(now + delay),
                            // Read just before a switch to `Hold`: delivered (see above).
                            ProxyMode::Pass | ProxyMode::Hold if !delayed.is_empty() => Some(now),
                            ProxyMode::Pass | ProxyMode::Hold => None,
                            _ => continue,
                        };
                        match due {
                            Some(due) => {
                                let due = delayed.back().map_or(due, |(last, _)| due.max(*last));
                                delayed.push_back((due, from_server[..n].to_vec()));
                            }
                            None => {
                                if client_write.write_all(&from_server[..n]).await.is_err() {
                                    break true;
                                }
                            }
                        }
                    }
                },
                () = sleep_until_due(next_due), if reading => {
                    if let Some((_, bytes)) = delayed.pop_front() {
                        if client_write.write_all(&bytes).await.is_err() {
                            break true;
                        }
                    }
                },
                changed = mode.changed() => {
                    if changed.is_err() {
                        break true; // proxy dropped: cut everything
                    }
                }
            }
        }
    };
    if reset {
        abort_connection(&client);
        abort_connection(&server);
    }
}

/// Sleeps until `due`, or for ever when nothing is held back.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
