//! Renewal of ZooKeeper leases: a read of the held nodes per session,
//! behind a `sync`, and each node's answer turned into a renewal. The
//! session's heartbeat keeps the nodes; the read proves they are still ours.
//!
//! The read is cut into multi-reads of bounded size ([`MAX_READ_BYTES`],
//! [`MAX_READ_NODES`]): the server closes the connection on a request or
//! answer over its `jute.maxbuffer` (1 MiB by default), and one read of
//! every node held once lost every lease past about 12,000 locks.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use zookeeper_client::{Client, Error as ZkError, MultiReadResult};

use super::cleanup::session_ended;
use super::session::Session;
use super::{lease, lock, ZooKeeperBackend};
use crate::backend::{Lease, Renewal};
use crate::LockError;

/// The most one multi-read may carry, counting its request and its answer
/// (see [`read_cost`]): an eighth of ZooKeeper's default `jute.maxbuffer`,
/// so a server configured well below the default still takes it.
pub(super) const MAX_READ_BYTES: usize = 128 * 1024;

/// The most nodes in one multi-read, whatever their size.
pub(super) const MAX_READ_NODES: usize = 1000;

/// What reading one node adds to a multi-read, in bytes: its path in the
/// request and its data (the owner token) with its 68-byte stat in the
/// answer, each with the framing of one operation (generous).
fn read_cost(lease: &Lease) -> usize {
    lease.resource.len() + lease.token.len() + 68 + 48
}

/// Cuts `idx` (leases by index) into runs no read refuses.
fn cut_into_reads(leases: &[Lease], idx: &[usize]) -> Vec<Vec<usize>> {
    let mut reads: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &i in idx {
        let cost = read_cost(&leases[i]);
        match reads.last_mut() {
            Some(read) if read.len() < MAX_READ_NODES && bytes + cost <= MAX_READ_BYTES => {
                read.push(i);
                bytes += cost;
            }
            _ => {
                reads.push(vec![i]);
                bytes = cost;
            }
        }
    }
    reads
}

/// One answer per lease, filled in as they come.
type Answers = Vec<Option<Result<Renewal, LockError>>>;

/// The leases (by index) to read on each session, in one multi-read each
/// (several entries of one session when its nodes need several reads).
type Groups = Vec<(Arc<Session>, Vec<usize>)>;

/// A session's `sync` and multi-read, both sent: the read's answer once
/// the sync's came.
type Read<'a> = Pin<Box<dyn Future<Output = Result<Vec<MultiReadResult>, ZkError>> + Send + 'a>>;

impl ZooKeeperBackend {
    /// `renew` of lock and permit nodes alike.
    pub(super) async fn renew_nodes(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let sent = Instant::now();
        let (mut answers, groups) = self.group_by_session(leases);
        let reads = send_reads(leases, &groups);
        for ((session, idx), read) in groups.iter().zip(reads) {
            let result = read.await;
            let answered = Instant::now();
            match result {
                Ok(results) => {
                    for (&i, read) in idx.iter().zip(results) {
                        let framed = (sent, answered);
                        answers[i] = Some(self.renewal(&session.client, &leases[i], read, framed));
                    }
                }
                Err(e) if session_ended(&e) => {
                    for &i in idx {
                        answers[i] = Some(Ok(Renewal::SessionExpired));
                    }
                }
                Err(e) => {
                    for &i in idx {
                        answers[i] = Some(Err(self.error("renewal read failed", e.clone())));
                    }
                }
            }
        }
        self.keep_deadlines(leases, &mut answers);
        answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(LockError::backend(
                        self.shown.clone(),
                        "renewal got fewer answers than it asked for",
                    ))
                })
            })
            .collect()
    }

    /// The answers known without asking (a node no longer held, a session
    /// that ended), and the leases to read grouped by session: one
    /// multi-read per session, almost always one.
    fn group_by_session(&self, leases: &[Lease]) -> (Answers, Groups) {
        let mut answers: Answers = leases.iter().map(|_| None).collect();
        let mut groups: Groups = Vec::new();
        // Entries of sessions whose runtime is gone: their reapers died with
        // it, so they are forgotten here (dropped outside the lock).
        let mut dead = Vec::new();
        {
            let mut held = lock(&self.held);
            for (i, lease) in leases.iter().enumerate() {
                let Some(h) = held.get(&lease.resource) else {
                    answers[i] = Some(Ok(Renewal::Refused));
                    continue;
                };
                if !h.session.is_alive() {
                    answers[i] = Some(Ok(Renewal::SessionExpired));
                    dead.extend(held.remove(&lease.resource));
                    continue;
                }
                if h.session.client.state().is_terminated() {
                    answers[i] = Some(Ok(Renewal::SessionExpired));
                    continue;
                }
                match groups.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &h.session)) {
                    Some((_, idx)) => idx.push(i),
                    None => groups.push((h.session.clone(), vec![i])),
                }
            }
        }
        drop(dead);
        let groups = groups
            .into_iter()
            .flat_map(|(session, idx)| {
                cut_into_reads(leases, &idx)
                    .into_iter()
                    .map(move |read| (session.clone(), read))
            })
            .collect();
        (answers, groups)
    }

    /// What the read of one node says of its lease; `framed` is when the
    /// read was sent and answered.
    fn renewal(
        &self,
        client: &Client,
        lease: &Lease,
        read: MultiReadResult,
        (sent, answered): (Instant, Instant),
    ) -> Result<Renewal, LockError> {
        match read {
            MultiReadResult::Data { stat, .. } if stat.ephemeral_owner == client.session_id().0 => {
                let timeout = client.session_timeout();
                Ok(Renewal::Renewed {
                    valid_until: lease::deadline(sent, answered, lease.ttl, timeout),
                })
            }
            // Not ours any more: the lease is lost.
            MultiReadResult::Data { .. } => Ok(Renewal::Refused),
            // Deleted, by an operator or with the session.
            MultiReadResult::Error {
                err: ZkError::NoNode,
            } => Ok(Renewal::Deleted),
            MultiReadResult::Error { err } => Err(self.error("renewal read failed", err)),
            other => Err(LockError::backend(
                self.shown.clone(),
                format!("renewal read got an unexpected answer: {other:?}"),
            )),
        }
    }

    /// A node reaped while the read was in flight stays lost; every other
    /// renewed node moves its deadline, under the same lock the reaper
    /// takes, so the two never disagree.
    fn keep_deadlines(&self, leases: &[Lease], answers: &mut Answers) {
        let mut held = lock(&self.held);
        for (lease, answer) in leases.iter().zip(answers.iter_mut()) {
            if let Some(Ok(Renewal::Renewed { valid_until })) = answer {
                match held.get_mut(&lease.resource) {
                    Some(h) => h.valid_until = h.valid_until.max(*valid_until),
                    None => *answer = Some(Ok(Renewal::Refused)),
                }
            }
        }
    }
}

/// Each session's reads behind one sync (see `after_sync`), all sent
/// before any answer is awaited. A session's requests are answered in the
/// order they were sent, so every read of a session comes after its sync;
/// its first read awaits the sync's answer and reports its failure (which
/// a lost connection gives the later reads too).
fn send_reads<'a>(leases: &[Lease], groups: &'a Groups) -> Vec<Read<'a>> {
    let mut reads: Vec<Read<'a>> = Vec::new();
    let mut synced_sessions: Vec<&Arc<Session>> = Vec::new();
    for (session, idx) in groups {
        let synced = if synced_sessions.iter().any(|s| Arc::ptr_eq(s, session)) {
            None
        } else {
            synced_sessions.push(session);
            Some(session.client.sync("/"))
        };
        let mut reader = session.client.new_multi_reader();
        let mut bad = None;
        for &i in idx {
            if let Err(e) = reader.add_get_data(&leases[i].resource) {
                bad = Some(e);
            }
        }
        reads.push(match bad {
            Some(e) => Box::pin(async move { Err(e) }),
            None => {
                let commit = reader.commit();
                Box::pin(async move {
                    if let Some(synced) = synced {
                        synced.await?;
                    }
                    commit.await
                })
            }
        });
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key_len: usize) -> Lease {
        let resource = format!("/dlock/{}/_c_x-lock-0000000001", "k".repeat(key_len));
        crate::backends::long_key_lease::long_key_lease(key_len, None, resource)
    }

    #[test]
    fn reads_stay_within_their_bounds_and_keep_every_lease_once() {
        for (count, key_len) in [(0, 1), (1, 1), (15_000, 10), (50_000, 40), (3_000, 512 * 3)] {
            let leases: Vec<Lease> = (0..count).map(|_| lease(key_len)).collect();
            let idx: Vec<usize> = (0..count).collect();
            let reads = cut_into_reads(&leases, &idx);
            let flat: Vec<usize> = reads.iter().flatten().copied().collect();
            assert_eq!(flat, idx, "every lease once, in order");
            for read in &reads {
                assert!(!read.is_empty() && read.len() <= MAX_READ_NODES);
                let bytes: usize = read.iter().map(|&i| read_cost(&leases[i])).sum();
                assert!(bytes <= MAX_READ_BYTES, "{count} x {key_len}: {bytes}");
            }
        }
    }
}
