//! ZooKeeper for the tests: a standalone server, or an ensemble on loopback.
//!
//! The server is the Debian `zookeeper` jar run directly with `java ... QuorumPeerMain
//! zoo.cfg` (no init scripts), with the `slf4j-simple` binding on the class path. Each node
//! has a temp dir (`zoo.cfg`, `data/`, `zookeeper.log`), a free client port on 127.0.0.1
//! (plus quorum and election ports in an ensemble), the admin HTTP server off, and the
//! four-letter-word commands on. Readiness is the `srvr` command answering with a `Mode:`
//! line (`standalone`, or `leader` / `follower`), probed every 20 ms for up to 30 s: the JVM
//! is slow to start.
//!
//! `tickTime` defaults to 500 ms here (ZooKeeper's own default is 2000 ms), so the minimum
//! session timeout is 1 s and tests of session expiry stay short; see [`ZkOptions`].

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::accessors::{member_accessors, single_server_accessors};
use crate::servers::control::ServerControl;
use crate::servers::leader;
use crate::servers::ports::{free_port, retry_port_clash};
use crate::servers::process::{require_binary, require_file, ProcessSpec, ServerProcess};

/// Debian packages that provide the ZooKeeper jars, Java and the slf4j binding.
pub const ZK_PACKAGES: &str = "zookeeper libslf4j-java";
/// The ZooKeeper server jar (its manifest class path names its dependencies).
pub const ZK_JAR: &str = "/usr/share/java/zookeeper.jar";
/// The slf4j binding that makes ZooKeeper log to stderr.
pub const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Upper bound for a node (or a whole ensemble) to serve.
pub const ZK_READY_LIMIT: Duration = Duration::from_secs(30);
/// Upper bound for one four-letter-word exchange.
const FOUR_LETTER_LIMIT: Duration = Duration::from_secs(2);

/// Timing settings of a ZooKeeper server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZkOptions {
    /// `tickTime` in ms (default 500). ZooKeeper's session timeouts are bounded by it.
    pub tick_time_ms: u32,
    /// `minSessionTimeout` in ms (default 2 ticks): a client asking for less gets this.
    pub min_session_timeout_ms: u32,
    /// `maxSessionTimeout` in ms (default 60 000): a client asking for more gets this.
    pub max_session_timeout_ms: u32,
    /// `syncLimit` in ticks (default 5), ensembles only: how long a follower that hears
    /// nothing from its leader goes on serving its clients' reads before it gives up on the
    /// leader and drops them.
    pub sync_limit: u32,
    /// `-Djute.maxbuffer` in bytes (`None`: the server's default, 1 MiB): the largest
    /// request the server takes; past it, it closes the connection ("Len error").
    pub jute_max_buffer: Option<u32>,
    /// `-Dznode.container.checkIntervalMs` (`None`: the server's default,
    /// 60 000): how often the server deletes empty container nodes (dlock's
    /// key directories). When set, `-Dznode.container.maxPerMinute` is
    /// lifted too (default 10 000 deletions a minute), so a test of many
    /// keys sees every directory go within one interval or two.
    pub container_check_interval_ms: Option<u32>,
}

impl Default for ZkOptions {
    fn default() -> Self {
        Self {
            tick_time_ms: 500,
            min_session_timeout_ms: 1000,
            max_session_timeout_ms: 60_000,
            sync_limit: 5,
            jute_max_buffer: None,
            container_check_interval_ms: None,
        }
    }
}

/// The Netty jars a TLS server needs beyond those the ZooKeeper jar's
/// manifest names.
const NETTY_JARS: [&str; 3] = [
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/netty-resolver.jar",
    "/usr/share/java/netty-transport-native-unix-common.jar",
];

/// How a server serves TLS: a `secureClientPort` with Netty, the server's
/// certificate and key, and the CA it trusts for client certificates.
#[derive(Debug, Clone)]
pub struct ZkTls {
    /// The server's certificate (PEM).
    pub cert: std::path::PathBuf,
    /// The server's private key (PEM, PKCS#8).
    pub key: std::path::PathBuf,
    /// The CA client certificates must be signed by (PEM).
    pub ca: std::path::PathBuf,
    /// Whether a client must present a certificate (`ssl.clientAuth=need`).
    pub need_client_cert: bool,
}

/// One ZooKeeper node on 127.0.0.1, stopped on drop. Started alone it runs standalone;
/// [`ZkEnsemble`] holds several.
#[derive(Debug)]
pub struct ZkServer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    id: usize,
    client_port: u16,
    /// The TLS port, for a server started with [`ZkServer::start_tls`].
    secure_port: Option<u16>,
    dir: TempDir,
}

/// Ports of an ensemble member to be, chosen before any member is spawned.
#[derive(Debug, Clone, Copy)]
struct NodePlan {
    id: usize,
    client_port: u16,
    quorum_port: u16,
    election_port: u16,
}

impl ZkServer {
    /// Starts a standalone server with [`ZkOptions::default`]. Panics with the harness error
    /// (e.g. how to install ZooKeeper) if it cannot.
    #[track_caller]
    pub fn start() -> Self {
        Self::start_with(ZkOptions::default())
    }

    /// Starts a standalone server with these timings. Panics on failure.
    #[track_caller]
    pub fn start_with(options: ZkOptions) -> Self {
        Self::try_start_with(options).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`ZkServer::start_with`].
    pub fn try_start_with(options: ZkOptions) -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_once(options))
    }

    fn try_start_once(options: ZkOptions) -> HarnessResult<Self> {
        let plan = NodePlan {
            id: 1,
            client_port: free_port()?,
            quorum_port: 0,
            election_port: 0,
        };
        let mut server = Self::spawn(plan, &[], options)?;
        server.wait_ready()?;
        Ok(server)
    }

    /// Starts a standalone server that also serves TLS on a
    /// `secureClientPort` (Netty), with `tls`'s certificate; the plain port
    /// stays for the readiness probe. Panics on failure.
    #[track_caller]
    pub fn start_tls(tls: &ZkTls) -> Self {
        retry_port_clash(|| {
            let plan = NodePlan {
                id: 1,
                client_port: free_port()?,
                quorum_port: 0,
                election_port: 0,
            };
            let secure_port = free_port()?;
            let mut server =
                Self::spawn_with(plan, &[], ZkOptions::default(), Some((tls, secure_port)))?;
            server.wait_ready()?;
            // The TLS port's factory starts after the plain one: a client that connects as
            // soon as `srvr` answers may find nothing listening there yet.
            let secure = SocketAddr::from(([127, 0, 0, 1], secure_port));
            server
                .process
                .wait_until("the TLS port accepting", ZK_READY_LIMIT, || {
                    TcpStream::connect_timeout(&secure, Duration::from_millis(200)).is_ok()
                })?;
            Ok(server)
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The TLS port of a server started with [`ZkServer::start_tls`].
    pub fn secure_port(&self) -> Option<u16> {
        self.secure_port
    }

    fn spawn(plan: NodePlan, ensemble: &[NodePlan], options: ZkOptions) -> HarnessResult<Self> {
        Self::spawn_with(plan, ensemble, options, None)
    }

    fn spawn_with(
        plan: NodePlan,
        ensemble: &[NodePlan],
        options: ZkOptions,
        tls: Option<(&ZkTls, u16)>,
    ) -> HarnessResult<Self> {
        let java = require_binary("java", ZK_PACKAGES)?;
        let zk_jar = require_file(Path::new(ZK_JAR), ZK_PACKAGES)?;
        let slf4j = require_file(Path::new(SLF4J_SIMPLE_JAR), ZK_PACKAGES)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-zk-{}-", plan.client_port))
            .tempdir()
            .context(|| "create temp dir for zookeeper".to_string())?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).context(|| format!("create {}", data.display()))?;
        let cfg_path = dir.path().join("zoo.cfg");
        let mut cfg = zoo_cfg(&plan, ensemble, &data, options);
        let mut class_path = format!("{}:{}", zk_jar.display(), slf4j.display());
        if let Some((tls, port)) = tls {
            for jar in NETTY_JARS {
                let jar = require_file(Path::new(jar), ZK_PACKAGES)?;
                let _ = write!(class_path, ":{}", jar.display());
            }
            // ZooKeeper reads a PEM key store as one file: key, then certificate.
            let key_store = dir.path().join("server.pem");
            let read =
                |p: &Path| std::fs::read_to_string(p).context(|| format!("read {}", p.display()));
            std::fs::write(
                &key_store,
                format!("{}{}", read(&tls.key)?, read(&tls.cert)?),
            )
            .context(|| format!("write {}", key_store.display()))?;
            cfg.push_str(&tls_cfg(tls, port, &key_store));
        }
        std::fs::write(&cfg_path, cfg).context(|| format!("write {}", cfg_path.display()))?;
        if !ensemble.is_empty() {
            std::fs::write(data.join("myid"), format!("{}\n", plan.id))
                .context(|| "write myid".to_string())?;
        }
        let spec = ProcessSpec::new(
            format!("zookeeper {} 127.0.0.1:{}", plan.id, plan.client_port),
            java,
            dir.path().join("zookeeper.log"),
        )
        .args(
            options
                .jute_max_buffer
                .map(|bytes| format!("-Djute.maxbuffer={bytes}")),
        )
        .args(
            options
                .container_check_interval_ms
                .into_iter()
                .flat_map(|ms| {
                    [
                        format!("-Dznode.container.checkIntervalMs={ms}"),
                        "-Dznode.container.maxPerMinute=10000000".to_owned(),
                    ]
                }),
        )
        .args([
            "-Xms64m",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.net.preferIPv4Stack=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        ])
        // The secure port needs Netty (the plain one then runs on it too).
        .args(tls.map(|_| {
            "-Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"
        }))
        .arg("-cp")
        .arg(class_path)
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(&cfg_path)
        .cwd(dir.path());
        let process = ServerProcess::spawn(spec)?;
        Ok(Self {
            process,
            id: plan.id,
            client_port: plan.client_port,
            secure_port: tls.map(|(_, port)| port),
            dir,
        })
    }

    /// The server id (`myid`; 1 for a standalone server).
    pub fn id(&self) -> usize {
        self.id
    }

    single_server_accessors!(client_port);

    /// `127.0.0.1:PORT`, as ZooKeeper clients take it.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// `zk://127.0.0.1:PORT`, the dlock URL of this server alone.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    /// Sends a four-letter-word command (`srvr`, `stat`, `mntr`, `ruok`, `cons`, ...) and
    /// returns the answer; bounded to 2 s.
    pub fn four_letter(&self, command: &str) -> HarnessResult<String> {
        four_letter(self.addr(), command)
    }

    /// The `Mode:` this node reports (`standalone`, `leader`, `follower`), or `None` if it
    /// does not serve right now.
    pub fn mode(&self) -> Option<String> {
        mode_of(self.addr())
    }
}

impl ServerControl for ZkServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    fn wait_ready(&mut self) -> HarnessResult<()> {
        let addr = self.addr();
        self.process
            .wait_until("serving (srvr shows Mode:)", ZK_READY_LIMIT, || {
                mode_of(addr).is_some()
            })
    }
}

/// A ZooKeeper ensemble of several nodes on loopback, stopped on drop.
#[derive(Debug)]
pub struct ZkEnsemble {
    nodes: Vec<ZkServer>,
}

impl ZkEnsemble {
    /// Starts an ensemble of `n` nodes (3 or 5 make sense) and waits until every node serves
    /// as leader or follower. Panics on failure.
    #[track_caller]
    pub fn start(n: usize) -> Self {
        Self::try_start_with(n, ZkOptions::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`ZkEnsemble::start`] with these timings.
    pub fn try_start_with(n: usize, options: ZkOptions) -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_once(n, options))
    }

    fn try_start_once(n: usize, options: ZkOptions) -> HarnessResult<Self> {
        if n < 2 {
            return Err(HarnessError::new(format!(
                "a ZooKeeper ensemble needs at least 2 nodes, asked for {n}; use ZkServer"
            )));
        }
        let plans = (1..=n)
            .map(|id| {
                Ok(NodePlan {
                    id,
                    client_port: free_port()?,
                    quorum_port: free_port()?,
                    election_port: free_port()?,
                })
            })
            .collect::<HarnessResult<Vec<_>>>()?;
        let mut nodes = Vec::with_capacity(n);
        for plan in &plans {
            nodes.push(ZkServer::spawn(*plan, &plans, options)?);
        }
        let mut ensemble = Self { nodes };
        for node in &mut ensemble.nodes {
            node.wait_ready()?;
        }
        Ok(ensemble)
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZkServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zk://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        format!("zk://{}", self.connect_string())
    }

    member_accessors!(nodes: ZkServer, node, node_mut, nodes);

    /// Index of the node reporting `Mode: leader` now, if any.
    pub fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.process().pid().is_some()
                && !n.process().is_paused()
                && n.mode().as_deref() == Some("leader")
        })
    }

    /// Waits (bounded) until some node is leader, e.g. after killing the old one.
    pub fn wait_for_leader(&self, limit: Duration) -> HarnessResult<usize> {
        leader::wait_for_leader(
            limit,
            || self.leader(),
            || format!("ZooKeeper leader among {}", self.connect_string()),
        )
    }
}

fn zoo_cfg(plan: &NodePlan, ensemble: &[NodePlan], data: &Path, options: ZkOptions) -> String {
    let mut cfg = String::new();
    let _ = writeln!(cfg, "tickTime={}", options.tick_time_ms);
    let _ = writeln!(cfg, "minSessionTimeout={}", options.min_session_timeout_ms);
    let _ = writeln!(cfg, "maxSessionTimeout={}", options.max_session_timeout_ms);
    let _ = writeln!(cfg, "initLimit=10");
    let _ = writeln!(cfg, "syncLimit={}", options.sync_limit);
    let _ = writeln!(cfg, "dataDir={}", data.display());
    let _ = writeln!(cfg, "clientPort={}", plan.client_port);
    let _ = writeln!(cfg, "clientPortAddress=127.0.0.1");
    let _ = writeln!(cfg, "maxClientCnxns=0");
    let _ = writeln!(cfg, "admin.enableServer=false");
    let _ = writeln!(cfg, "4lw.commands.whitelist=*");
    for node in ensemble {
        let _ = writeln!(
            cfg,
            "server.{}=127.0.0.1:{}:{}",
            node.id, node.quorum_port, node.election_port
        );
    }
    cfg
}

/// The `zoo.cfg` lines of a TLS port: Netty, PEM key and trust stores.
fn tls_cfg(tls: &ZkTls, port: u16, key_store: &Path) -> String {
    let mut cfg = String::new();
    let _ = writeln!(cfg, "secureClientPort={port}");
    let _ = writeln!(cfg, "secureClientPortAddress=127.0.0.1");
    let _ = writeln!(cfg, "ssl.keyStore.location={}", key_store.display());
    let _ = writeln!(cfg, "ssl.keyStore.type=PEM");
    let _ = writeln!(cfg, "ssl.trustStore.location={}", tls.ca.display());
    let _ = writeln!(cfg, "ssl.trustStore.type=PEM");
    let auth = if tls.need_client_cert { "need" } else { "none" };
    let _ = writeln!(cfg, "ssl.clientAuth={auth}");
    cfg
}

fn four_letter(addr: SocketAddr, command: &str) -> HarnessResult<String> {
    let mut stream = TcpStream::connect_timeout(&addr, FOUR_LETTER_LIMIT)
        .context(|| format!("connect to zookeeper {addr}"))?;
    stream
        .set_read_timeout(Some(FOUR_LETTER_LIMIT))
        .and_then(|()| stream.set_write_timeout(Some(FOUR_LETTER_LIMIT)))
        .and_then(|()| stream.write_all(command.as_bytes()))
        .context(|| format!("send {command} to zookeeper {addr}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .context(|| format!("read {command} answer from zookeeper {addr}"))?;
    Ok(answer)
}

fn mode_of(addr: SocketAddr) -> Option<String> {
    let answer = four_letter(addr, "srvr").ok()?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode:"))
        .map(|mode| mode.trim().to_string())
}
