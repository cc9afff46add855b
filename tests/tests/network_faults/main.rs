//! Networks that fail quietly (issue 52), on real servers behind a fault
//! proxy, with one backend object kept for the whole test as an application
//! keeps it:
//!
//! - **flows frozen**: every open connection silently dead (a NAT or load
//!   balancer forgot the flows), new connections pass. The same backend
//!   object works again, without a new `connect`, and keeps working for
//!   calls that do not wait (so its connection was replaced, not waited
//!   out);
//! - **traffic held 8 s** while an acquisition with a 20 s wait is under
//!   way (a lock, a write lock, a permit, an election campaign): granted
//!   once the network is back, not failed at the first request timeout;
//! - **traffic held 1 s, then 3 s, then 10 s**: a lock waiting 20 s is
//!   granted after each; a free key tried without a wait is granted late or
//!   fails as an outage, never reported held;
//! - **3 s of discarded bytes, 3 s of resets** (every connection, new
//!   ones too) during a 20 s wait: granted once the network is back;
//! - **a held lock through a 3 s pause** over its first renewal: still
//!   held, `lost()` never fired;
//! - **a server restart during a wait**: the waiter is served once the
//!   server is back, with no error.
//!
//! On one Redis server, a Cluster (each node announces its proxy's port),
//! Sentinel (the sentinels watch the master through its proxy), Redlock,
//! PostgreSQL, etcd and ZooKeeper. Each test prints how long the service
//! took to come back: the figures of the reliability guide's table.

mod enqueue;
mod late_answers;
mod matrix;
mod outages;
mod proxied;
mod restarts;
mod stopped_servers;

use std::sync::Arc;
use std::time::Duration;

use dlock::LockBackend;

/// Far longer than any fault here: an acquisition that fails meanwhile
/// fails the test; one still waiting at the end fails it too.
const WAIT: Duration = Duration::from_secs(20);

async fn connect(url: &str) -> Arc<dyn LockBackend> {
    dlock::connect(url)
        .await
        .expect("connect through the proxy")
}
