//! Turns that reach one process, and one heartbeat per process for all its
//! queued waiters (see `waiter_queue.rs` for the queue itself).
//!
//! **A channel per backend.** Each backend (a process's connection set:
//! its own subscriber) draws a channel of its own at start,
//! `<prefix>:turns:<16 hex digits>`, and its waiters' tickets name it:
//! `<hash of the owner token>@<that channel>`. A queued release `PUBLISH`es
//! `turn:<ticket>` on the channel the ticket names, so the server delivers
//! it to that one subscriber connection, whatever the number of processes
//! waiting for the key: a `PUBLISH` costs the server a walk over the
//! channel's subscribers, and on the key's one release channel that was
//! every waiting process, woken to find the turn was not theirs. The
//! channel is server-wide (pub/sub ignores databases) and unique by its
//! random part; on a Cluster a `PUBLISH` reaches every node, as the release
//! channel's did, so the one subscriber connection of the backend hears it
//! wherever the key lives. It needs no hash tag: no script names it as a
//! key. An ACL that allows `&<prefix>:*` allows it. A ticket that names no
//! channel (a waiter of an older dlock) is woken on the key's release
//! channel, as before.
//!
//! **One heartbeat per process.** A queued ticket counts as alive for a
//! second after it last proved it (`LIFE_MS`). Rather than each waiter
//! trying the lock every [`HEARTBEAT`], the backend's heartbeat task sends
//! one [`BEAT`] script per [`HEARTBEAT`] for all of its queued tickets (on
//! a Cluster, one per key: a script's keys share a slot), which keeps each
//! in line and, for a key left free with nobody handed it (a turn message
//! lost, a foreign `DEL` unannounced, a head that died after its turn),
//! wakes the queue's live head. A waiter itself tries only when woken: its
//! turn, the holder's expiry, or (the head only) a keyspace event. A ticket
//! the beat no longer finds in line (lapsed while its process stalled, or
//! just granted) is not put back by the beat, which cannot tell the two
//! apart: its waiter is woken here, in the process, and its own try
//! queues it again or finds it served. A ticket whose waiter's own queued
//! try proved it since the last beat (within [`HEARTBEAT`]) is left out of
//! that beat: the try did the beat's work, and the next beat proves it
//! well within its life; a lost turn on such a key is noticed one beat
//! later at most.
//!
//! **Only waiters that take their turns.** The heartbeat proves a process
//! alive, not each waiter: a waiter whose future is kept but not polled
//! would stay first in line for ever. Each ticket's [`Turn`] records a turn
//! given and not yet tried for; once one is older than [`TURN_GRACE`], the
//! heartbeat stops proving that ticket, takes it out of line ([`LEAVE`],
//! which wakes the next waiter of a free key), and leaves it out until its
//! waiter tries again, behind the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::Script;

use crate::backends::redis::protocol::scripts;
use crate::backends::redis::protocol::scripts::queue_lua::{HEARTBEAT, QUEUE_FUNCTIONS};
use crate::backends::redis::waiting::subscriber::turn::Turn;
use crate::backends::redis::waiting::subscriber::Bell;
use crate::backends::redis::waiting::waiter_queue::LEAVE;
use crate::backends::redis::{Conn, RedisBackend};

/// The heartbeat of a backend's queued tickets: KEYS one lock key per
/// ticket; ARGV each ticket and its key's release channel, in pairs. For
/// each ticket still in line: alive for another `LIFE_MS`, and if its key
/// is free without a hand-off under way, the live head is woken. Returns
/// the positions (from 1) of the tickets no longer in line.
pub(crate) static BEAT: LazyLock<Script> = LazyLock::new(|| {
    let beat = r"
local gone = {}
for i = 1, #KEYS do
  local lock, ticket = KEYS[i], ARGV[2 * i - 1]
  if redis.call('ZSCORE', lock .. ':queue', ticket) then
    wait_in_line(lock, ticket, false, LIFE_MS)
    redis.call('PEXPIRE', lock .. ':queue', LIFE_MS)
    if redis.call('EXISTS', lock) == 0 and not handing_off(lock) then
      local head = head_of(lock)
      if head then
        wake(head, ARGV[2 * i])
      end
    end
  else
    gone[#gone + 1] = i
  end
end
return gone
";
    Script::new(&format!("{QUEUE_FUNCTIONS}{beat}"))
});

/// At most this many tickets per [`BEAT`] call.
const BEAT_CHUNK: usize = 500;

/// How long a queued waiter may leave a turn given to it untaken (its
/// future not polled) before the heartbeat takes its ticket out of line
/// and wakes the next waiter. Well above the time a polled waiter takes to
/// try (milliseconds, a few hundred on a loaded machine's debug build);
/// with the heartbeat's period, the next waiter is served within about a
/// second of the release.
pub(crate) const TURN_GRACE: Duration = Duration::from_millis(600);

/// One queued ticket of this backend: its lock key and release channel.
#[derive(Debug)]
struct Queued {
    lock: String,
    channel: String,
    /// Waits that registered it (a retry with the same token keeps it).
    waits: usize,
    /// The waiter's turn, watched for a turn given and not taken.
    turn: Option<Arc<Turn>>,
    /// Taken out of line for a turn it did not take: not beaten, and not
    /// taken out again, until its waiter tries.
    stepped_aside: bool,
    /// When its waiter's last queued try went out that the server answered
    /// without the key: that try proved it alive for `LIFE_MS`, so a beat
    /// within [`HEARTBEAT`] of it is skipped (see [`Beating::proven`]).
    proven_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct BeatState {
    tickets: HashMap<String, Queued>,
    /// A heartbeat task runs (it ends when no ticket is left).
    running: bool,
}

/// The queued tickets of one backend, and its heartbeat task.
#[derive(Debug, Default)]
pub(crate) struct Beats {
    state: Arc<Mutex<BeatState>>,
}

fn lock_state(state: &Mutex<BeatState>) -> MutexGuard<'_, BeatState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps a ticket in the heartbeat until dropped.
pub(crate) struct Beating {
    state: Arc<Mutex<BeatState>>,
    ticket: String,
}

impl Beating {
    /// The waiter's queued try sent at `sent` was answered without the
    /// key: the server proved the ticket alive for `LIFE_MS` from then,
    /// and the next heartbeat leaves it out if it comes within
    /// [`HEARTBEAT`] (the one after proves it, well within its life). With
    /// many processes on one key every waiter tries once per critical
    /// section (it joins the line), and a beat besides was one script
    /// in four.
    pub(crate) fn proven(&self, sent: Instant) {
        if let Some(queued) = lock_state(&self.state).tickets.get_mut(&self.ticket) {
            queued.proven_at = Some(sent);
        }
    }
}

impl Drop for Beating {
    fn drop(&mut self) {
        let mut state = lock_state(&self.state);
        if let Some(queued) = state.tickets.get_mut(&self.ticket) {
            queued.waits -= 1;
            if queued.waits == 0 {
                state.tickets.remove(&self.ticket);
            }
        }
    }
}

impl RedisBackend {
    /// Keeps `ticket` (queued for the lock key `lock`, whose release
    /// channel is `channel`) alive with this backend's heartbeat until the
    /// returned guard is dropped; starts the heartbeat task if none runs.
    pub(crate) fn beat_while_queued(
        &self,
        lock: &str,
        channel: &str,
        ticket: &str,
        turn: Option<Arc<Turn>>,
    ) -> Beating {
        let start = {
            let mut state = lock_state(&self.beats.state);
            let queued = state
                .tickets
                .entry(ticket.to_owned())
                .or_insert_with(|| Queued {
                    lock: lock.to_owned(),
                    channel: channel.to_owned(),
                    waits: 0,
                    turn: None,
                    stepped_aside: false,
                    proven_at: None,
                });
            queued.waits += 1;
            if turn.is_some() {
                queued.turn = turn;
            }
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            let state = self.beats.state.clone();
            let conn = self.conn.clone();
            let bell = self.subscriber.bell();
            crate::lease::background::spawn_daemon(beat(state, conn, bell));
        }
        Beating {
            state: self.beats.state.clone(),
            ticket: ticket.to_owned(),
        }
    }
}

/// The heartbeat task: one [`BEAT`] per [`HEARTBEAT`] for every queued
/// ticket (per key on a Cluster), until none is left.
async fn beat(state: Arc<Mutex<BeatState>>, conn: Conn, bell: Bell) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        // Grouped by key: on a Cluster each group is a call of its own.
        let mut by_key: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        // Turns given and not taken: out of line, the next waiter woken.
        let mut aside: Vec<(String, String, String)> = Vec::new();
        {
            let mut state = lock_state(&state);
            if state.tickets.is_empty() {
                state.running = false;
                return;
            }
            for (ticket, queued) in state.tickets.iter_mut() {
                let overdue = queued.turn.as_ref().is_some_and(|t| t.overdue(TURN_GRACE));
                if !overdue {
                    queued.stepped_aside = false;
                } else if !std::mem::replace(&mut queued.stepped_aside, true) {
                    aside.push((queued.lock.clone(), ticket.clone(), queued.channel.clone()));
                    continue;
                } else {
                    continue;
                }
                if queued.proven_at.is_some_and(|at| at.elapsed() < HEARTBEAT) {
                    continue;
                }
                by_key
                    .entry(queued.lock.clone())
                    .or_default()
                    .push((ticket.clone(), queued.channel.clone()));
            }
        }
        let calls: Vec<Vec<(String, String, String)>> = {
            let flat = by_key.into_iter().flat_map(|(lock, tickets)| {
                tickets
                    .into_iter()
                    .map(move |(ticket, channel)| (lock.clone(), ticket, channel))
            });
            match conn {
                Conn::Single(_) => {
                    let flat: Vec<_> = flat.collect();
                    flat.chunks(BEAT_CHUNK).map(<[_]>::to_vec).collect()
                }
                Conn::Cluster(_) => {
                    let mut per_key: Vec<Vec<(String, String, String)>> = Vec::new();
                    for one in flat {
                        match per_key.last_mut() {
                            Some(last) if last[0].0 == one.0 => last.push(one),
                            _ => per_key.push(vec![one]),
                        }
                    }
                    per_key
                }
            }
        };
        for call in calls {
            beat_once(&conn, &call, &bell).await;
        }
        for (lock, ticket, channel) in aside {
            step_aside(&conn, &lock, &ticket, &channel).await;
        }
    }
}

/// Takes a ticket whose waiter left its turn untaken out of line, and wakes
/// the next waiter if the key is free ([`LEAVE`]). The waiter queues again,
/// behind those already waiting, the next time it is polled.
async fn step_aside(conn: &Conn, lock: &str, ticket: &str, channel: &str) {
    tracing::debug!(
        lock,
        "a queued waiter left its turn untaken for {TURN_GRACE:?} (its future is not polled): the next waiter is served"
    );
    let mut call = scripts::evalsha(&LEAVE, 1);
    call.arg(lock).arg(ticket).arg(channel);
    let left: Result<i64, _> = match conn.clone() {
        Conn::Single(mut c) => scripts::run(&mut c, &LEAVE, &call).await,
        Conn::Cluster(mut c) => scripts::run(&mut c, &LEAVE, &call).await,
    };
    if let Err(e) = left {
        // Not beaten any more, the ticket lapses within its life instead.
        tracing::debug!(error = %e, "taking an untaken turn out of line failed");
    }
}

/// One [`BEAT`] call for `tickets` (lock key, ticket, release channel);
/// the waiters of tickets no longer in line are woken to queue again.
async fn beat_once(conn: &Conn, tickets: &[(String, String, String)], bell: &Bell) {
    let mut call = scripts::evalsha(&BEAT, tickets.len());
    for (lock, _, _) in tickets {
        call.arg(lock);
    }
    for (_, ticket, channel) in tickets {
        call.arg(ticket).arg(channel);
    }
    let answer: Result<Vec<usize>, _> = match conn.clone() {
        Conn::Single(mut c) => scripts::run(&mut c, &BEAT, &call).await,
        Conn::Cluster(mut c) => scripts::run(&mut c, &BEAT, &call).await,
    };
    match answer {
        Ok(gone) => {
            for i in gone {
                if let Some((_, ticket, _)) = tickets.get(i.wrapping_sub(1)) {
                    bell.ring(ticket);
                }
            }
        }
        // The tickets lapse after a second; their waiters' next tries
        // (at the holder's expiry, or a turn) queue them again.
        Err(e) => tracing::debug!(error = %e, "a queue heartbeat failed"),
    }
}
