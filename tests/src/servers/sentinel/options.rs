//! How a group starts: [`SentinelOptions`], the sentinels' `sentinel.conf` and the words quoted in it.

use super::*;

/// How to start a [`RedisSentinel`]: master name, timings, authentication, persistence.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    pub(super) master_name: String,
    pub(super) down_after: Duration,
    pub(super) failover_timeout: Duration,
    /// What every data node starts with: the password of its `default`
    /// user, its ACL user, TLS (see [`SentinelOptions::node_options`]).
    pub(super) nodes: RedisOptions,
    pub(super) sentinel_password: Option<String>,
    pub(super) appendonly: bool,
    pub(super) periods: Vec<(&'static str, Duration)>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        Self {
            master_name: DEFAULT_MASTER_NAME.to_string(),
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(4000),
            nodes: RedisOptions::new(),
            sentinel_password: None,
            appendonly: false,
            periods: vec![
                ("tilt-period", Duration::from_secs(3)),
                ("info-period", Duration::from_secs(1)),
                ("publish-period", Duration::from_millis(500)),
            ],
        }
    }
}

impl SentinelOptions {
    /// Master `mm`, `down-after-milliseconds` 1000, `failover-timeout` 4000, no
    /// authentication, no persistence, and the shorter sentinel periods of
    /// [`SentinelOptions::tilt_period`], [`SentinelOptions::info_period`] and
    /// [`SentinelOptions::publish_period`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The name the sentinels know the master by (`sentinel monitor NAME ...`).
    pub fn master_name(mut self, name: impl Into<String>) -> Self {
        self.master_name = name.into();
        self
    }

    /// `sentinel down-after-milliseconds`: how long a node may stay silent before a
    /// sentinel calls it subjectively down (default 1 s).
    pub fn down_after(mut self, down_after: Duration) -> Self {
        self.down_after = down_after;
        self
    }

    /// `sentinel failover-timeout` (default 4 s).
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.failover_timeout = timeout;
        self
    }

    /// Password of the `default` user on every data node (`--requirepass`); the replicas
    /// get `--masterauth` and the sentinels `sentinel auth-pass`.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.nodes = self.nodes.password(password);
        self
    }

    /// An ACL user with every permission on every data node; the replicas replicate as it
    /// (`--masteruser`/`--masterauth`) and the sentinels log in as it (`sentinel auth-user`
    /// / `auth-pass`). Combine with [`SentinelOptions::password`] to lock out the `default`
    /// user.
    pub fn acl_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.nodes = self.nodes.acl_user(name, password);
        self
    }

    /// A password on the sentinels themselves (`requirepass` in each sentinel's conf): a
    /// client must `AUTH` before asking a sentinel anything.
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// `--appendonly yes` on every data node (an old master restarted after `kill -9`
    /// reloads what it had acknowledged).
    pub fn appendonly(mut self, appendonly: bool) -> Self {
        self.appendonly = appendonly;
        self
    }

    /// TLS only, everywhere, with one throwaway CA ([`TestCerts`]) for the whole group:
    /// the data nodes run `--port 0 --tls-port P` with `--tls-replication yes` (replicas
    /// replicate over TLS) and `--tls-auth-clients no`, like [`RedisOptions::tls`]; the
    /// sentinels run `port 0`, `tls-port S`, the same certificate, key and CA,
    /// `tls-replication yes` and `tls-auth-clients no`.
    ///
    /// What Redis 7.0 needs for this: a sentinel speaks TLS to the master, the replicas and
    /// the other sentinels only with `tls-replication yes` (without it, it connects in
    /// plain text and the TLS-only nodes drop it: `Error accepting a client connection:
    /// ... SSL routines::wrong version number` in the master's log, and the sentinel calls
    /// the master `s_down,master,disconnected`; checked by hand with 7.0.15). With
    /// it, a sentinel announces its `tls-port` in its hello messages, and a replica
    /// announces its `tls-port` to its master (`REPLCONF listening-port`), so the
    /// addresses the sentinels learn and hand out are the TLS ports. As a TLS client, a
    /// sentinel or replica presents `tls-cert-file` (the test server certificate is also
    /// a client certificate), which nobody asks for here anyway (`tls-auth-clients no`).
    ///
    /// [`RedisSentinel::url`] is then `rediss+sentinel://…/NAME?ca=<ca.crt>`, and the
    /// harness's own `redis-cli` calls use `--tls --cacert <ca.crt>`.
    pub fn tls(mut self, tls: bool) -> Self {
        self.nodes = self.nodes.tls(tls);
        self
    }

    /// How long a sentinel stays in TILT mode, where it starts no failover (Redis: 30 s;
    /// here 3 s). A sentinel enters TILT when its 100 ms timer runs more than 2 s late: on
    /// this shared 2-core machine, under parallel builds, all three sentinels did so at
    /// once (a stalled machine, a slow `fsync` of the rewritten conf), and a failover then
    /// waited the whole period. Set with `SENTINEL DEBUG tilt-period` once each sentinel
    /// answers (again after a restart).
    pub fn tilt_period(self, period: Duration) -> Self {
        self.period("tilt-period", period)
    }

    /// How often a sentinel sends `INFO` to the nodes when no failover is under way
    /// (Redis: 10 s; here 1 s): a returning old master is turned into a replica at the
    /// first `INFO` after it has reported itself master for 4 publish periods, and a
    /// sentinel learns new replicas from it. `SENTINEL DEBUG info-period`.
    pub fn info_period(self, period: Duration) -> Self {
        self.period("info-period", period)
    }

    /// How often a sentinel publishes its hello message (Redis: 2 s; here 0.5 s): the
    /// sentinels find each other through them. `SENTINEL DEBUG publish-period`.
    pub fn publish_period(self, period: Duration) -> Self {
        self.period("publish-period", period)
    }

    pub(super) fn period(mut self, name: &'static str, period: Duration) -> Self {
        self.periods.retain(|(n, _)| *n != name);
        self.periods.push((name, period));
        self
    }

    /// The `SENTINEL DEBUG` arguments that set the periods.
    pub(super) fn debug_args(&self) -> Vec<String> {
        let mut args = vec!["SENTINEL".to_string(), "DEBUG".to_string()];
        for (name, period) in &self.periods {
            args.push((*name).to_string());
            args.push(period.as_millis().to_string());
        }
        args
    }

    /// The options of one data node; a replica of the node on `replica_of`.
    pub(super) fn node_options(&self, replica_of: Option<u16>) -> RedisOptions {
        let nodes = &self.nodes;
        let mut options = nodes.clone().config(["--repl-diskless-sync-delay", "0"]);
        if self.tls_certs().is_some() {
            options = options.config(["--tls-replication", "yes"]);
        }
        if let Some(password) = &nodes.password {
            options = options.config(["--masterauth", password]);
        }
        // After `--masterauth` of the default user, so that these win.
        if let Some((user, password)) = &nodes.acl_user {
            options = options.config(["--masteruser", user, "--masterauth", password]);
        }
        if self.appendonly {
            options = options.config(["--appendonly", "yes"]);
        }
        if let Some(port) = replica_of {
            options = options.config([
                "--replicaof".to_string(),
                "127.0.0.1".into(),
                port.to_string(),
            ]);
        }
        options
    }

    /// The group's certificates, if it runs TLS (set by [`RedisSentinel::try_start_with`]).
    pub(super) fn tls_certs(&self) -> Option<&TestCerts> {
        self.nodes.certs.as_ref().filter(|_| self.nodes.tls)
    }

    /// The `sentinel.conf` of a sentinel on `port` with its dir `dir`.
    pub(super) fn sentinel_conf(
        &self,
        port: u16,
        dir: &std::path::Path,
        master_port: u16,
    ) -> String {
        let name = conf_quote(&self.master_name);
        let listen = match self.tls_certs() {
            // See [`SentinelOptions::tls`] for why `tls-replication yes`.
            Some(certs) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-replication yes\ntls-auth-clients no",
                conf_quote(&certs.server_cert_path().display().to_string()),
                conf_quote(&certs.server_key_path().display().to_string()),
                conf_quote(&certs.ca_cert_path().display().to_string()),
            ),
            None => format!("port {port}"),
        };
        let mut conf = format!(
            "{listen}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {name} 127.0.0.1 {master_port} {QUORUM}\n\
             sentinel down-after-milliseconds {name} {}\n\
             sentinel failover-timeout {name} {}\n\
             sentinel parallel-syncs {name} 1\n",
            conf_quote(&dir.display().to_string()),
            self.down_after.as_millis(),
            self.failover_timeout.as_millis(),
        );
        match (&self.nodes.acl_user, &self.nodes.password) {
            (Some((user, password)), _) => {
                let _ = writeln!(conf, "sentinel auth-user {name} {}", conf_quote(user));
                let _ = writeln!(conf, "sentinel auth-pass {name} {}", conf_quote(password));
            }
            (None, Some(password)) => {
                let _ = writeln!(conf, "sentinel auth-pass {name} {}", conf_quote(password));
            }
            (None, None) => {}
        }
        if let Some(password) = &self.sentinel_password {
            // The sentinels also log in to each other with it.
            let _ = writeln!(conf, "requirepass {}", conf_quote(password));
        }
        conf
    }
}

/// A word of a Redis config file, double-quoted with `"` and `\` escaped.
pub(super) fn conf_quote(word: &str) -> String {
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('"');
    for c in word.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// `text` percent-encoded for a URL's user info or path: everything but RFC 3986's
/// unreserved characters (`A-Z a-z 0-9 - . _ ~`) becomes `%XX`.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}
