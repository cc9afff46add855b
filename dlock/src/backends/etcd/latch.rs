//! Count-down latches on etcd: the count is the key
//! `<prefix>-latches/<escaped name>`, which exists only while the count is
//! live (deleted when it reaches zero). `try_set_count` puts it where none
//! is (one transaction: `version = 0`); `count_down` is a compare-and-swap
//! on its `mod_revision`, tried again when another writer came first.
//!
//! Waiters watch the key; the waiters of one name in one backend share one
//! watch (one stream, opened by the first, closed with the last), whose
//! events bump a generation they wait on. A waiter opens or joins the watch
//! before it reads the count, so a count-down between its read and its wait
//! is not missed.

use std::sync::{Arc, Weak};
use std::time::Instant;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::sync::oneshot;

use super::{names, EtcdBackend, Inner};
use crate::backend::LatchBackend;
use crate::backends::shared_watches::SharedWatch;
use crate::LockError;

/// How many times a count-down is tried against other writers before it
/// gives up (each try is one read and one transaction).
const COUNT_DOWN_TRIES: usize = 1000;

impl Inner {
    fn latch_key(&self, name: &str) -> String {
        format!("{}-latches/{}", self.prefix, names::escape(name))
    }

    /// The count and the key's `mod_revision` (0 when unset).
    async fn latch_read(&self, key: &str) -> Result<(u64, i64), LockError> {
        let answer = self
            .rpc(|| {
                let mut kv = self.client.kv_client();
                let key = key.to_owned();
                async move { kv.get(key, None::<GetOptions>).await }
            })
            .await?;
        Ok(answer.kvs().first().map_or((0, 0), |kv| {
            let count = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
            (count, kv.mod_revision())
        }))
    }

    /// The shared watch of `key`, open.
    async fn latch_watch(self: &Arc<Self>, key: &str) -> Result<Arc<SharedWatch>, LockError> {
        let open = |shared| self.open_latch_watch(key, shared);
        self.latch_watches.join(key, open).await
    }

    async fn open_latch_watch(
        self: &Arc<Self>,
        key: &str,
        shared: Weak<SharedWatch>,
    ) -> Result<oneshot::Sender<()>, LockError> {
        let mut stream = self
            .rpc(|| {
                let mut watches = self.client.watch_client();
                let key = key.to_owned();
                async move { watches.watch(key, None).await }
            })
            .await?;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let inner = Arc::downgrade(self);
        let key = key.to_owned();
        crate::lease::background::spawn_daemon(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    message = stream.message() => {
                        let Some(shared) = shared.upgrade() else { break };
                        if !matches!(message, Ok(Some(_))) {
                            // The stream ended: the next waiter opens another.
                            if let Some(inner) = inner.upgrade() {
                                inner.latch_watches.forget(&key, &shared);
                            }
                            shared.bump();
                            break;
                        }
                        shared.bump();
                    }
                }
            }
        });
        Ok(stop)
    }
}

#[async_trait]
impl LatchBackend for EtcdBackend {
    async fn try_set_count(&self, name: &str, count: u64) -> Result<bool, LockError> {
        let key = self.inner.latch_key(name);
        let txn = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), count.to_string(), None)]);
        Ok(self.inner.txn(txn).await?.succeeded())
    }

    async fn count_down(&self, name: &str) -> Result<(), LockError> {
        let key = self.inner.latch_key(name);
        for _ in 0..COUNT_DOWN_TRIES {
            let (count, revision) = self.inner.latch_read(&key).await?;
            if revision == 0 {
                return Ok(());
            }
            let when = [Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )];
            let then = if count <= 1 {
                TxnOp::delete(key.as_str(), None)
            } else {
                TxnOp::put(key.as_str(), (count - 1).to_string(), None)
            };
            if self
                .inner
                .txn(Txn::new().when(when).and_then([then]))
                .await?
                .succeeded()
            {
                return Ok(());
            }
        }
        Err(self.inner.error(format!(
            "count_down of latch `{name}` lost {COUNT_DOWN_TRIES} compare-and-swaps in a row to other writers"
        )))
    }

    async fn count(&self, name: &str) -> Result<u64, LockError> {
        Ok(self.inner.latch_read(&self.inner.latch_key(name)).await?.0)
    }

    async fn wait_zero(&self, name: &str, deadline: Option<Instant>) -> Result<bool, LockError> {
        let key = self.inner.latch_key(name);
        if self.inner.latch_read(&key).await?.0 == 0 {
            return Ok(true);
        }
        let waited = crate::backend::deadline::until(deadline, async {
            loop {
                let shared = self.inner.latch_watch(&key).await?;
                let mut changes = shared.subscribe();
                if self.inner.latch_read(&key).await?.0 == 0 {
                    return Ok::<(), LockError>(());
                }
                let _ = changes.changed().await;
            }
        })
        .await;
        match waited {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }
}
