//! The requests to etcd: one call bounded by the request timeout and sent
//! again to another member when one is unreachable, the error mapping, and
//! the names of a key's queue.

use std::time::Duration;

use etcd_client::{Txn, TxnOpResponse, TxnResponse};

use super::names::{self, Kind};
use super::Inner;
use crate::backend::silence::SILENT_FOR;
use crate::backend::Lease;
use crate::LockError;

/// How many members a request tries when it cannot reach one (a 3- or
/// 5-member cluster with one or two members down).
pub(super) const UNREACHABLE_TRIES: u32 = 4;

impl Inner {
    pub(super) fn error(
        &self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> LockError {
        LockError::backend(self.shown.clone(), source)
    }

    /// The root of every name of `kind` (see `names.rs`).
    pub(super) fn root(&self, kind: Kind) -> String {
        names::root(&self.prefix, kind)
    }

    /// `<root of kind><escaped name>`: the prefix of the keys of one name
    /// (see `names.rs` for the escaping).
    pub(super) fn prefix_of(&self, kind: Kind, name: &str) -> String {
        format!("{}{}", self.root(kind), names::escape(name))
    }

    /// `<prefix>/<escaped key>/`: the directory of a key's queue.
    pub(super) fn dir_of(&self, key: &str) -> String {
        format!("{}/", self.prefix_of(Kind::Lock, key))
    }

    /// `<prefix>/<escaped key>/<lease-hex>`: our entry in the queue, as
    /// `etcdctl` names it.
    pub(super) fn entry_of(&self, key: &str, lease: i64) -> String {
        format!("{}{lease:x}", self.dir_of(key))
    }

    /// One request, bounded by the request timeout, and tried again on
    /// another member when the first one could not be reached.
    ///
    /// The client spreads requests over the members at random and keeps
    /// trying a dead one; a request that never reached a member was not
    /// applied, so sending it again is safe.
    pub(super) async fn rpc<T, F, Fut>(&self, mut call: F) -> Result<T, LockError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 0u32;
        loop {
            let error = match tokio::time::timeout(self.timeout, call()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => e,
                Err(_) => {
                    let silent = format!("no answer within {:?}", self.timeout);
                    return Err(self.error(crate::backend::transient::Transient::new(silent)));
                }
            };
            attempt += 1;
            if attempt >= UNREACHABLE_TRIES || !unreachable(&error) {
                return Err(self.error(error));
            }
            tokio::time::sleep(Duration::from_millis(10) * attempt).await;
        }
    }

    /// Whether etcd answers a read (a count of the lock keys, one request,
    /// not sent again) within [`SILENT_FOR`]: asked when a wait ran out
    /// with a request of it unanswered, to tell an outage (`Backend`) from
    /// a slow answer on a live server (`Timeout`); see `backend/silence.rs`.
    /// A read, not the write the wait was waiting on: a loaded member may
    /// take long to sync a write to disk, a read it answers at once.
    pub(super) async fn answers_a_read(&self) -> bool {
        let mut kv = self.client.kv_client();
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only()
            .with_limit(1);
        let read = kv.get(self.root(Kind::Lock), Some(options));
        match tokio::time::timeout(SILENT_FOR, read).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => !unreachable(&e),
            Err(_) => false,
        }
    }

    /// The error of a wait that ran out with a request unanswered for
    /// `silent`, on a server that did not answer a read either.
    pub(super) fn silent_at_deadline(&self, silent: Option<Duration>) -> LockError {
        let asked = silent.map_or_else(String::new, |s| format!(" for {s:?}"));
        self.error(crate::backend::transient::Transient::new(format!(
            "etcd did not answer{asked}, nor a read within {SILENT_FOR:?}, when the wait ran out (a member paused or cut off?)"
        )))
    }

    /// One transaction (see [`Inner::rpc`] for when it is sent again).
    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse, LockError> {
        self.rpc(|| {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }
}

/// Whether the request failed to reach a member (connection refused or
/// reset, no leader reachable), as opposed to an answer from etcd.
pub(super) fn unreachable(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // gRPC `UNAVAILABLE` (code 14): tonic's code for a failed connection,
        // and etcd's for "leader changed" or "no leader" (not applied).
        // tonic reports a connection that broke under a request as `UNKNOWN`
        // "transport error".
        etcd_client::Error::GRpcStatus(status) => {
            status.code() as i32 == 14 || status.message() == "transport error"
        }
        _ => false,
    }
}

/// Whether etcd said the lease does not exist (expired or revoked).
pub(super) fn lease_not_found(error: &LockError) -> bool {
    let LockError::Backend { source, .. } = error else {
        return false;
    };
    match source.downcast_ref::<etcd_client::Error>() {
        // etcd's own message for ErrLeaseNotFound (gRPC NotFound).
        Some(etcd_client::Error::GRpcStatus(status)) => {
            status.message().contains("requested lease not found")
        }
        Some(etcd_client::Error::LeaseKeepAliveError(message)) => message.contains("not found"),
        _ => false,
    }
}

/// The revision of the store when etcd answered.
pub(super) fn revision_of(answer: &TxnResponse) -> Option<i64> {
    answer.header().map(|h| h.revision())
}

/// The create revision of the first key a get in a transaction returned.
pub(super) fn first_create_revision(op: Option<&TxnOpResponse>) -> Option<i64> {
    match op {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(|kv| kv.create_revision()),
        _ => None,
    }
}

/// The create revision a lease's key was made at (kept in its fencing token).
pub(super) fn revision_of_lease(lease: &Lease) -> Option<i64> {
    lease.fencing_token.and_then(|t| i64::try_from(t).ok())
}
