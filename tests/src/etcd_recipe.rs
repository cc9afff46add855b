//! What a Go service using etcd's recipe `RWMutex`
//! (`client/v3/experimental/recipes`, rwmutex.go and key.go) sends to etcd,
//! request by request, with the etcd-client crate: Go is not on this
//! machine, so the read-write interop tests write and wait as the recipe
//! does instead of running it. It follows the recipe's rules, it is not the
//! recipe; dlock::guide::interop says so.
//!
//! The recipe, for `NewRWMutex(session, prefix)`:
//! - `RLock`/`Lock` create `<prefix>/read/<UnixNano>` or
//!   `<prefix>/write/<UnixNano>`, value `""`, on the session's lease, by a
//!   transaction `If(Version(key) == 0).Then(Put)` (another nanosecond if
//!   the name exists); the transaction's revision is "my revision".
//! - Then, until nothing is found: get the key with the largest mod
//!   revision below my revision under `<prefix>/write` (a reader) or
//!   `<prefix>/` (a writer), and wait for its DELETE from my revision on.
//! - `RUnlock`/`Unlock` delete the own key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchOptions,
};

/// How long one request of the emulated Go client may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);

/// `request`, bounded by [`REQUEST_LIMIT`]; panics naming `what` if it
/// fails or takes longer.
async fn bounded<T>(
    what: &str,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> T {
    match tokio::time::timeout(REQUEST_LIMIT, request).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what}: no answer within {REQUEST_LIMIT:?}"),
    }
}

/// A Go `concurrency.Session`: a client and one lease.
pub struct GoSession {
    client: Client,
    lease: i64,
}

impl GoSession {
    /// Connects to the etcd of a dlock URL (`etcd://host:port[,..]`) and
    /// grants a lease of `ttl_secs`, as `concurrency.NewSession(client,
    /// concurrency.WithTTL(ttl_secs))` does (no keep-alive: tests are shorter
    /// than the ttl).
    pub async fn start(url: &str, ttl_secs: i64) -> Self {
        let endpoints: Vec<String> = url
            .trim_start_matches("etcd://")
            .split(',')
            .map(str::to_owned)
            .collect();
        let mut client = bounded("connect to etcd", Client::connect(&endpoints, None)).await;
        let lease = bounded("grant a lease", client.lease_grant(ttl_secs, None))
            .await
            .id();
        GoSession { client, lease }
    }

    /// The session's lease id.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// `recipe.NewRWMutex(session, prefix)`.
    pub fn rw_mutex(&self, prefix: &str) -> GoRwMutex {
        GoRwMutex {
            client: self.client.clone(),
            lease: self.lease,
            pfx: format!("{prefix}/"),
        }
    }
}

/// A Go `recipe.RWMutex` on one prefix.
pub struct GoRwMutex {
    client: Client,
    lease: i64,
    /// The prefix plus `/`, as `NewRWMutex` keeps it.
    pfx: String,
}

/// A key the Go side created: `RLock`'s or `Lock`'s, held or waiting.
#[derive(Debug, Clone)]
pub struct GoKey {
    /// The etcd key.
    pub key: String,
    /// "my revision": the revision of the creating transaction.
    pub revision: i64,
    /// Whether it is a writer's key.
    pub write: bool,
}

impl GoRwMutex {
    /// The first half of `RLock` (`write` false) or `Lock` (`write` true):
    /// `newUniqueEphemeralKey(session, pfx + "read" | "write")`.
    pub async fn create(&self, write: bool) -> GoKey {
        let kind = if write { "write" } else { "read" };
        let mut kv = self.client.kv_client();
        for _ in 0..100 {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("a clock after 1970")
                .as_nanos();
            let key = format!("{}{kind}/{nanos}", self.pfx);
            let txn = Txn::new()
                .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(self.lease)),
                )]);
            let answer = bounded("the recipe's create transaction", kv.txn(txn)).await;
            if answer.succeeded() {
                let revision = answer.header().expect("a header").revision();
                return GoKey {
                    key,
                    revision,
                    write,
                };
            }
        }
        panic!("100 names under {} were all taken", self.pfx);
    }

    /// `waitOnLastRev`'s read: the key `mine` waits for now, if any.
    pub async fn blocker(&self, mine: &GoKey) -> Option<String> {
        let prefix = if mine.write {
            self.pfx.clone()
        } else {
            format!("{}write", self.pfx)
        };
        // v3.WithLastRev() + v3.WithMaxModRev(rev - 1)
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(1)
            .with_max_mod_revision(mine.revision - 1);
        let mut kv = self.client.kv_client();
        let answer = bounded(
            "the recipe's read of the key in the way",
            kv.get(prefix, Some(options)),
        )
        .await;
        answer
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
    }

    /// The second half of `RLock`/`Lock`: read the key in the way and wait
    /// for its DELETE from my revision on, until nothing is in the way.
    /// Panics if that takes longer than `limit`.
    pub async fn wait_until_held(&self, mine: &GoKey, limit: Duration) {
        tokio::time::timeout(limit, async {
            while let Some(blocker) = self.blocker(mine).await {
                let options = WatchOptions::new().with_start_revision(mine.revision);
                let mut watches = self.client.watch_client();
                let mut stream = bounded(
                    "the recipe's watch",
                    watches.watch(blocker.as_str(), Some(options)),
                )
                .await;
                'events: while let Some(answer) = stream.message().await.expect("watch events") {
                    if answer
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                    {
                        break 'events;
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the Go-style waiter {} did not hold within {limit:?}",
                mine.key
            )
        });
    }

    /// `RUnlock`/`Unlock`: delete the own key.
    pub async fn unlock(&self, mine: &GoKey) {
        let mut kv = self.client.kv_client();
        bounded("the recipe's delete", kv.delete(mine.key.as_str(), None)).await;
    }
}
