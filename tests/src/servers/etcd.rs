//! etcd for the tests: one member, or a cluster of members on loopback.
//!
//! Each member has its own temp data dir, a free client port and a free peer port on
//! 127.0.0.1, logs to `etcd.log` in its dir, and is stopped when dropped. Readiness is
//! `etcdctl endpoint health` on the member's own endpoint (which needs a quorum, so a
//! cluster's members are all spawned before any is waited for). A stopped or killed member
//! restarts on the same ports from the same data dir (the cluster flags are then ignored by
//! etcd, which reads its membership from the data dir).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Context, HarnessError, HarnessResult};
use crate::servers::accessors::{member_accessors, single_server_accessors};
use crate::servers::control::ServerControl;
use crate::servers::leader;
use crate::servers::ports::{free_port, retry_port_clash};
use crate::servers::process::{
    require_binary, run_command, CommandOutput, ProcessSpec, ServerProcess,
};
use crate::tls::TestCerts;

/// Debian packages that provide `etcd` and `etcdctl`.
pub const ETCD_PACKAGES: &str = "etcd-server etcd-client";
/// Upper bound for a member (or a whole cluster) to become healthy.
pub const ETCD_READY_LIMIT: Duration = Duration::from_secs(20);
/// Upper bound for one `etcdctl` run.
const CTL_LIMIT: Duration = Duration::from_secs(10);
/// Upper bound for one health probe.
const PROBE_LIMIT: Duration = Duration::from_secs(3);

/// One etcd member process on 127.0.0.1, stopped on drop. Started alone it is a
/// single-member cluster; [`EtcdCluster`] holds several.
#[derive(Debug)]
pub struct EtcdServer {
    // Field order matters: the process must stop before the temp dir is removed.
    process: ServerProcess,
    name: String,
    client_port: u16,
    peer_port: u16,
    ctl: Ctl,
    certs: Option<TestCerts>,
    dir: TempDir,
}

/// How to run `etcdctl` against members: the binary and, for TLS members, the CA to trust.
#[derive(Debug, Clone)]
struct Ctl {
    path: PathBuf,
    cacert: Option<PathBuf>,
}

/// Ports and name of a member to be, chosen before any member is spawned.
struct MemberPlan {
    name: String,
    client_port: u16,
    peer_port: u16,
}

impl MemberPlan {
    fn new(name: String) -> HarnessResult<Self> {
        Ok(Self {
            name,
            client_port: free_port()?,
            peer_port: free_port()?,
        })
    }

    fn peer_url(&self) -> String {
        format!("{}=http://127.0.0.1:{}", self.name, self.peer_port)
    }
}

impl EtcdServer {
    /// Starts a single-member etcd. Panics with the harness error (e.g. how to install etcd)
    /// if it cannot.
    #[track_caller]
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`EtcdServer::start`].
    pub fn try_start() -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_single(false))
    }

    fn try_start_single(tls: bool) -> HarnessResult<Self> {
        let plan = MemberPlan::new("m1".to_string())?;
        let cluster = plan.peer_url();
        let mut member = Self::spawn(plan, &cluster, "dlock-etcd-1", tls)?;
        member.wait_ready()?;
        Ok(member)
    }

    /// Starts a single-member etcd that serves clients over TLS only (`https://`, a
    /// throwaway CA, no client certificates required); [`EtcdServer::url`] is then
    /// `etcds://127.0.0.1:PORT` and [`EtcdServer::ca_cert_path`] the CA to trust. Panics on
    /// failure.
    #[track_caller]
    pub fn start_tls() -> Self {
        Self::try_start_tls().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`EtcdServer::start_tls`].
    pub fn try_start_tls() -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_single(true))
    }

    fn spawn(
        plan: MemberPlan,
        initial_cluster: &str,
        token: &str,
        tls: bool,
    ) -> HarnessResult<Self> {
        let etcd = require_binary("etcd", ETCD_PACKAGES)?;
        let etcdctl = require_binary("etcdctl", ETCD_PACKAGES)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("dlock-etcd-{}-", plan.client_port))
            .tempdir()
            .context(|| "create temp dir for etcd".to_string())?;
        let certs = if tls {
            Some(TestCerts::generate(dir.path())?)
        } else {
            None
        };
        let scheme = if tls { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", plan.client_port);
        let peer_url = format!("http://127.0.0.1:{}", plan.peer_port);
        let mut spec = ProcessSpec::new(
            format!("etcd {} 127.0.0.1:{}", plan.name, plan.client_port),
            etcd,
            dir.path().join("etcd.log"),
        )
        .arg("--name")
        .arg(&plan.name)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--listen-client-urls")
        .arg(&client_url)
        .arg("--advertise-client-urls")
        .arg(&client_url)
        .arg("--listen-peer-urls")
        .arg(&peer_url)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--initial-cluster")
        .arg(initial_cluster)
        .arg("--initial-cluster-token")
        .arg(token)
        .args(["--initial-cluster-state", "new"]);
        if let Some(certs) = &certs {
            spec = spec
                .arg("--cert-file")
                .arg(certs.server_cert_path())
                .arg("--key-file")
                .arg(certs.server_key_path());
            // No --trusted-ca-file: with it etcd 3.4 demands client certificates.
        }
        let process = ServerProcess::spawn(spec)?;
        let ctl = Ctl {
            path: etcdctl,
            cacert: certs.as_ref().map(|c| c.ca_cert_path().to_path_buf()),
        };
        Ok(Self {
            process,
            name: plan.name,
            client_port: plan.client_port,
            peer_port: plan.peer_port,
            ctl,
            certs,
            dir,
        })
    }

    /// The member name (`m1`, `m2`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    single_server_accessors!(client_port, certs);

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// `127.0.0.1:PORT`, as etcd clients take it.
    pub fn endpoint(&self) -> String {
        self.addr().to_string()
    }

    /// `etcd_debugging_mvcc_<name>` (a gauge such as `watch_stream_total`
    /// or `watcher_total`) from this member's `/metrics`, on its client port.
    pub fn mvcc_gauge(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(self.endpoint()).expect("connect to /metrics");
        conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
        write!(conn, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("ask /metrics");
        let mut body = String::new();
        conn.read_to_string(&mut body).expect("read /metrics");
        let metric = format!("etcd_debugging_mvcc_{name} ");
        body.lines()
            .find_map(|l| l.strip_prefix(metric.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {metric} in /metrics"))
    }

    /// `etcd://127.0.0.1:PORT` (`etcds://` with TLS), the dlock URL of this member alone.
    pub fn url(&self) -> String {
        let scheme = if self.certs.is_some() {
            "etcds"
        } else {
            "etcd"
        };
        format!("{scheme}://{}", self.endpoint())
    }

    /// Runs `etcdctl` (v3 API) against this member and returns its trimmed stdout, e.g.
    /// `etcd.etcdctl(&["get", "--prefix", "dlock/"])`. Panics if etcdctl cannot run, exits
    /// non-zero, or takes longer than 10 s.
    #[track_caller]
    pub fn etcdctl(&self, args: &[&str]) -> String {
        checked(&self.ctl, &self.endpoint(), args)
    }

    /// Fallible [`EtcdServer::etcdctl`] with the full output.
    pub fn try_etcdctl(&self, args: &[&str]) -> HarnessResult<CommandOutput> {
        etcdctl(&self.ctl, &self.endpoint(), args, CTL_LIMIT)
    }

    /// Whether `etcdctl endpoint health` succeeds on this member right now.
    pub fn is_healthy(&self) -> bool {
        is_healthy(&self.ctl, &self.endpoint())
    }

    /// Whether this member is the raft leader right now (false if it does not answer).
    pub fn is_leader(&self) -> bool {
        etcdctl(
            &self.ctl,
            &self.endpoint(),
            &["endpoint", "status"],
            PROBE_LIMIT,
        )
        .is_ok_and(|out| out.success() && status_says_leader(&out.stdout))
    }
}

impl ServerControl for EtcdServer {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    fn wait_ready(&mut self) -> HarnessResult<()> {
        let ctl = self.ctl.clone();
        let endpoint = self.endpoint();
        self.process
            .wait_until("healthy", ETCD_READY_LIMIT, || is_healthy(&ctl, &endpoint))
    }
}

/// An etcd cluster of several members on loopback, stopped on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

impl EtcdCluster {
    /// Starts a cluster of `n` members and waits until each is healthy. Panics on failure.
    #[track_caller]
    pub fn start(n: usize) -> Self {
        Self::try_start(n).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Fallible [`EtcdCluster::start`].
    pub fn try_start(n: usize) -> HarnessResult<Self> {
        retry_port_clash(|| Self::try_start_once(n))
    }

    fn try_start_once(n: usize) -> HarnessResult<Self> {
        if n == 0 {
            return Err(HarnessError::new("an etcd cluster needs at least 1 member"));
        }
        let plans = (1..=n)
            .map(|i| MemberPlan::new(format!("m{i}")))
            .collect::<HarnessResult<Vec<_>>>()?;
        let initial_cluster = plans
            .iter()
            .map(MemberPlan::peer_url)
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("dlock-etcd-{}", plans[0].client_port);
        let mut members = Vec::with_capacity(n);
        for plan in plans {
            members.push(EtcdServer::spawn(plan, &initial_cluster, &token, false)?);
        }
        let mut cluster = Self { members };
        for member in &mut cluster.members {
            member.wait_ready()?;
        }
        Ok(cluster)
    }

    /// `127.0.0.1:PORT` of every member, in order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdServer::endpoint).collect()
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    member_accessors!(members: EtcdServer, member, member_mut, members);

    /// Index of the member that is raft leader now, asking each running member
    /// (`etcdctl endpoint status`); `None` if no member claims it (e.g. during an election).
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.process().pid().is_some() && !m.process().is_paused() && m.is_leader())
    }

    /// Waits (bounded) until some member is leader, e.g. after killing the old one.
    pub fn wait_for_leader(&self, limit: Duration) -> HarnessResult<usize> {
        leader::wait_for_leader(
            limit,
            || self.leader(),
            || format!("etcd leader among {:?}", self.endpoints()),
        )
    }

    /// Runs `etcdctl` against all endpoints and returns its trimmed stdout. Panics like
    /// [`EtcdServer::etcdctl`].
    #[track_caller]
    pub fn etcdctl(&self, args: &[&str]) -> String {
        checked(&self.members[0].ctl, &self.endpoints().join(","), args)
    }
}

fn etcdctl(
    ctl: &Ctl,
    endpoints: &str,
    args: &[&str],
    limit: Duration,
) -> HarnessResult<CommandOutput> {
    let mut all: Vec<OsString> = vec![
        format!("--endpoints={endpoints}").into(),
        "--dial-timeout=2s".into(),
        "--command-timeout=5s".into(),
    ];
    if let Some(ca) = &ctl.cacert {
        let mut flag = OsString::from("--cacert=");
        flag.push(ca);
        all.push(flag);
    }
    all.extend(args.iter().map(OsString::from));
    run_command(
        &ctl.path,
        &all,
        &[("ETCDCTL_API".into(), "3".into())],
        limit,
    )
}

#[track_caller]
fn checked(ctl: &Ctl, endpoints: &str, args: &[&str]) -> String {
    match etcdctl(ctl, endpoints, args, CTL_LIMIT) {
        Ok(out) if out.success() => out.stdout.trim().to_string(),
        Ok(out) => panic!(
            "etcdctl {args:?} against {endpoints} failed ({:?}): {}{}",
            out.status, out.stdout, out.stderr
        ),
        Err(e) => panic!("{e}"),
    }
}

fn is_healthy(ctl: &Ctl, endpoint: &str) -> bool {
    etcdctl(ctl, endpoint, &["endpoint", "health"], PROBE_LIMIT).is_ok_and(|out| out.success())
}

/// `endpoint status` (simple format) prints `ENDPOINT, ID, VERSION, DB SIZE, IS LEADER, ...`.
fn status_says_leader(stdout: &str) -> bool {
    stdout
        .lines()
        .next()
        .and_then(|line| line.split(", ").nth(4))
        .is_some_and(|field| field.trim() == "true")
}
