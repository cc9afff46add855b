//! `Election` and `Leadership`: leader election on the lock of the
//! election's name, with the lease's fencing token as the term, and the
//! leader's value published through the backend's
//! [`ElectionBackend`](crate::backend::ElectionBackend) capability.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::Stream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{
    no_elections, ElectionBackend, LeaderChange, LeaderChanges, Lease, LockBackend,
};
use crate::lease::acquire::{self, take, Target};
use crate::lease::observe::{self, Kind};
use crate::lease::options::{lease_option_setters, LeaseOptions};
use crate::locks::guard::LockGuard;
use crate::{Leader, LockError};

/// A leader election: the name of what is led, and how to campaign for it.
///
/// Candidates [`campaign`](Election::campaign) with a value (an address, a
/// node name); one at a time is elected and holds a [`Leadership`] whose
/// [`term`](Leadership::term) is strictly greater than every earlier
/// leader's: a fencing token for whatever the leader writes. Anyone can ask
/// who leads ([`leader`](Election::leader)) or follow every change
/// ([`observe`](Election::observe)), from any process.
///
/// An election is the lock of its name: candidates queue for it like lock
/// waiters (locally in one process, woken by the server across processes),
/// the watchdog renews the leader's lease, and a leader that crashes or
/// stalls past its ttl is replaced. The options are [`Lock`](crate::Lock)'s.
///
/// | option | default |
/// |---|---|
/// | [`ttl`](Election::ttl) | 30 s, renewed every ttl/3 while the `Leadership` lives |
/// | [`wait`](Election::wait) | no limit: `campaign` waits until elected |
/// | [`renew`](Election::renew) | on |
/// | [`backend`](Election::backend) | the registry's default |
///
/// ```
/// use dlock::Election;
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// dlock::registry().set_default(dlock::connect("memory://").await?);
/// let election = Election::new("scheduler").ttl(Duration::from_secs(10));
/// let leadership = election.campaign("node-a:8080").await?;
/// let leader = election.leader().await?.expect("elected");
/// assert_eq!(leader.value, "node-a:8080");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign().await?;
/// assert_eq!(election.leader().await?, None);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    options: LeaseOptions,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.options.fmt(f)
    }
}

impl Election {
    /// The election `name`, with the default options. The name is checked
    /// when it is used, as a lock key is ([`LockError::InvalidKey`]).
    pub fn new(name: impl Into<String>) -> Self {
        Election {
            options: LeaseOptions::new(name.into()),
        }
    }

    lease_option_setters! {
        ttl: "The leader's lease length. With renewal on, the watchdog extends it
every ttl/3, so it bounds how long a crashed or stalled leader keeps the
others waiting; the stalled leader's [`Leadership::is_leader`] turns false
before the server lets anyone else in.",
        wait: "How long [`campaign`](Election::campaign) may wait to be elected.
`Duration::ZERO` makes one attempt and fails with [`LockError::Busy`] if
someone leads; by default it waits until elected.",
        renew: "Renewal by the watchdog (on by default). Off: the leadership ends
    after the ttl whatever the leader is doing, and `lost()` fires then.",
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.options.key
    }

    /// Campaigns with `value` (what [`leader`](Election::leader) shows: an
    /// address, a node name) and waits until elected, up to the configured
    /// [`wait`](Election::wait). Candidates of one process queue locally;
    /// across processes they are woken by the server when the leader
    /// resigns, and by the lease's expiry when it crashed.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, [`LockError::Busy`]
    /// when the wait is zero and someone leads, [`LockError::InvalidKey`]
    /// for an empty or invalid name, [`LockError::InvalidOption`] for a
    /// value longer than the backend stores, a value holding a NUL
    /// character (on every backend, before any request, so no term is used
    /// up), or a backend without leader
    /// election ([`no_elections`]), [`LockError::NoBackend`], and
    /// [`LockError::Backend`] when the service fails.
    ///
    /// # Cancel safety
    /// Dropping the future leaves no leadership: a lease granted at that
    /// moment is resigned in the background, and nothing stays queued.
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, LockError> {
        let value = value.into();
        let backend = self.resolve()?;
        let elections = capability(&backend)?;
        check_value(
            &self.options.key,
            &value,
            elections.max_value_bytes(),
            &*backend,
        )?;
        let span = observe::campaign_span(&self.options.key, &self.options.label());
        let elected = self.elect(backend, value).instrument(span.clone()).await;
        observe::campaigned(
            &span,
            &self.options.label(),
            &self.options.key,
            elected.as_ref().ok().map(Leadership::term),
        );
        let leadership = elected?;
        leadership.watch_for_loss();
        Ok(leadership)
    }

    /// The campaign itself: the lock of the name, then the record.
    async fn elect(
        &self,
        backend: Arc<dyn LockBackend>,
        value: String,
    ) -> Result<Leadership, LockError> {
        let elections = capability(&backend)?;
        let start = Instant::now();
        let give_up = self.options.wait.and_then(crate::backend::deadline::after);
        loop {
            let mut options = self.options.clone();
            if let Some(give_up) = give_up {
                options.wait = Some(give_up.saturating_duration_since(Instant::now()));
            }
            // Never reentrant: a campaign inside a held lock of the same
            // name would otherwise share that lock's lease.
            let target = if elections.own_layout() {
                Target::Election { value: &value }
            } else {
                Target::Lock
            };
            let guard = acquire::acquire(&options, Kind::Lock, |wait| {
                let taking = take(&options, backend.clone(), target, wait, Kind::Lock);
                async move { Ok(taking.await?.map(LockGuard::from)) }
            })
            .await?;
            let Some(term) = guard.fencing_token() else {
                return Err(no_elections(&backend.describe()));
            };
            let lease = lease_of(&guard);
            // From here a dropped future resigns in the background.
            let leadership = Leadership {
                guard: Some(guard),
                backend: backend.clone(),
                name: self.options.key.to_string(),
                term,
                value: Mutex::new(value.clone()),
                label: self.options.label(),
                ended: CancellationToken::new(),
            };
            let published = elections.own_layout() || elections.proclaim(&lease, &value).await?;
            if published && leadership.is_leader() {
                return Ok(leadership);
            }
            // Lost between the grant and the record (a lease that lapsed
            // at once): not handed over; campaign again within the wait.
            drop(leadership);
            if give_up.is_some_and(|at| at <= Instant::now()) {
                return Err(LockError::Timeout {
                    key: self.options.key.to_string(),
                    waited: start.elapsed(),
                });
            }
        }
    }

    /// Who leads now, read from the server: `None` when nobody does (no
    /// leader yet, the last one resigned, or its lease expired).
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign), but never `Busy` or `Timeout`.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        let backend = self.resolve()?;
        capability(&backend)?.leader(&self.options.key).await
    }

    /// Every change of who leads (or of the leader's value), as a stream:
    /// first the state when it starts, then each change as the backend
    /// announces it (a new leader, a [`proclaim`](Leadership::proclaim), a
    /// resignation), never a term older than one already seen. Woken by
    /// the server, not by polling.
    ///
    /// No term is missed, however short, on memory, Redis and etcd: they
    /// announce each leader with its record (term and value), kept for the
    /// stream until it is polled. Announcements are hints: one the backend
    /// does not confirm ([`ElectionBackend::confirm`]: Redis checks a list
    /// of what its scripts announced) is read instead, so a forged
    /// `PUBLISH` or `NOTIFY` never shows a leader nobody elected. On
    /// ZooKeeper, whose events carry no data, and on PostgreSQL, where any
    /// role may `NOTIFY`, each item is the state read after an event, so a
    /// leader whose whole term is shorter than one read may be skipped
    /// there (its successor is not). Several values proclaimed within one
    /// term may be seen as the last of them. A leader whose lease expired
    /// (a crash) is announced by its successor's election, not at the
    /// expiry. Transient backend errors are retried every second (with a
    /// `WARN` event); an invalid name, a missing backend or one without
    /// elections ends the stream at once (ask [`leader`](Election::leader)
    /// for the error).
    ///
    /// ```
    /// use dlock::Election;
    /// use futures_util::StreamExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
    /// let election = Election::new("compactor").with_backend(dlock::connect("memory://").await?);
    /// let mut changes = election.observe();
    /// assert_eq!(changes.next().await, Some(None)); // nobody leads yet
    /// let leadership = election.campaign("node-a").await?;
    /// let seen = changes.next().await.flatten().expect("a leader");
    /// assert_eq!((seen.value.as_str(), seen.term), ("node-a", leadership.term()));
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> impl Stream<Item = Option<Leader>> + Send + Unpin + 'static + use<> {
        let observer = Observer {
            election: self.clone(),
            watching: None,
            last: None,
            ended: 0,
        };
        Box::pin(futures_util::stream::unfold(
            observer,
            |mut observer| async move {
                let next = observer.next().await?;
                Some((next, observer))
            },
        ))
    }

    /// The backend, after checking the name and the options.
    fn resolve(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        if self.options.key.is_empty() {
            return Err(LockError::InvalidKey {
                key: String::new(),
                reason: "the election name is empty; name what is led, e.g. \"scheduler\"".into(),
            });
        }
        self.options.check()
    }
}

/// The backend's elections, or the error that names it.
fn capability(backend: &Arc<dyn LockBackend>) -> Result<&dyn ElectionBackend, LockError> {
    backend
        .election()
        .ok_or_else(|| no_elections(&backend.describe()))
}

/// A value the backend can store.
fn check_value(
    name: &str,
    value: &str,
    limit: usize,
    backend: &dyn LockBackend,
) -> Result<(), LockError> {
    if value.len() > limit {
        return Err(LockError::invalid_option(format!(
            "the value of election `{name}` is {} bytes, over the {limit}-byte limit of the {} backend; publish an address or a name, not a payload",
            value.len(),
            backend.describe()
        )));
    }
    // One rule on every backend: PostgreSQL's text cannot hold NUL, so no
    // backend takes it, and it is refused before a term is used up.
    if let Some(at) = value.find('\0') {
        return Err(LockError::invalid_option(format!(
            "the value of election `{name}` holds a NUL character (at byte {at}), which not every backend can store; publish text without NUL (encode binary data, e.g. as hex)"
        )));
    }
    Ok(())
}

/// Leadership of an [`Election`]: held while this lives, renewed by the
/// watchdog like a [`LockGuard`].
///
/// Dropping it resigns in the background, as dropping a guard releases;
/// [`resign`](Leadership::resign) does it now and reports the outcome.
/// `Send + Sync`, not `Clone`.
///
/// ```
/// use dlock::Election;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), dlock::LockError> {
/// let backend = dlock::connect("memory://").await?;
/// let election = Election::new("scheduler").with_backend(backend);
/// let leadership = election.campaign("node-a:8080").await?;
/// assert!(leadership.is_leader());
/// leadership.proclaim("node-a:9090").await?;   // same term, new value
/// let leader = election.leader().await?.unwrap();
/// assert_eq!((leader.value.as_str(), leader.term), ("node-a:9090", leadership.term()));
/// tokio::select! {
///     _ = leadership.lost() => { /* stop leading: another leader may exist now */ }
///     _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
/// }
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
pub struct Leadership {
    /// The lease on the election's name; `None` once resigned.
    guard: Option<LockGuard>,
    backend: Arc<dyn LockBackend>,
    name: String,
    term: u64,
    value: Mutex<String>,
    label: Arc<str>,
    /// Cancelled when the leadership is resigned or dropped: ends the task
    /// that reports a loss.
    ended: CancellationToken,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.name)
            .field("term", &self.term)
            .field("value", &self.value())
            .field("is_leader", &self.is_leader())
            .finish()
    }
}

impl Leadership {
    /// The lease on the election's name, until resigned (for `ensure`).
    pub(crate) fn lease_guard(&self) -> Option<&LockGuard> {
        self.guard.as_ref()
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The term: strictly greater than every earlier leader's term of this
    /// election (the lease's fencing token). Pass it with every write the
    /// leader makes, and let the storage refuse a smaller one than it has
    /// seen: a leader that stalled past its ttl cannot do harm then.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The value published now (the campaign's, or the last
    /// [`proclaim`](Leadership::proclaim)ed).
    pub fn value(&self) -> String {
        self.value.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// True while this process leads: false once the lease is lost (renewal
    /// refused, or the service unreachable until the lease could have
    /// expired: this turns false before the server can elect anyone else).
    pub fn is_leader(&self) -> bool {
        self.guard.as_ref().is_some_and(LockGuard::is_held)
    }

    /// Resolves when the leadership ends for any reason other than
    /// [`resign`](Leadership::resign): the lease lost or expired. Stop
    /// acting as the leader then.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static + use<> {
        let lost = self.guard.as_ref().map(LockGuard::lost);
        async move {
            match lost {
                Some(lost) => lost.await,
                None => std::future::pending().await,
            }
        }
    }

    /// Publishes `value` instead, with the same term.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the leadership has ended;
    /// [`LockError::InvalidOption`] for a value longer than the backend
    /// stores or holding a NUL character (refused on every backend, before
    /// any request); [`LockError::Backend`] when the service fails.
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<(), LockError> {
        let value = value.into();
        let elections = capability(&self.backend)?;
        check_value(
            &self.name,
            &value,
            elections.max_value_bytes(),
            &*self.backend,
        )?;
        let not_held = || LockError::NotHeld {
            key: self.name.clone(),
        };
        let Some(guard) = self.guard.as_ref().filter(|g| g.is_held()) else {
            return Err(not_held());
        };
        if !elections.proclaim(&lease_of(guard), &value).await? {
            return Err(not_held());
        }
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = value;
        Ok(())
    }

    /// Steps down now: the record is withdrawn (observers see nobody lead)
    /// and the lease released, so the next candidate is elected at once.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the leadership was already lost;
    /// [`LockError::Backend`] if the service failed (the lease then
    /// expires after its ttl).
    ///
    /// # Cancel safety
    /// If this future is dropped, the lease is still released in the
    /// background.
    pub async fn resign(mut self) -> Result<(), LockError> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        self.ended(&guard);
        let withdrawn = match capability(&self.backend) {
            Ok(elections) => elections.withdraw(&lease_of(&guard)).await,
            Err(e) => Err(e),
        };
        guard.release().await?;
        withdrawn
    }

    /// Reports the end of a leadership that was not lost (a loss reports
    /// itself: [`watch_for_loss`](Self::watch_for_loss)).
    fn ended(&self, guard: &LockGuard) {
        self.ended.cancel();
        if guard.is_held() {
            observe::leadership_ended(&self.label, &self.name, self.term, "resigned");
        }
    }

    /// Reports a loss when it happens: the `dlock_leader` gauge goes to 0
    /// then, not at the drop. The task ends with the leadership.
    fn watch_for_loss(&self) {
        let lost = self.lost();
        let ended = self.ended.clone();
        let (label, name, term) = (self.label.clone(), self.name.clone(), self.term);
        crate::lease::background::spawn_daemon(async move {
            tokio::select! {
                biased;
                () = lost => observe::leadership_ended(&label, &name, term, "lost"),
                () = ended.cancelled() => {}
            }
        });
    }
}

/// The lease of `guard` as the backend knows it now.
fn lease_of(guard: &LockGuard) -> Lease {
    guard.lease().lock_state().lease.clone()
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        self.ended(&guard);
        let lease = lease_of(&guard);
        let backend = self.backend.clone();
        // Withdrawn first, so observers never see a record outlive the
        // lease; if the background runtime is gone, the guard's own drop
        // releases and the record is left behind (no reader shows it: the
        // lease no longer holds the key).
        crate::lease::background::spawn(async move {
            if let Some(elections) = backend.election()
                && let Err(e) = elections.withdraw(&lease).await
            {
                tracing::debug!(error = %e, election = %lease.key, "withdrawing a dropped leadership's record failed; readers ignore it once the lease is gone");
            }
            drop(guard.release().await);
        });
    }
}

/// The state of one [`Election::observe`] stream.
struct Observer {
    election: Election,
    /// The backend and its announcements, once subscribed.
    watching: Option<(Arc<dyn LockBackend>, Box<dyn LeaderChanges>)>,
    /// What was yielded last.
    last: Option<Option<Leader>>,
    /// The highest term whose end was reported: an announcement of it
    /// again is a replay.
    ended: u64,
}

/// Whether the backend confirms that `leader` was announced by a leader.
async fn confirmed(backend: &Arc<dyn LockBackend>, name: &str, leader: &Leader) -> bool {
    confirms(backend, name, &LeaderChange::Elected(leader.clone())).await
}

/// Whether the backend confirms `change`; an error counts as no (the
/// observer reads then).
async fn confirms(backend: &Arc<dyn LockBackend>, name: &str, change: &LeaderChange) -> bool {
    let Some(elections) = backend.election() else {
        return false;
    };
    match elections.confirm(name, change).await {
        Ok(confirmed) => {
            if !confirmed {
                tracing::debug!(election = %name, ?change, "an announcement the backend does not confirm; reading the leader instead");
            }
            confirmed
        }
        Err(e) => {
            tracing::debug!(error = %e, election = %name, "confirming an announcement failed; reading the leader instead");
            false
        }
    }
}

impl Observer {
    /// The next change; `None` ends the stream (an error no retry mends).
    async fn next(&mut self) -> Option<Option<Leader>> {
        const RETRY: Duration = Duration::from_secs(1);
        let mut reread = self.watching.is_none();
        loop {
            if self.watching.is_none() {
                match self.subscribe().await {
                    Ok(watching) => self.watching = Some(watching),
                    Err(e) if is_final(&e) => {
                        tracing::warn!(error = %e, election = %self.election.name(), "observe() ends");
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, election = %self.election.name(), "observe() could not subscribe; retrying in 1 s");
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                }
            }
            let Some((backend, changes)) = self.watching.as_mut() else {
                continue;
            };
            let backend = backend.clone();
            if !reread {
                match changes.changed().await {
                    LeaderChange::Closed => {
                        // The watch ended (its session did): watch anew, then read.
                        self.watching = None;
                        reread = true;
                        continue;
                    }
                    LeaderChange::Unknown => {}
                    LeaderChange::Elected(leader) => match self.seen(&leader) {
                        Seen::Old => continue,
                        // Announcements are hints: one the backend does not
                        // confirm (forged, replayed, or too old for it to
                        // tell) is read instead.
                        Seen::New if confirmed(&backend, self.election.name(), &leader).await => {
                            return Some(self.yield_now(Some(leader)));
                        }
                        // A new value in the term already shown: read,
                        // since an announcement queued before this
                        // observer's last read may be older than it.
                        Seen::New | Seen::SameTerm => {}
                    },
                    LeaderChange::Ended { term } => {
                        if self.current_term().is_none_or(|now| now > term) {
                            continue;
                        }
                        let end = LeaderChange::Ended { term };
                        if confirms(&backend, self.election.name(), &end).await {
                            self.ended = self.ended.max(term);
                            return Some(self.yield_now(None));
                        }
                    }
                }
            }
            let elections = backend.election()?;
            match elections.leader(self.election.name()).await {
                Ok(now) => {
                    reread = false;
                    let older = match (&now, &self.last) {
                        (Some(now), Some(Some(last))) => now.term < last.term,
                        _ => false,
                    };
                    if now.is_none() {
                        // Nobody leads: the term shown last is over.
                        self.ended = self.ended.max(self.current_term().unwrap_or(0));
                    }
                    if self.last.as_ref() != Some(&now) && !older {
                        return Some(self.yield_now(now));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, election = %self.election.name(), "observe() could not read the leader; retrying in 1 s");
                    reread = true;
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// The term of the leader yielded last, if one leads in it.
    fn current_term(&self) -> Option<u64> {
        self.last.as_ref().and_then(|l| l.as_ref()).map(|l| l.term)
    }

    /// How an announced leader compares with what was yielded last.
    fn seen(&self, leader: &Leader) -> Seen {
        if leader.term <= self.ended {
            return Seen::Old;
        }
        match &self.last {
            Some(Some(last)) if last == leader => Seen::Old,
            Some(Some(last)) if leader.term < last.term => Seen::Old,
            Some(Some(last)) if leader.term == last.term => Seen::SameTerm,
            _ => Seen::New,
        }
    }

    fn yield_now(&mut self, now: Option<Leader>) -> Option<Leader> {
        self.last = Some(now.clone());
        now
    }

    async fn subscribe(&self) -> Result<(Arc<dyn LockBackend>, Box<dyn LeaderChanges>), LockError> {
        let backend = self.election.resolve()?;
        let changes = capability(&backend)?.watch(self.election.name()).await?;
        Ok((backend, changes))
    }
}

/// An announced leader against the last one yielded.
enum Seen {
    /// A later term (or the first leader seen).
    New,
    /// Already yielded, or an earlier term.
    Old,
    /// The term yielded last, with another value.
    SameTerm,
}

/// Whether retrying cannot help.
fn is_final(e: &LockError) -> bool {
    matches!(
        e,
        LockError::InvalidKey { .. }
            | LockError::InvalidOption { .. }
            | LockError::NoBackend { .. }
            | LockError::ShutDown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn handles_are_send_and_sync() {
        assert_send_sync::<Election>();
        assert_send_sync::<Leadership>();
    }
}
