//! `?compaction=`: dlock compacts the cluster's history itself, for a
//! cluster nobody else compacts (issue 68).
//!
//! etcd keeps every revision until it is compacted, and 3.4 does not
//! compact by default: under lock traffic the database grows until the
//! quota is full and every write fails (the backends guide has the
//! figures). The right fix is the server's own
//! `--auto-compaction-retention`; this option is for those who cannot set
//! it (a managed cluster, a development one).
//!
//! Rule: every `retention` the backend reads the cluster's current revision
//! and compacts up to the revision it read one period earlier, so history
//! younger than `retention` is always kept (between one and two periods
//! of it). A compaction is cluster-wide, so several processes with the
//! option each compact; a compaction to a revision already compacted is
//! etcd's `ErrCompacted`, harmless and not reported. A refused one (a role
//! without the permission) is a `WARN` event once, and the task ends. Any
//! other failure (an outage) is retried at the next period.
//!
//! Compaction does not break dlock: a watcher that starts in compacted
//! history is cancelled by etcd and rings the loss alarm, so the renewal
//! reads the held keys (see `key_watch.rs`); history younger than the
//! retention, which every live waiter's watch starts in, is kept.
//!
//! The task holds only a weak reference to the backend: it ends at the
//! first period after the backend is dropped.

use std::sync::Weak;
use std::time::Duration;

use etcd_client::{CompactionOptions, GetOptions};

use super::Inner;

/// Starts the compaction task of `inner` with history kept `retention`.
pub(super) fn start(inner: Weak<Inner>, retention: Duration) {
    crate::lease::background::spawn_daemon(compact_every(inner, retention));
}

async fn compact_every(inner: Weak<Inner>, retention: Duration) {
    // The revision read at the previous period: compacted to at this one.
    let mut previous: Option<i64> = None;
    loop {
        tokio::time::sleep(retention).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let now = match current_revision(&inner).await {
            Ok(revision) => revision,
            Err(e) => {
                tracing::debug!(error = %e, backend = %inner.shown, "etcd compaction: no revision read; trying again next period");
                continue;
            }
        };
        if let Some(to) = previous.filter(|&to| to > 0 && to < now) {
            match compact(&inner, to).await {
                Outcome::Done | Outcome::AlreadyCompacted => {
                    tracing::debug!(revision = to, backend = %inner.shown, "etcd history compacted");
                }
                Outcome::Refused(why) => {
                    tracing::warn!(
                        backend = %inner.shown,
                        error = %why,
                        "dlock: etcd refused to compact its history (?compaction=): give the role the permission, \
                         or drop the option and run etcd with --auto-compaction-retention"
                    );
                    return;
                }
                Outcome::Failed(why) => {
                    tracing::debug!(error = %why, backend = %inner.shown, "etcd compaction failed; trying again next period");
                    continue;
                }
            }
        }
        previous = Some(now);
    }
}

/// The cluster's current revision, from a count-only read of the prefix.
async fn current_revision(inner: &Inner) -> Result<i64, crate::LockError> {
    let key = format!("{}/", inner.prefix);
    let answer = inner
        .rpc(|| {
            let mut kv = inner.client.kv_client();
            let key = key.clone();
            async move {
                let options = GetOptions::new().with_prefix().with_count_only();
                kv.get(key, Some(options)).await
            }
        })
        .await?;
    Ok(answer.header().map_or(0, |h| h.revision()))
}

enum Outcome {
    Done,
    AlreadyCompacted,
    Refused(String),
    Failed(String),
}

async fn compact(inner: &Inner, to: i64) -> Outcome {
    let mut kv = inner.client.kv_client();
    let sent = kv.compact(to, Some(CompactionOptions::new()));
    match tokio::time::timeout(inner.timeout, sent).await {
        Ok(Ok(_)) => Outcome::Done,
        Ok(Err(etcd_client::Error::GRpcStatus(status))) => {
            let message = status.message().to_owned();
            // gRPC codes: OUT_OF_RANGE (11) is etcd's ErrCompacted ("mvcc:
            // required revision has been compacted"), PERMISSION_DENIED (7)
            // and UNAUTHENTICATED (16) a role or user that may not.
            match status.code() as i32 {
                11 if message.contains("compacted") => Outcome::AlreadyCompacted,
                7 | 16 => Outcome::Refused(message),
                _ => Outcome::Failed(message),
            }
        }
        Ok(Err(e)) => Outcome::Failed(e.to_string()),
        Err(_) => Outcome::Failed(format!("no answer within {:?}", inner.timeout)),
    }
}
