//! Waiting for a group's state: replicas synced, sentinels agreeing on the master and seeing
//! every replica; the logs quoted when a wait runs out.

use super::*;

impl RedisSentinel {
    /// Waits until every running, unpaused node but the master replicates from it
    /// (`master_link_status:up`) and has processed everything written so far (its
    /// replication offset has reached the master's).
    ///
    /// The offset matters: after a full sync, Redis 7.0 streams nothing to a replica until
    /// its first `REPLCONF ACK` (sent every second), though both sides already report the
    /// link up; a replica paused in that window never gets the writes made meanwhile. (Not
    /// `WAIT` on a new connection: it waits for the offset of that connection's own last
    /// write, which has none, so it answered at once while a replica still lacked a write
    /// made on another connection.)
    pub fn wait_replicas_synced(&mut self, limit: Duration) -> HarnessResult<()> {
        let master = self.try_master_index()?;
        let mut target = None;
        self.wait_for("replicas synced", limit, |g| {
            g.synced_state(master, &mut target)
        })
    }

    /// Ok once every running, unpaused node but `master` replicates from it with the link
    /// up, and its offset has reached `target`: the one the master reported first (set on
    /// the first probe that finds something written).
    ///
    /// The target is kept across probes, not read anew: the master keeps writing (the
    /// sentinels' hello messages every 2 s each, its pings to the replicas) while replicas
    /// acknowledge once a second, so the master's latest offset and the acknowledgements
    /// may never meet in one probe (a CI run waited 5 s on acknowledged 3,941 of 4,197).
    pub(super) fn synced_state(
        &self,
        master: usize,
        target: &mut Option<u64>,
    ) -> Result<(), String> {
        let master_port = self.nodes[master].port().to_string();
        let master_info = self.info_replication(master)?;
        let now = replication_offset(&master_info, "master_repl_offset")
            .ok_or_else(|| format!("the master reports no offset:\n{master_info}"))?;
        if target.is_none() && now > 0 {
            *target = Some(now);
        }
        let written = target.unwrap_or(0);
        for (i, node) in self.nodes.iter().enumerate() {
            if i == master || node.pid().is_none() || node.process().is_paused() {
                continue;
            }
            let info = self.info_replication(i)?;
            if info_field(&info, "master_port") != Some(&master_port)
                || info_field(&info, "master_link_status") != Some("up")
            {
                return Err(format!("node {i} ({}) reports:\n{info}", node.addr()));
            }
            let processed = replication_offset(&info, "slave_repl_offset").unwrap_or(0);
            if processed < written {
                return Err(format!(
                    "node {i} ({}) has processed offset {processed} of the master's {written}",
                    node.addr()
                ));
            }
            // The replica's own offset is not enough: right after a full sync it equals the
            // master's, while the master still holds the command stream back until the
            // replica's first `REPLCONF ACK`. The master's view of the replica tells: the
            // offset it lists is the last one acknowledged, so once it has reached what was
            // written (and something was), the stream flows.
            let acknowledged = acknowledged_offset(&master_info, node.port());
            if written == 0 || acknowledged.is_none_or(|acked| acked < written) {
                return Err(format!(
                    "the master lists node {i} ({}) as acknowledging {acknowledged:?} of \
                     offset {written}:\n{master_info}",
                    node.addr()
                ));
            }
        }
        Ok(())
    }

    /// `INFO replication` of node `i`, or why not.
    pub(super) fn info_replication(&self, i: usize) -> Result<String, String> {
        let out = self.nodes[i]
            .cli_with_limit(&["INFO", "replication"], PROBE_LIMIT)
            .map_err(|e| e.to_string())?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(format!(
                "node {i} ({}): {}{}",
                self.nodes[i].addr(),
                out.stdout,
                out.stderr
            ))
        }
    }

    /// Ok once `replicas` replicas report their link to node `master` up, it reports
    /// `connected_slaves:N`, and they have acknowledged its stream.
    pub(super) fn replication_state(
        &self,
        master: usize,
        replicas: usize,
        target: &mut Option<u64>,
    ) -> Result<(), String> {
        for i in (0..self.nodes.len()).filter(|&i| i != master) {
            let info = self.info_replication(i)?;
            if info_field(&info, "master_link_status") != Some("up") {
                return Err(format!(
                    "replica {i} ({}) reports:\n{info}",
                    self.nodes[i].addr()
                ));
            }
        }
        let info = self.info_replication(master)?;
        if info_field(&info, "connected_slaves") != Some(&replicas.to_string()) {
            return Err(format!("the master reports:\n{info}"));
        }
        if replication_offset(&info, "master_repl_offset") == Some(0) {
            // Nothing written yet, so no acknowledgement can show that the stream flows
            // (see `synced_state`): a message on a channel nobody reads is a write that
            // reaches the replicas and leaves no key behind.
            self.nodes[master]
                .cli_with_limit(&["PUBLISH", "__dlock_harness__", "sync"], PROBE_LIMIT)
                .map_err(|e| e.to_string())?;
        }
        self.synced_state(master, target)
    }

    /// Ok once every sentinel names `master`, knows the other sentinels and `replicas`
    /// replicas, all healthy.
    pub(super) fn sentinels_state(
        &self,
        master: SocketAddr,
        replicas: usize,
    ) -> Result<(), String> {
        let name = &self.options.master_name;
        for s in &self.sentinels {
            let named = s.master_addr_of(name);
            if named != Some(master) {
                return Err(format!("sentinel {} names {named:?}", s.addr()));
            }
            let peers = s.entries("sentinels", name).unwrap_or_default();
            if peers.len() != SENTINELS - 1 || !peers.iter().all(|e| is_healthy(e, "sentinel")) {
                return Err(format!(
                    "sentinel {} knows the sentinels {peers:?}",
                    s.addr()
                ));
            }
            let known = s.entries("replicas", name).unwrap_or_default();
            if known.len() != replicas || !known.iter().all(|e| is_healthy(e, "slave")) {
                return Err(format!(
                    "sentinel {} knows the replicas {known:?}",
                    s.addr()
                ));
            }
        }
        Ok(())
    }

    /// Ok once every running, unpaused sentinel lists `replica` with flags `slave`.
    pub(super) fn sentinels_see_replica(
        &self,
        name: &str,
        replica: SocketAddr,
    ) -> Result<(), String> {
        for s in self.sentinels.iter().filter(|s| s.answers()) {
            let known = s.entries("replicas", name).unwrap_or_default();
            let seen = known.iter().any(|e| {
                e.get("ip").map(String::as_str) == Some("127.0.0.1")
                    && e.get("port") == Some(&replica.port().to_string())
                    && is_healthy(e, "slave")
            });
            if !seen {
                return Err(format!(
                    "sentinel {} knows the replicas {known:?}",
                    s.addr()
                ));
            }
        }
        Ok(())
    }

    /// Probes `check` every 20 ms for at most `limit`; fails early if a started process
    /// exited, and on timeout with `check`'s last reason and every log's end.
    pub(super) fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut check: impl FnMut(&Self) -> Result<(), String>,
    ) -> HarnessResult<()> {
        let started = Instant::now();
        loop {
            if let Some(name) = self.exited() {
                return Err(HarnessError::new(format!(
                    "{name} exited while the sentinel group was getting {what}; logs:\n{}",
                    self.logs()
                )));
            }
            let reason = match check(self) {
                Ok(()) => return Ok(()),
                Err(reason) => reason,
            };
            if started.elapsed() >= limit {
                return Err(HarnessError::new(format!(
                    "sentinel group not {what} after {limit:?}: {reason}\nlogs:\n{}",
                    self.logs()
                )));
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
    }

    /// The name of a process that was started (and not stopped by the harness) but exited.
    pub(super) fn exited(&mut self) -> Option<String> {
        let nodes = self.nodes.iter_mut().map(|n| n.process_mut());
        let sentinels = self.sentinels.iter_mut().map(|s| s.process_mut());
        nodes
            .chain(sentinels)
            .find_map(|p| (p.pid().is_some() && !p.is_running()).then(|| p.name().to_string()))
    }

    /// The end of every process's log, for error messages.
    pub(super) fn logs(&self) -> String {
        let nodes = self.nodes.iter().map(|n| n.process());
        let sentinels = self.sentinels.iter().map(|s| s.process());
        nodes
            .chain(sentinels)
            .map(|p| {
                format!(
                    "--- {} ({}):\n{}",
                    p.name(),
                    p.log_path().display(),
                    log_tail(p.log_path(), GROUP_LOG_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A replication offset field of `INFO replication`.
/// The offset the master last heard acknowledged by its replica on `port`, from the
/// `slaveN:ip=…,port=…,state=online,offset=…,lag=…` lines of its `INFO replication`
/// (`None` while that replica is not listed as online).
fn acknowledged_offset(master_info: &str, port: u16) -> Option<u64> {
    let port = format!("port={port}");
    master_info.lines().find_map(|line| {
        let (name, fields) = line.split_once(':')?;
        if !name.starts_with("slave") || !fields.split(',').any(|f| f == port) {
            return None;
        }
        if !fields.split(',').any(|f| f == "state=online") {
            return None;
        }
        fields
            .split(',')
            .find_map(|f| f.strip_prefix("offset="))?
            .parse()
            .ok()
    })
}

fn replication_offset(info: &str, field: &str) -> Option<u64> {
    info_field(info, field)?.trim().parse().ok()
}
