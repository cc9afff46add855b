//! Leader election on Redis (a single server, Sentinel's master, or a
//! Cluster): the election is the lock `<prefix>:{<name>}`; the leader's
//! record is the string `<prefix>:{<name>}:leader`, `<token>\n<term>\n<value>`
//! (a token and a term hold no newline), in the lock's hash slot, and every change of it is published on
//! `<prefix>:{<name>}:elected` (`…:db<n>` on database `n` ≠ 0, as the
//! release channels): `<term>\n<value>` when a leader publishes a value,
//! `-<term>` when it resigns (see `backends::announcements`), so an
//! observer sees every term, however short. Each step is one script, so the record is written
//! only while the lock holds the leader's token, and read only with it.
//! The scripts use only commands the lock's ACL rule already grants (`GET`,
//! `SET`, `DEL`, `PUBLISH`).
//!
//! Anyone who may `PUBLISH` on the channel can announce anything, so an
//! announcement is a hint: the same scripts note each one in a short list
//! beside the record (`announced`), and an observer reports only what the
//! list confirms, reading the leader for anything else.
//!
//! The record has no expiry: a resignation deletes it, and a read that
//! finds the lock no longer holds its token deletes it then (tokens are
//! never reused, so such a record is dead for good). What stays after a
//! crash is one small hash per election name, until the next leader or
//! the next read, and the list of the last announcements, which expires a
//! day after the last of them.

mod announced;

use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use redis::Script;

use crate::backend::refusal::About;
use crate::backend::{ElectionBackend, Leader, LeaderChange, LeaderChanges, Lease};
use crate::backends::announcements::Inbox;
use crate::backends::redis::protocol::scripts::{self, db_channel, KeyNames};
use crate::backends::redis::waiting::subscriber::Subscription;
use crate::backends::redis::RedisBackend;
use crate::LockError;

/// Writes the record if the lock holds the token, notes and announces it.
/// KEYS: lock, record, announcements; ARGV: token, value, term, channel.
/// 1: written.
static PROCLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{note}
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1] .. '\n' .. ARGV[3] .. '\n' .. ARGV[2])
note(KEYS[3], ARGV[3] .. ' ' .. redis.sha1hex(ARGV[2]))
redis.pcall('PUBLISH', ARGV[4], ARGV[3] .. '\n' .. ARGV[2])
return 1
",
        note = *announced::NOTE
    ))
});

/// Deletes the record if it is the token's, notes and announces that its
/// term ended (`-<term>`). KEYS: record, announcements; ARGV: token,
/// channel.
static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{note}
local r = redis.call('GET', KEYS[1])
if r and string.sub(r, 1, #ARGV[1] + 1) == ARGV[1] .. '\n' then
  redis.call('DEL', KEYS[1])
  local rest = string.sub(r, #ARGV[1] + 2)
  local term = string.sub(rest, 1, (string.find(rest, '\n', 1, true) or (#rest + 1)) - 1)
  note(KEYS[2], '-' .. term)
  redis.pcall('PUBLISH', ARGV[2], '-' .. term)
end
return 1
",
        note = *announced::NOTE
    ))
});

/// `{term, value}` if the lock holds the record's token, else `{}` (and a
/// dead record is deleted). KEYS: lock, record.
static LEADER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local r = redis.call('GET', KEYS[2])
if not r then return {} end
local a = string.find(r, '\n', 1, true)
local b = a and string.find(r, '\n', a + 1, true)
if not b then return {} end
if redis.call('GET', KEYS[1]) ~= string.sub(r, 1, a - 1) then
  redis.call('DEL', KEYS[2])
  return {}
end
return {string.sub(r, a + 1, b - 1), string.sub(r, b + 1)}
",
    )
});

/// The Redis names of one election.
struct ElectionNames {
    lock: String,
    record: String,
    /// The list of the last announcements (`announced`).
    announced: String,
    channel: String,
}

impl RedisBackend {
    fn election_names(&self, name: &str) -> ElectionNames {
        let lock = KeyNames::new(&self.options.prefix, name).lock;
        let mut channel = format!("{lock}:elected");
        db_channel(&mut channel, self.db);
        ElectionNames {
            record: format!("{lock}:leader"),
            announced: format!("{lock}:terms"),
            channel,
            lock,
        }
    }
}

/// One observer's subscription to an election's channel, and the inbox
/// its announcements go to.
struct Changes {
    inbox: Arc<Inbox>,
    /// Where the announcements stood when subscribed: earlier ones heard
    /// now are replays.
    mark: announced::Mark,
    /// Keeps the channel subscribed.
    _subscription: Subscription,
}

#[async_trait]
impl LeaderChanges for Changes {
    async fn changed(&mut self) -> LeaderChange {
        loop {
            let change = self.inbox.next().await;
            if !self.mark.is_before(&change) {
                return change;
            }
        }
    }
}

#[async_trait]
impl ElectionBackend for RedisBackend {
    async fn proclaim(&self, lease: &Lease, value: &str) -> Result<bool, LockError> {
        let Some(term) = lease.fencing_token else {
            return Ok(false);
        };
        let names = self.election_names(&lease.key);
        let mut call = scripts::evalsha(&PROCLAIM, 3);
        call.arg(&names.lock)
            .arg(&names.record)
            .arg(&names.announced)
            .arg(&lease.token)
            .arg(value)
            .arg(term)
            .arg(&names.channel);
        let written: i64 = self
            .eval(&PROCLAIM, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(&lease.key)))?;
        Ok(written == 1)
    }

    async fn withdraw(&self, lease: &Lease) -> Result<(), LockError> {
        let names = self.election_names(&lease.key);
        let mut call = scripts::evalsha(&WITHDRAW, 2);
        call.arg(&names.record)
            .arg(&names.announced)
            .arg(&lease.token)
            .arg(&names.channel);
        let _: i64 = self
            .eval(&WITHDRAW, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(&lease.key)))?;
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<Leader>, LockError> {
        let names = self.election_names(name);
        let mut call = scripts::evalsha(&LEADER, 2);
        call.arg(&names.lock).arg(&names.record);
        let answer: Vec<String> = self
            .eval(&LEADER, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(name)))?;
        Ok(match answer.as_slice() {
            [term, value] => term.parse::<u64>().ok().map(|term| Leader {
                value: value.clone(),
                term,
            }),
            _ => None,
        })
    }

    async fn watch(&self, name: &str) -> Result<Box<dyn LeaderChanges>, LockError> {
        let names = self.election_names(name);
        let inbox = self.subscriber.inbox(&names.channel);
        let subscription = self
            .subscriber
            .subscribe(std::slice::from_ref(&names.channel), None)
            .await;
        let mut call = scripts::evalsha(&announced::LAST, 1);
        call.arg(&names.announced);
        let last: String = self
            .eval(&announced::LAST, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(name)))?;
        inbox.settle();
        Ok(Box::new(Changes {
            inbox,
            mark: announced::Mark::of_last_line(&last),
            _subscription: subscription,
        }))
    }

    async fn confirm(&self, name: &str, change: &LeaderChange) -> Result<bool, LockError> {
        let Some((kind, term, value)) = announced::confirm_args(change) else {
            return Ok(false);
        };
        let names = self.election_names(name);
        let mut call = scripts::evalsha(&announced::CONFIRM, 1);
        call.arg(&names.announced).arg(kind).arg(term).arg(value);
        let found: i64 = self
            .eval(&announced::CONFIRM, &call)
            .await
            .map_err(|e| self.name_refusal(e, About::Lock(name)))?;
        Ok(found == 1)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_share_the_lock_names_hash_tag() {
        let lock = super::KeyNames::new("dlock", "scheduler").lock;
        assert_eq!(lock, "dlock:{scheduler}");
        let mut channel = format!("{lock}:elected");
        super::db_channel(&mut channel, 2);
        assert_eq!(channel, "dlock:{scheduler}:elected:db2");
    }
}
