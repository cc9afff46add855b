//! What the backend does with acknowledgements: a grant or a renewal
//! counts once enough replicas have it; an unacknowledged grant is given
//! back and asked for again (`replicated`, `replicated_renewals`), and
//! behind Sentinel a request answered across a switch is not trusted
//! (`master_generation`).

use std::future::Future;
use std::time::Instant;

use super::{Disarm, Grant, Unacknowledged, RETRY_PAUSE};
use crate::backend::{Lease, Renewal};
use crate::backends::redis::topology::server::Server;
use crate::backends::redis::Conn;
use crate::LockError;

impl crate::backends::redis::RedisBackend {
    /// Behind Sentinel, how many times requests moved to another master.
    pub(in crate::backends::redis) fn master_generation(&self) -> Option<u64> {
        match &self.conn {
            Conn::Single(Server::Followed(sentinel)) => Some(sentinel.generation()),
            _ => None,
        }
    }

    /// Whether enough replicas acknowledged the write that granted or
    /// extended `lease` (and every write this backend sent before it).
    async fn acknowledged(&self, lease: &Lease) -> Result<Result<(), Unacknowledged>, LockError> {
        if self.replicas.none_needed_now(&self.conn, &lease.resource) {
            return Ok(Ok(()));
        }
        // Boxed: the acknowledgement (a `WAIT`, perhaps an `INFO` and a
        // question to the sentinels) would otherwise nest its state in
        // every acquire future, past rustc's layout depth.
        Box::pin(
            self.replicas
                .confirm(&self.conn, &lease.resource, lease.ttl),
        )
        .await
        .map_err(|e| self.error(e))
    }

    /// What `ask` granted, handed over only once replicas acknowledged it.
    ///
    /// - While the acknowledgement is awaited, the guard `arm` makes gives
    ///   the grant back if this future is dropped (or the `WAIT` fails), as
    ///   the acquire's own guard did until its answer came.
    /// - A grant they did not acknowledge is given back with `undo`, awaited
    ///   (failing that, it expires by its ttl): sent at once and never
    ///   batched, so the next `ask` with the same token cannot overtake it.
    ///   It is asked for again until `deadline` (none: for ever); with
    ///   `once`, or when the time is up, the error says that replicas did
    ///   not acknowledge.
    pub(in crate::backends::redis) async fn replicated<G, A, AF, M, D, U, UF>(
        &self,
        key: &str,
        (deadline, once): (Option<Instant>, bool),
        mut ask: A,
        arm: M,
        undo: U,
    ) -> Result<G, LockError>
    where
        G: Grant,
        A: FnMut() -> AF,
        AF: Future<Output = Result<G, LockError>>,
        M: Fn() -> D,
        D: Disarm,
        U: Fn(G) -> UF,
        UF: Future<Output = ()>,
    {
        loop {
            // A server reached by a connection opened since it was last read
            // (a restart, a failover) is read again before anything is
            // granted on it (see `eviction.rs`): one atomic read otherwise.
            self.eviction_unchanged().await?;
            let connections = self.reconnects.now();
            let master = self.master_generation();
            let granted = ask().await?;
            let Some(lease) = granted.lease() else {
                return Ok(granted);
            };
            let mut unclaimed = arm();
            // The grant itself may have gone on a connection opened while it
            // was asked (a request resent after its connection broke): that
            // server is read before the grant is handed over, and a refusal
            // gives the grant back.
            if self.reconnects.now() != connections
                && let Err(refused) = self.eviction_unchanged().await
            {
                unclaimed.disarm();
                undo(granted).await;
                return Err(refused);
            }
            let answer = if self.replicas.is_off() {
                Ok(())
            } else {
                self.acknowledged(lease).await?
            };
            // Behind Sentinel: a grant answered while requests moved to
            // another master (a failover) may have been written by the old
            // one, which the new one never saw: given back, asked again.
            let answer = match answer {
                Ok(()) if self.master_generation() != master => Err(Unacknowledged {
                    acknowledged: 0,
                    needed: 1,
                }),
                answer => answer,
            };
            let short = match answer {
                Ok(()) => {
                    unclaimed.disarm();
                    return Ok(granted);
                }
                Err(short) => short,
            };
            unclaimed.disarm();
            tracing::debug!(key = %key, acknowledged = short.acknowledged, needed = short.needed,
                "too few replicas acknowledged a grant; giving it back");
            undo(granted).await;
            if once || deadline.is_some_and(|d| Instant::now() + RETRY_PAUSE >= d) {
                return Err(LockError::Replication {
                    key: key.to_owned(),
                    acknowledged: short.acknowledged,
                    needed: short.needed,
                });
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// `renewals` of `leases`, each `Renewed` one kept only if replicas
    /// acknowledged it: otherwise it is a failed renewal (the watchdog
    /// tries again until the lease's deadline).
    pub(in crate::backends::redis) async fn replicated_renewals(
        &self,
        leases: &[Lease],
        master: Option<u64>,
        mut renewals: Vec<Result<Renewal, LockError>>,
    ) -> Vec<Result<Renewal, LockError>> {
        // After a reconnect or a failover, holders hear of a server that may
        // now evict even when no one acquires (see `eviction.rs`).
        if !self.eviction_current() {
            self.eviction_after_reconnect().await;
        }
        if self.master_generation() != master {
            // Requests moved to another master while these were answered:
            // the old one may have extended leases the new one never saw.
            // Failed renewals: the watchdog asks the new master again.
            for renewal in &mut renewals {
                if matches!(renewal, Ok(Renewal::Renewed { .. })) {
                    *renewal = Err(LockError::backend(
                        self.options.shown.clone(),
                        "the master changed (a failover) while the renewal was answered",
                    ));
                }
            }
            return renewals;
        }
        if self.replicas.is_off() {
            return renewals;
        }
        let renewed: Vec<usize> = (0..leases.len())
            .filter(|&i| matches!(renewals.get(i), Some(Ok(Renewal::Renewed { .. }))))
            .collect();
        if renewed.is_empty() {
            return renewals;
        }
        // One server: one WAIT covers every write before it. A Cluster:
        // one per lease, each on its key's shard master, all at once.
        let asked: Vec<usize> = if matches!(self.conn, Conn::Cluster(_)) {
            renewed.clone()
        } else {
            vec![renewed[0]]
        };
        let answers =
            futures_util::future::join_all(asked.iter().map(|&i| self.acknowledged(&leases[i])))
                .await;
        for (n, &i) in renewed.iter().enumerate() {
            let answer = if asked.len() == 1 {
                &answers[0]
            } else {
                &answers[n]
            };
            let failed = match answer {
                Ok(Ok(())) => continue,
                Ok(Err(short)) => LockError::Replication {
                    key: leases[i].key.clone(),
                    acknowledged: short.acknowledged,
                    needed: short.needed,
                },
                Err(e) => LockError::backend(self.options.shown.clone(), e.to_string()),
            };
            renewals[i] = Err(failed);
        }
        renewals
    }
}
