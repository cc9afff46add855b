//! The renewal of session keys: one keep-alive per session, then one read of
//! every key (cut into bounded reads), so a key deleted or recreated under a
//! live session is noticed; refusals named.

use std::sync::Arc;
use std::time::Instant;

use etcd_client::{GetOptions, Txn, TxnOp};

use super::client::{first_create_revision, revision_of_lease};
use super::refused::About;
use super::session::{Alive, Session};
use super::{EtcdBackend, Inner, MAX_READ_BYTES, READS_IN_FLIGHT, TXN_CHUNK};
use crate::backend::{Lease, Renewal};
use crate::LockError;

impl EtcdBackend {
    /// The renewal of session keys of any kind (locks, permits, read-write
    /// leases): one keep-alive per session, one read of every key.
    pub(super) async fn renew_any(&self, leases: &[Lease]) -> Vec<Result<Renewal, LockError>> {
        let inner = &self.inner;
        let sent = Instant::now();
        let sessions: Vec<Option<Arc<Session>>> =
            leases.iter().map(|l| inner.held_session(l)).collect();
        let mut distinct: Vec<Arc<Session>> = Vec::new();
        for session in sessions.iter().flatten() {
            if !distinct.iter().any(|s| Arc::ptr_eq(s, session)) {
                distinct.push(session.clone());
            }
        }
        // One keep-alive per session, and a check of every held key in the
        // same moment (reads, or the watch of deletes for many keys): a live
        // lease does not prove the key is still there.
        let keep_alives = async {
            let mut answers = Vec::with_capacity(distinct.len());
            for session in &distinct {
                answers.push(session.keep_alive(inner, sent).await);
            }
            answers
        };
        let (alive, present) = tokio::join!(keep_alives, inner.present_revisions(leases));
        leases
            .iter()
            .zip(&sessions)
            .enumerate()
            .map(|(i, (lease, session))| {
                let Some(session) = session else {
                    return Ok(Renewal::Refused);
                };
                let at = distinct
                    .iter()
                    .position(|s| Arc::ptr_eq(s, session))
                    .unwrap_or(0);
                let revision = revision_of_lease(lease);
                match (&alive[at], &present) {
                    (Ok(Alive::Gone), _) => Ok(inner.refused(lease, Renewal::SessionExpired)),
                    // The key's watcher saw it deleted or rewritten: final,
                    // whatever a read racing that event answered.
                    _ if inner.seen_lost(lease) => Ok(inner.refused(lease, Renewal::Deleted)),
                    (_, Ok(revisions)) if revisions[i] != revision => {
                        Ok(inner.refused(lease, Renewal::Deleted))
                    }
                    (Err(e), _) | (_, Err(e)) => Err(inner.error(e.to_string())),
                    (Ok(Alive::Yes), Ok(_)) => {
                        let valid_until = session.deadline(lease.ttl);
                        inner.renewed(lease, valid_until);
                        Ok(Renewal::Renewed { valid_until })
                    }
                }
            })
            .collect()
    }
}

impl Inner {
    /// Each failed renewal's error, explained if etcd refused it (see
    /// `refused.rs`).
    pub(super) fn name_refusals<'a>(
        &self,
        leases: &'a [Lease],
        renewed: Vec<Result<Renewal, LockError>>,
        about: impl Fn(&'a str) -> About<'a>,
    ) -> Vec<Result<Renewal, LockError>> {
        renewed
            .into_iter()
            .zip(leases)
            .map(|(r, lease)| r.map_err(|e| self.name_refusal(e, about(&lease.key))))
            .collect()
    }

    /// A renewal found `lease`'s key or session gone (`why`): nothing of it
    /// is left to delete, so its record goes now.
    pub(super) fn refused(&self, lease: &Lease, why: Renewal) -> Renewal {
        if let Some(revision) = revision_of_lease(lease) {
            self.forget(&lease.resource, revision);
        }
        why
    }

    /// The create revision of each lease's key (`None`: the key is gone),
    /// read in transactions of bounded size ([`cut_into_reads`]), a few in
    /// flight at once.
    pub(super) async fn read_revisions(
        &self,
        leases: &[Lease],
    ) -> Result<Vec<Option<i64>>, LockError> {
        use futures_util::stream::{self, StreamExt, TryStreamExt};
        // The futures made up front (they send nothing until polled): a
        // closure inside the stream would make `renew`'s future lose `Send`.
        let reads: Vec<_> = cut_into_reads(leases)
            .into_iter()
            .map(|chunk| self.read_chunk(chunk))
            .collect();
        let answers: Vec<Vec<Option<i64>>> = stream::iter(reads)
            .buffered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(answers.into_iter().flatten().collect())
    }

    /// One renewal read: the create revision of each key of `chunk`.
    pub(super) async fn read_chunk(&self, chunk: &[Lease]) -> Result<Vec<Option<i64>>, LockError> {
        // Keys only: the create revision is all a renewal needs, and the
        // values (holder names) need not cross the wire.
        let gets: Vec<TxnOp> = chunk
            .iter()
            .map(|l| {
                TxnOp::get(
                    l.resource.as_str(),
                    Some(GetOptions::new().with_keys_only()),
                )
            })
            .collect();
        let answer = self.txn(Txn::new().and_then(gets)).await?;
        let ops = answer.op_responses();
        Ok((0..chunk.len())
            .map(|i| first_create_revision(ops.get(i)))
            .collect())
    }
}

/// What reading one key adds to a renewal read, in bytes: its name in the
/// request and in the answer, with the framing of one operation and the
/// answer's revisions, version and lease (generous).
fn read_cost(lease: &Lease) -> usize {
    2 * lease.resource.len() + 64
}

/// Cuts `leases` into runs, in order, of at most [`TXN_CHUNK`] keys and
/// [`MAX_READ_BYTES`] each (a key alone over the bytes goes alone).
fn cut_into_reads(leases: &[Lease]) -> Vec<&[Lease]> {
    let mut reads = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, lease) in leases.iter().enumerate() {
        let cost = read_cost(lease);
        if i > start && (i - start == TXN_CHUNK || bytes + cost > MAX_READ_BYTES) {
            reads.push(&leases[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += cost;
    }
    if start < leases.len() {
        reads.push(&leases[start..]);
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(key_len: usize) -> Lease {
        let resource = format!("dlock/{}/694d9a3f1c2b0a17", "k".repeat(key_len));
        crate::backends::long_key_lease::long_key_lease(key_len, Some(7), resource)
    }

    #[test]
    fn renewal_reads_stay_within_their_bounds_and_keep_every_lease_once() {
        // Up to the longest key: 512 bytes, every one escaped to three.
        for (count, key_len) in [(0, 1), (1, 1), (63, 10), (50_000, 40), (3_000, 512 * 3)] {
            let leases: Vec<Lease> = (0..count).map(|_| lease(key_len)).collect();
            let reads = cut_into_reads(&leases);
            assert_eq!(
                reads.iter().map(|r| r.len()).sum::<usize>(),
                count,
                "every lease once"
            );
            let mut at = 0;
            for read in &reads {
                assert!(
                    std::ptr::eq(read.as_ptr(), leases[at..].as_ptr()),
                    "in order"
                );
                at += read.len();
                assert!(!read.is_empty() && read.len() <= TXN_CHUNK);
                let bytes: usize = read.iter().map(read_cost).sum();
                assert!(bytes <= MAX_READ_BYTES, "{count} x {key_len}: {bytes}");
            }
        }
        // Long keys cut reads by bytes before the count does.
        let long: Vec<Lease> = (0..200).map(|_| lease(512 * 3)).collect();
        assert!(cut_into_reads(&long).iter().all(|r| r.len() < TXN_CHUNK));
    }
}
