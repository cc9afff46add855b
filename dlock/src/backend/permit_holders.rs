//! What an operator reads of a semaphore: its holders, each with how many
//! permits it holds, and the permit count stored on the server
//! ([`Semaphore::inspect`](crate::Semaphore::inspect),
//! [`list_semaphores`](crate::list_semaphores), `dlock list`).

/// One holder of a semaphore's permits.
///
/// ```
/// let h = dlock::inspect::PermitHolder::new(Some("billing-7".into()), None, 2);
/// assert_eq!((h.holder.as_deref(), h.count), (Some("billing-7"), 2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// The client name the holder wrote (`hostname:pid` by default,
    /// `?client_name=` on its URL), where the backend stores one with the
    /// permit (memory, Redis, etcd, ZooKeeper); never the owner token.
    pub holder: Option<String>,
    /// Where the backend stores no name, what the server knows of the
    /// holder: `pid 4711` (PostgreSQL's backend process, a file holder's
    /// process), `connection 12` (MySQL's connection id).
    pub session: Option<String>,
    /// How many permits it holds: 1, or n for `acquire_many(n)`.
    pub count: usize,
}

impl PermitHolder {
    /// A holder of `count` permits (for backends outside this crate).
    pub fn new(holder: Option<String>, session: Option<String>, count: usize) -> Self {
        PermitHolder {
            holder,
            session,
            count,
        }
    }
}

/// A semaphore as the server holds it now: one read, maybe stale by the
/// time it arrives.
///
/// ```
/// use dlock::inspect::{PermitHolder, SemaphoreInfo};
/// let info = SemaphoreInfo::new(Some(10), vec![PermitHolder::new(None, None, 4)]);
/// assert_eq!((info.held(), info.available()), (4, Some(6)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreInfo {
    /// The permit count its holders gave, as stored on the server; `None`
    /// when none is stored (nobody holds a permit: the next holder's count
    /// is the semaphore's).
    pub permits: Option<usize>,
    /// Who holds permits, most permits first (then by name).
    pub holders: Vec<PermitHolder>,
}

impl SemaphoreInfo {
    /// A semaphore stored with `permits` and held by `holders` (sorted here).
    pub fn new(permits: Option<usize>, mut holders: Vec<PermitHolder>) -> Self {
        holders.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.holder.cmp(&b.holder))
                .then_with(|| a.session.cmp(&b.session))
        });
        SemaphoreInfo { permits, holders }
    }

    /// How many permits are out, all holders together.
    pub fn held(&self) -> usize {
        self.holders.iter().map(|h| h.count).sum()
    }

    /// How many of the stored count are free (`None` without a stored count).
    pub fn available(&self) -> Option<usize> {
        self.permits.map(|p| p.saturating_sub(self.held()))
    }
}
