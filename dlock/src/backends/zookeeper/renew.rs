//! Renewal of ZooKeeper leases: one read of the held nodes per session,
//! behind a `sync`, and each node's answer turned into a renewal. The
//! session's heartbeat keeps the nodes; the read proves they are still ours.

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

/// One answer per lease, filled in as they come.
type Answers = Vec<Option<Result<Renewal, LockError>>>;

/// The leases (by index) to read on each session.
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

/// Each session's read behind a sync (see `after_sync`), all sent before
/// any answer is awaited.
fn send_reads<'a>(leases: &[Lease], groups: &'a Groups) -> Vec<Read<'a>> {
    let mut reads: Vec<Read<'a>> = Vec::new();
    for (session, idx) in groups {
        let synced = session.client.sync("/");
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
                    synced.await?;
                    commit.await
                })
            }
        });
    }
    reads
}
