//! What a Redis election announced, kept on the server so that an observer
//! can tell a real announcement from a forged or replayed one: anyone who
//! may `PUBLISH` on `<prefix>:{<name>}:elected` can put any text there, but
//! only dlock's scripts, holding the lock's token, write this list.
//!
//! The list is the string `<prefix>:{<name>}:terms` (in the lock's hash
//! slot): one line per announcement, `<term> <sha1 of the value>` for a
//! leader's value and `-<term>` for a resignation, the last [`KEPT`] of
//! them, expiring [`KEPT_FOR_SECS`] after the last change. It holds no
//! value (a hash of it), no token, and grows no further than [`KEPT`]
//! lines; an observer that falls further behind reads the leader instead.
//! It uses only `GET` and `SET`, which the lock's ACL rule already grants.

use std::sync::LazyLock;

use redis::Script;

use crate::backend::LeaderChange;

/// How many announcements the list keeps.
pub(super) const KEPT: usize = 64;

/// How long the list outlives its last change, in seconds (a day).
pub(super) const KEPT_FOR_SECS: u64 = 86_400;

/// The Lua function `note(key, line)` that appends `line` to the list at
/// `key`, keeping the last [`KEPT`] lines (the text is `\n`-framed: it
/// starts with one, and every line ends with one).
pub(super) static NOTE: LazyLock<String> = LazyLock::new(|| {
    format!(
        r"
local function note(key, line)
  local h = (redis.call('GET', key) or '\n') .. line .. '\n'
  local _, n = string.gsub(h, '\n', '\n')
  while n > {lines} do
    h = string.sub(h, string.find(h, '\n', 2, true), -1)
    n = n - 1
  end
  redis.call('SET', key, h, 'EX', {secs})
end
",
        lines = KEPT + 1,
        secs = KEPT_FOR_SECS
    )
});

/// 1 if the list holds the announcement. KEYS: list; ARGV: `+` (a
/// leader's value) or `-` (a resignation), term, value.
pub(super) static CONFIRM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local h = redis.call('GET', KEYS[1])
if not h then return 0 end
local line
if ARGV[1] == '-' then line = '-' .. ARGV[2] else line = ARGV[2] .. ' ' .. redis.sha1hex(ARGV[3]) end
if string.find(h, '\n' .. line .. '\n', 1, true) then return 1 end
return 0
",
    )
});

/// The list's last line, or `''`. KEYS: list.
pub(super) static LAST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local h = redis.call('GET', KEYS[1])
if not h then return '' end
local last = ''
for line in string.gmatch(h, '[^\n]+') do last = line end
return last
",
    )
});

/// The arguments of [`CONFIRM`] for `change`; `None` for a change that is
/// not an announcement.
pub(super) fn confirm_args(change: &LeaderChange) -> Option<(&'static str, u64, &str)> {
    match change {
        LeaderChange::Elected(leader) => Some(("+", leader.term, leader.value.as_str())),
        LeaderChange::Ended { term } => Some(("-", *term, "")),
        LeaderChange::Unknown | LeaderChange::Closed => None,
    }
}

/// Where the list stood when an observer subscribed: announcements of
/// earlier terms were made before it and are reflected in its first read,
/// so hearing them now means they are replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Mark {
    /// The term of the list's last line.
    term: u64,
    /// Whether that line was the term's end.
    ended: bool,
}

impl Mark {
    /// The mark of the list whose last line is `line`.
    pub(super) fn of_last_line(line: &str) -> Mark {
        let (ended, rest) = match line.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let term = rest.split(' ').next().and_then(|t| t.parse().ok());
        match term {
            Some(term) => Mark { term, ended },
            None => Mark::default(),
        }
    }

    /// Whether `change` is an announcement made before the mark (a replay).
    pub(super) fn is_before(&self, change: &LeaderChange) -> bool {
        let term = match change {
            LeaderChange::Elected(leader) => leader.term,
            LeaderChange::Ended { term } => *term,
            LeaderChange::Unknown | LeaderChange::Closed => return false,
        };
        term < self.term || (term == self.term && self.ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Leader;

    fn elected(term: u64) -> LeaderChange {
        LeaderChange::Elected(Leader {
            value: "v".into(),
            term,
        })
    }

    #[test]
    fn a_mark_drops_what_came_before_it() {
        let live = Mark::of_last_line("7 0123abcd");
        assert_eq!(
            live,
            Mark {
                term: 7,
                ended: false
            }
        );
        assert!(live.is_before(&elected(6)));
        assert!(!live.is_before(&elected(7)), "a new value in the live term");
        assert!(!live.is_before(&LeaderChange::Ended { term: 7 }));
        let over = Mark::of_last_line("-7");
        assert!(over.is_before(&elected(7)));
        assert!(over.is_before(&LeaderChange::Ended { term: 7 }));
        assert!(!over.is_before(&elected(8)));
        for nothing in ["", "x", "- "] {
            assert_eq!(Mark::of_last_line(nothing), Mark::default());
        }
        assert!(!Mark::default().is_before(&elected(1)));
        assert!(!live.is_before(&LeaderChange::Unknown));
    }
}
