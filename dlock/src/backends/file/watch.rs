//! Waking waiters when a lock file may have been let go: one inotify
//! instance for the process (Linux allows 128 per user by default, so not
//! one per backend or waiter), a watch per lock file someone waits on, and
//! a `Notify` per watch that the reader task wakes on every event.
//!
//! The events that may mean "free now": `IN_CLOSE_WRITE` and
//! `IN_CLOSE_NOWRITE` (a holder closed its descriptor: dlock's release,
//! `flock(1)`'s exit, and the kernel's closing of a killed process's
//! files, which is also when a dead holder's lock goes), `IN_ATTRIB`,
//! `IN_DELETE_SELF` and `IN_MOVE_SELF` (the file was removed or replaced:
//! the waiter opens the new one). A waiter tries again on each, and once a
//! second without one (a `flock -u` that unlocks without closing sends
//! nothing). Events for other closes (another waiter giving up) are only
//! an extra try.
//!
//! Holders watch too (`LossWatch`): the inode of each lock file they
//! hold, and their backend's directory, each reached through
//! `/proc/self/fd/N` so the watch is on the very file held, not whatever
//! is at the name now. An attribute change (`rm` drops the link count),
//! `IN_MOVE_SELF` (`mv`), `IN_DELETE_SELF`, the watch dropped or the file
//! system unmounted ring the holder's backend's loss alarm
//! (`LockBackend::loss_alarm`): the watchdog renews at once and the
//! renewal, finding the file gone or replaced, reports the lease lost.
//! Every watch is added with `IN_MASK_ADD`, so a holder's, a waiter's and
//! an election observer's interests in one inode add up instead of
//! replacing each other.
//!
//! The reader is one thread of the process (`dlock-file-watch`), blocked
//! in `read(2)` on the inotify descriptor: it needs no runtime, wakes
//! waiters on whatever runtime they wait, and lives until `dlock::shutdown`
//! ([`stop`]) once a waiter has started it. If it cannot run (no thread, an
//! instance refused, after `shutdown`), waiters still try every second.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use tokio::sync::Notify;

/// The process's watcher, replaced if its reader stopped.
static WATCHER: Mutex<Option<Arc<Watcher>>> = Mutex::new(None);

/// Set by [`stop`] (`dlock::shutdown`): no new instance is started; waiters
/// left try every second.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// One inotify instance and the watches on it.
#[derive(Debug)]
pub(super) struct Watcher {
    fd: OwnedFd,
    watches: Mutex<HashMap<i32, Watched>>,
    /// Cleared when the reader thread ends (an error it cannot pass).
    reading: AtomicBool,
    /// Set by [`stop`]: the reader returns at its next event.
    stopping: AtomicBool,
}

#[derive(Debug)]
struct Watched {
    /// How many [`Watch`]es share the watch descriptor (one inode: every
    /// add of it answers the same descriptor).
    users: usize,
    notify: Arc<Notify>,
    /// How many events the watch has had: what an election observer
    /// compares, since a `Notify` wakes only the tasks waiting right then.
    events: Arc<AtomicU64>,
    /// The loss alarms of the holders watching this inode, by [`LossWatch`]
    /// id, rung on the events that may mean "not yours any more".
    alarms: Vec<(u64, Alarm)>,
}

/// A backend's loss alarm (`LockBackend::loss_alarm`).
pub(super) type Alarm = Arc<tokio::sync::watch::Sender<u64>>;

/// Raises `alarm`: its watchdog renews every lease of the backend now.
pub(super) fn ring(alarm: &Alarm) {
    alarm.send_modify(|n| *n = n.wrapping_add(1));
}

/// The ids of [`LossWatch`]es.
static NEXT_LOSS_WATCH: AtomicU64 = AtomicU64::new(0);

impl Watched {
    /// Counts an event and wakes the waiters.
    fn woken(&self) {
        self.events.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Rings the holders' alarms on an event that may mean a loss.
    fn maybe_lost(&self, flags: ReadFlags) {
        if flags.intersects(loss_events()) {
            self.alarms.iter().for_each(|(_, alarm)| ring(alarm));
        }
    }
}

/// A waiter's interest in one lock file; the watch goes when the last
/// interest in it is dropped.
#[derive(Debug)]
pub(super) struct Watch {
    watcher: Arc<Watcher>,
    wd: i32,
    notify: Arc<Notify>,
    events: Arc<AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is one map operation.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The flags of every watch.
fn events() -> WatchFlags {
    WatchFlags::CLOSE_WRITE
        | WatchFlags::CLOSE_NOWRITE
        | WatchFlags::ATTRIB
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
}

/// The events of a held file or directory that may mean it is no longer
/// the one at its name: removed (the link count, an attribute, drops),
/// moved, deleted, chmod/chown'ed, its watch gone, its file system
/// unmounted.
fn loss_events() -> ReadFlags {
    ReadFlags::ATTRIB
        | ReadFlags::MOVE_SELF
        | ReadFlags::DELETE_SELF
        | ReadFlags::IGNORED
        | ReadFlags::UNMOUNT
}

/// A holder's watch on the file (or directory) it holds open: rings
/// `alarm` when that inode is removed, moved or changed. Dropped with the
/// lease.
#[derive(Debug)]
pub(super) struct LossWatch {
    watch: Watch,
    id: u64,
}

/// Watches the open `file` (its inode, through `/proc/self/fd`) for a
/// loss, ringing `alarm`. `Err` when inotify refuses: the lease's
/// renewals (every third of its ttl) still find the loss.
pub(super) fn watch_for_loss(
    file: &impl std::os::fd::AsRawFd,
    alarm: &Alarm,
) -> Result<LossWatch, Errno> {
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let watch = add(
        Path::new(&path),
        WatchFlags::ATTRIB | WatchFlags::MOVE_SELF | WatchFlags::DELETE_SELF,
    )?;
    let id = NEXT_LOSS_WATCH.fetch_add(1, Ordering::Relaxed);
    if let Some(watched) = lock(&watch.watcher.watches).get_mut(&watch.wd)
        && Arc::ptr_eq(&watched.notify, &watch.notify)
    {
        watched.alarms.push((id, alarm.clone()));
    }
    Ok(LossWatch { watch, id })
}

impl Drop for LossWatch {
    fn drop(&mut self) {
        // (Then `watch` drops: the inode's watch goes with its last user.)
        if let Some(watched) = lock(&self.watch.watcher.watches).get_mut(&self.watch.wd)
            && Arc::ptr_eq(&watched.notify, &self.watch.notify)
        {
            watched.alarms.retain(|(id, _)| *id != self.id);
        }
    }
}

/// Watches the file at `path` (the inode there now). `Err` when inotify
/// refuses (the watch limit, `fs.inotify.max_user_watches`): the waiter
/// then re-checks every second.
pub(super) fn watch(path: &Path) -> Result<Watch, Errno> {
    add(path, events())
}

/// Watches the ticket at `path` (a semaphore waiter's place in line, see
/// `line.rs`) for its waiter leaving: removed, or closed by its process's
/// end. Not `IN_CLOSE_NOWRITE`: the probes of other waiters open tickets
/// read-only, and would wake each other without end.
pub(super) fn watch_departure(path: &Path) -> Result<Watch, Errno> {
    add(
        path,
        WatchFlags::CLOSE_WRITE
            | WatchFlags::ATTRIB
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF,
    )
}

/// Watches the entries of the directory at `path`: a file created in it,
/// renamed into it or removed from it (an election's leader record written
/// or withdrawn, a lock file created or replaced). Holders watch the
/// directory too (for its removal or move); the flags add up (`IN_MASK_ADD`),
/// and an event another side asked for only wakes a waiter for one more look.
pub(super) fn watch_entries(path: &Path) -> Result<Watch, Errno> {
    add(
        path,
        WatchFlags::CREATE | WatchFlags::MOVED_TO | WatchFlags::DELETE | WatchFlags::ONLYDIR,
    )
}

/// A waiter's watch of a directory's entries (a latch's or a barrier's
/// waiter): made again when the process's reader stopped, and without one
/// (the inotify limit) a wake-up that never fires, so that the waiter's own
/// re-check timer is what wakes it.
pub(super) struct EntriesWaiter {
    entries: Option<Watch>,
    never: Notify,
}

impl EntriesWaiter {
    /// Watches the entries of `dir` (or will try again at each `refresh`).
    pub(super) fn new(dir: &Path) -> Self {
        EntriesWaiter {
            entries: watch_entries(dir).ok(),
            never: Notify::new(),
        }
    }

    /// Makes the watch again if its reader stopped. Call before `notify`.
    pub(super) fn refresh(&mut self, dir: &Path) {
        if !self.entries.as_ref().is_some_and(Watch::live) {
            self.entries = watch_entries(dir).ok();
        }
    }

    /// The wake-up to arm before looking at the directory.
    pub(super) fn notify(&self) -> &Notify {
        self.entries.as_ref().map_or(&self.never, Watch::notify)
    }

    /// Whether a watch is set: without one, the waiter re-checks on a timer.
    pub(super) fn watching(&self) -> bool {
        self.entries.is_some()
    }
}

fn add(path: &Path, flags: WatchFlags) -> Result<Watch, Errno> {
    let watcher = watcher()?;
    // `MASK_ADD`: another user's flags on the same inode stay.
    let wd = inotify::add_watch(&watcher.fd, path, flags | WatchFlags::MASK_ADD)?;
    let (notify, events) = {
        let mut watches = lock(&watcher.watches);
        let watched = watches.entry(wd).or_insert_with(|| Watched {
            users: 0,
            notify: Arc::new(Notify::new()),
            events: Arc::default(),
            alarms: Vec::new(),
        });
        watched.users += 1;
        (watched.notify.clone(), watched.events.clone())
    };
    Ok(Watch {
        watcher,
        wd,
        notify,
        events,
    })
}

impl Watch {
    /// The wake-up of this watch's events.
    pub(super) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// Whether the process's reader still reads this watch's events: once
    /// it stopped (its waiters were woken one last time), a waiter makes a
    /// new watch or falls back to the re-check.
    pub(super) fn live(&self) -> bool {
        self.watcher.reading.load(Ordering::SeqCst)
    }

    /// How many events this watch has had so far (counted before its
    /// waiters are woken).
    pub(super) fn events(&self) -> u64 {
        self.events.load(Ordering::SeqCst)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watches = lock(&self.watcher.watches);
        let Some(watched) = watches.get_mut(&self.wd) else {
            return;
        };
        // A descriptor the kernel dropped and gave again is another entry's.
        if !Arc::ptr_eq(&watched.notify, &self.notify) {
            return;
        }
        watched.users -= 1;
        if watched.users == 0 {
            watches.remove(&self.wd);
            // `EINVAL` when the kernel removed it already (the file deleted).
            let _ = inotify::remove_watch(&self.watcher.fd, self.wd);
        }
    }
}

/// The process's watcher, started on first use.
fn watcher() -> Result<Arc<Watcher>, Errno> {
    let mut current = lock(&WATCHER);
    if STOPPED.load(Ordering::SeqCst) {
        return Err(Errno::SHUTDOWN);
    }
    if let Some(watcher) = current
        .as_ref()
        .filter(|w| w.reading.load(Ordering::SeqCst))
    {
        return Ok(watcher.clone());
    }
    // Blocking reads: the thread sleeps in `read(2)` until an event.
    let fd = inotify::init(CreateFlags::CLOEXEC)?;
    let watcher = Arc::new(Watcher {
        fd,
        watches: Mutex::new(HashMap::new()),
        reading: AtomicBool::new(true),
        stopping: AtomicBool::new(false),
    });
    let reader = watcher.clone();
    // `dlock::shutdown` ends the reader and closes the descriptor.
    static AT_STOP: std::sync::Once = std::sync::Once::new();
    AT_STOP.call_once(|| crate::lease::background::at_stop(stop));
    std::thread::Builder::new()
        .name("dlock-file-watch".into())
        .spawn(move || read_events(&Reading(reader)))
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::AGAIN))?;
    *current = Some(watcher.clone());
    Ok(watcher)
}

/// Ends the process's watcher for `dlock::shutdown` (registered with
/// `lease::background::at_stop` when the watcher starts): no new one starts,
/// and the reader thread returns, so the inotify descriptor closes once
/// the last watch is dropped (a lease's or a waiter's; `shutdown` has
/// released the leases). Waiters left re-check every second.
fn stop() {
    let watcher = {
        let mut current = lock(&WATCHER);
        STOPPED.store(true, Ordering::SeqCst);
        current.take()
    };
    let Some(watcher) = watcher else { return };
    watcher.stopping.store(true, Ordering::SeqCst);
    // Wake the reader, blocked in `read(2)`: a removed watch queues an
    // `IN_IGNORED` event. `/` is a directory every process may watch.
    if let Ok(wd) = inotify::add_watch(
        &watcher.fd,
        "/",
        WatchFlags::ONLYDIR | WatchFlags::DELETE_SELF,
    ) {
        let _ = inotify::remove_watch(&watcher.fd, wd);
    }
}

/// Clears `reading` when the reader ends, however it ends.
struct Reading(Arc<Watcher>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::SeqCst);
        // Its waiters try again now, and then every second.
        for watched in lock(&self.0.watches).values() {
            watched.woken();
            // Holders are told nothing more: let them check now.
            watched.maybe_lost(ReadFlags::IGNORED);
        }
    }
}

/// Reads the instance's events and wakes each watch's waiters, until a
/// read fails in a way that will not pass.
fn read_events(reading: &Reading) {
    let watcher = &reading.0;
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(&watcher.fd, &mut buf);
    loop {
        let (wd, flags) = match reader.next() {
            Ok(event) => (event.wd(), event.events()),
            Err(Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "dlock's file backend stopped watching lock files; waiters re-check every second");
                return;
            }
        };
        if watcher.stopping.load(Ordering::SeqCst) {
            return;
        }
        let mut watches = lock(&watcher.watches);
        // The queue overflowed: any file may have been let go.
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            watches.values().for_each(Watched::woken);
            watches
                .values()
                .for_each(|w| w.maybe_lost(ReadFlags::ATTRIB));
        }
        if let Some(watched) = watches.get(&wd) {
            watched.woken();
            watched.maybe_lost(flags);
        }
        // The kernel dropped the watch (the file is gone): its descriptor
        // may be given again to another inode.
        if flags.contains(ReadFlags::IGNORED) {
            watches.remove(&wd);
        }
    }
}
