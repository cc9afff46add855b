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
//! The reader is one thread of the process (`dlock-file-watch`), blocked
//! in `read(2)` on the inotify descriptor: it needs no runtime, wakes
//! waiters on whatever runtime they wait, and lives as long as the process
//! once a waiter has started it. If it cannot run (no thread, an instance
//! refused), waiters still try every second.

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

/// One inotify instance and the watches on it.
#[derive(Debug)]
pub(super) struct Watcher {
    fd: OwnedFd,
    watches: Mutex<HashMap<i32, Watched>>,
    /// Cleared when the reader thread ends (an error it cannot pass).
    reading: AtomicBool,
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
}

impl Watched {
    /// Counts an event and wakes the waiters.
    fn woken(&self) {
        self.events.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
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

/// Watches the file at `path` (the inode there now). `Err` when inotify
/// refuses (the watch limit, `fs.inotify.max_user_watches`): the waiter
/// then re-checks every second.
pub(super) fn watch(path: &Path) -> Result<Watch, Errno> {
    add(path, events())
}

/// Watches the entries of the directory at `path`: a file created in it,
/// renamed into it or removed from it (an election's leader record written
/// or withdrawn, a lock file created or replaced). Only election observers watch the directory, so
/// its inode has this one set of flags.
pub(super) fn watch_entries(path: &Path) -> Result<Watch, Errno> {
    add(
        path,
        WatchFlags::CREATE | WatchFlags::MOVED_TO | WatchFlags::DELETE | WatchFlags::ONLYDIR,
    )
}

fn add(path: &Path, flags: WatchFlags) -> Result<Watch, Errno> {
    let watcher = watcher()?;
    let wd = inotify::add_watch(&watcher.fd, path, flags)?;
    let (notify, events) = {
        let mut watches = lock(&watcher.watches);
        let watched = watches.entry(wd).or_insert_with(|| Watched {
            users: 0,
            notify: Arc::new(Notify::new()),
            events: Arc::default(),
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
    });
    let reader = watcher.clone();
    std::thread::Builder::new()
        .name("dlock-file-watch".into())
        .spawn(move || read_events(&Reading(reader)))
        .map_err(|e| Errno::from_io_error(&e).unwrap_or(Errno::AGAIN))?;
    *current = Some(watcher.clone());
    Ok(watcher)
}

/// Clears `reading` when the reader ends, however it ends.
struct Reading(Arc<Watcher>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.reading.store(false, Ordering::SeqCst);
        // Its waiters try again now, and then every second.
        for watched in lock(&self.0.watches).values() {
            watched.woken();
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
        let mut watches = lock(&watcher.watches);
        // The queue overflowed: any file may have been let go.
        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
            watches.values().for_each(Watched::woken);
        }
        if let Some(watched) = watches.get(&wd) {
            watched.woken();
        }
        // The kernel dropped the watch (the file is gone): its descriptor
        // may be given again to another inode.
        if flags.contains(ReadFlags::IGNORED) {
            watches.remove(&wd);
        }
    }
}
