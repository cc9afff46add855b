//! One sentinel process: started with its own `sentinel.conf`, asked with `redis-cli`.

use super::*;

/// One sentinel process (`redis-server sentinel.conf --sentinel`), stopped on drop.
#[derive(Debug)]
pub struct SentinelNode {
    // Field order matters: the process must stop before the temp dir is removed.
    pub(super) process: ServerProcess,
    pub(super) port: u16,
    pub(super) password: Option<String>,
    /// The CA to trust with `redis-cli --tls`, for a TLS sentinel.
    pub(super) ca: Option<PathBuf>,
    pub(super) debug_args: Vec<String>,
    pub(super) cli: PathBuf,
    pub(super) dir: TempDir,
}

impl SentinelNode {
    pub(super) fn try_start(options: &SentinelOptions, master_port: u16) -> HarnessResult<Self> {
        let server = require_binary("redis-server", REDIS_PACKAGES)?;
        let cli = require_binary("redis-cli", REDIS_PACKAGES)?;
        retry_port_clash(|| {
            let port = free_port()?;
            let dir = tempfile::Builder::new()
                .prefix(&format!("dlock-sentinel-{port}-"))
                .tempdir()
                .context(|| "create temp dir for a sentinel".to_string())?;
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(&conf, options.sentinel_conf(port, dir.path(), master_port))
                .context(|| format!("write {}", conf.display()))?;
            let spec = ProcessSpec::new(
                format!("redis-sentinel 127.0.0.1:{port}"),
                &server,
                dir.path().join("sentinel.log"),
            )
            .arg(&conf)
            .arg("--sentinel");
            let mut node = Self {
                process: ServerProcess::spawn(spec)?,
                port,
                password: options.sentinel_password.clone(),
                ca: options
                    .tls_certs()
                    .map(|certs| certs.ca_cert_path().to_path_buf()),
                debug_args: options.debug_args(),
                cli: cli.clone(),
                dir,
            };
            node.wait_ready()?;
            Ok(node)
        })
    }

    single_server_accessors!(port);

    /// The sentinel's config file (the sentinel rewrites it with what it learns).
    pub fn conf_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.conf")
    }

    /// Runs one command with `redis-cli` against this sentinel (authenticated if the
    /// sentinels have a password) and returns its trimmed stdout, e.g.
    /// `["SENTINEL", "get-master-addr-by-name", "mm"]` → `"127.0.0.1\n23456"`. Panics if
    /// redis-cli cannot run, fails or takes longer than 10 s.
    #[track_caller]
    pub fn redis_cli(&self, args: &[&str]) -> String {
        CommandOutput::trimmed_stdout(
            self.try_redis_cli(args),
            format_args!("redis-cli {args:?} against sentinel {}", self.addr()),
        )
    }

    /// Fallible [`SentinelNode::redis_cli`] with the full output.
    pub fn try_redis_cli(&self, args: &[&str]) -> HarnessResult<CommandOutput> {
        self.cli_with_limit(args, CLI_LIMIT)
    }

    pub(super) fn cli_with_limit(
        &self,
        args: &[&str],
        limit: Duration,
    ) -> HarnessResult<CommandOutput> {
        // The sentinels have no ACL users: the default one, with the password.
        let mut all = redis_cli_args(
            self.port,
            self.ca.as_deref(),
            None,
            self.password.as_deref(),
        );
        all.extend(args.iter().map(OsString::from));
        run_command(&self.cli, &all, &[], limit)
    }

    /// The trimmed answer of a probe, `None` if the sentinel did not answer in time.
    pub(super) fn probe(&self, args: &[&str]) -> Option<String> {
        self.cli_with_limit(args, PROBE_LIMIT)
            .ok()
            .filter(CommandOutput::success)
            .map(|out| out.stdout.trim().to_string())
    }

    /// Whether this sentinel is running and not paused, so it can be asked.
    pub(super) fn answers(&self) -> bool {
        self.process.pid().is_some() && !self.process.is_paused()
    }

    /// The master address this sentinel reports for `name`.
    pub(super) fn master_addr_of(&self, name: &str) -> Option<SocketAddr> {
        let answer = self.probe(&["SENTINEL", "get-master-addr-by-name", name])?;
        let mut lines = answer.lines();
        let ip: Ipv4Addr = lines.next()?.trim().parse().ok()?;
        let port: u16 = lines.next()?.trim().parse().ok()?;
        Some(SocketAddr::from((ip, port)))
    }

    /// The entries of `SENTINEL sentinels|replicas NAME`, as field maps.
    pub(super) fn entries(&self, what: &str, name: &str) -> Option<Vec<HashMap<String, String>>> {
        self.probe(&["SENTINEL", what, name])
            .map(|answer| parse_entries(&answer))
    }
}

impl ServerControl for SentinelNode {
    fn process(&self) -> &ServerProcess {
        &self.process
    }

    fn process_mut(&mut self) -> &mut ServerProcess {
        &mut self.process
    }

    /// Waits until the sentinel answers `PING`, then sets its periods (`SENTINEL DEBUG`,
    /// which lives only as long as the process).
    fn wait_ready(&mut self) -> HarnessResult<()> {
        let (cli, mut args) = (
            self.cli.clone(),
            redis_cli_args(
                self.port,
                self.ca.as_deref(),
                None,
                self.password.as_deref(),
            ),
        );
        args.push("PING".into());
        self.process
            .wait_until("answering PING", SENTINEL_READY_LIMIT, || {
                run_command(&cli, &args, &[], PROBE_LIMIT)
                    .is_ok_and(|out| out.stdout.trim() == "PONG")
            })?;
        let debug: Vec<&str> = self.debug_args.iter().map(String::as_str).collect();
        let out = self.try_redis_cli(&debug)?;
        if out.success() && out.stdout.trim() == "OK" {
            Ok(())
        } else {
            Err(HarnessError::new(format!(
                "{} refused {debug:?}: {}{}",
                self.process.name(),
                out.stdout,
                out.stderr
            )))
        }
    }
}

/// Splits redis-cli's flat output of an array of field/value arrays (`SENTINEL sentinels`,
/// `SENTINEL replicas`) into one map per entry; each entry starts with its `name` field.
pub(super) fn parse_entries(answer: &str) -> Vec<HashMap<String, String>> {
    let lines: Vec<&str> = answer.lines().map(str::trim).collect();
    let mut entries: Vec<HashMap<String, String>> = Vec::new();
    for pair in lines.chunks(2) {
        let [field, value] = pair else { break };
        if *field == "name" || entries.is_empty() {
            entries.push(HashMap::new());
        }
        if let Some(entry) = entries.last_mut() {
            entry.insert((*field).to_string(), (*value).to_string());
        }
    }
    entries
}

/// Whether an entry of `SENTINEL sentinels|replicas` is reachable and not considered down
/// (its `flags` are exactly `sentinel` or `slave`).
pub(super) fn is_healthy(entry: &HashMap<String, String>, role: &str) -> bool {
    entry.get("flags").is_some_and(|flags| flags == role)
}

/// The value of `field:` in `INFO` output.
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}
