//! Whose turn it is: Curator's ordering rules over a directory's children,
//! for plain locks (`InterProcessMutex`) and for both sides of a read-write
//! lock (`InterProcessReadWriteLock`).
//!
//! Every contender's node is `_c_<uuid>-<name><seq>`, where `<name>` says
//! what it queues for and `<seq>` is the ten-digit sequence ZooKeeper
//! appends. Curator sorts children by what follows the name (for a
//! read-write lock, after `__READ__` or `__WRIT__`, which have the same
//! length on purpose), so both kinds of a read-write lock share one order.
//! Children that are not nodes of the queue are not in it: only the exact
//! names dlock and Curator create count (`_c_<uuid>-<name><10 digits>`),
//! so a key directory of a prefix nested here is never taken for one.
//! Curator sorts such a child by its whole name, which puts
//! protected names (`_c_…`) and names that start with a letter after every
//! sequence: there too, a plain lock's node never stands in a read-write
//! lock's way, nor the reverse.

use crate::backend::RwMode;

/// Curator's lock name for `InterProcessMutex`: children are `_c_<uuid>-lock-<seq>`.
pub(super) const LOCK_NAME: &str = "lock-";

/// Curator's name for a participant of `LeaderLatch`: `_c_<uuid>-latch-<seq>`.
pub(super) const LATCH_NAME: &str = "latch-";

/// Curator's name for a read node of `InterProcessReadWriteLock`.
pub(super) const READ_NAME: &str = "__READ__";

/// Curator's name for a write node of `InterProcessReadWriteLock`.
pub(super) const WRITE_NAME: &str = "__WRIT__";

/// What a node queues for: which name it gets and when its turn comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Queue {
    /// A plain lock: its turn comes when it has the smallest sequence; it
    /// waits for the next-lower `lock-` node.
    Lock,
    /// A read lease: its turn comes when no write node sorts before it; it
    /// waits for the first write node (Curator's `firstWriteIndex`), not its
    /// predecessor, so readers behind readers hold at once.
    Read,
    /// A write lease: its turn comes when it sorts first of all read and
    /// write nodes; it waits for its predecessor of either kind.
    Write,
    /// A participant of a leader election (Curator's `LeaderLatch`): as a
    /// lock, among `latch-` nodes; its data is the participant's id.
    Latch,
}

/// Where a node stands in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn<'a> {
    /// Its turn: the lease is granted.
    Ours,
    /// Not yet: the child whose deletion to wait for.
    After(&'a str),
}

impl Queue {
    /// The side of a read-write lock `mode` names.
    pub(super) fn of(mode: RwMode) -> Self {
        match mode {
            RwMode::Read => Queue::Read,
            RwMode::Write => Queue::Write,
        }
    }

    /// The name between the protection prefix and the sequence.
    pub(super) fn node_name(self) -> &'static str {
        match self {
            Queue::Lock => LOCK_NAME,
            Queue::Latch => LATCH_NAME,
            Queue::Read => READ_NAME,
            Queue::Write => WRITE_NAME,
        }
    }

    /// Where `own` stands among `children`; `None` if `own` is not a node of
    /// this queue (no sequence after its name).
    pub(super) fn turn<'a>(self, children: &'a [String], own: &str) -> Option<Turn<'a>> {
        match self {
            Queue::Lock | Queue::Latch => {
                let kind = self.node_name();
                let mine = protected_sequence(own, kind)?;
                let ahead = children
                    .iter()
                    .filter_map(|c| Some((protected_sequence(c, kind)?, c.as_str())))
                    .filter(|(seq, _)| *seq < mine)
                    .max_by_key(|(seq, _)| *seq);
                Some(ahead.map_or(Turn::Ours, |(_, c)| Turn::After(c)))
            }
            Queue::Write => {
                let (_, mine) = rw_node(own)?;
                let ahead = rw_nodes(children)
                    .filter(|(_, seq, _)| *seq < mine)
                    .max_by_key(|(_, seq, _)| *seq);
                Some(ahead.map_or(Turn::Ours, |(_, _, c)| Turn::After(c)))
            }
            Queue::Read => {
                let (_, mine) = rw_node(own)?;
                let first_write = rw_nodes(children)
                    .filter(|(mode, seq, _)| *mode == RwMode::Write && *seq < mine)
                    .min_by_key(|(_, seq, _)| *seq);
                Some(first_write.map_or(Turn::Ours, |(_, _, c)| Turn::After(c)))
            }
        }
    }
}

/// The sequence number of a lock child: `None` for any child that is not
/// exactly `_c_<uuid>-lock-<10 digits>`, the name dlock and Curator's
/// `InterProcessMutex` create. Curator itself takes the digits after the
/// last `lock-` of any child; dlock is stricter, so a node of another kind
/// that happens to sit in the directory (a key directory of a prefix that
/// nests here, such as `lock-0`) is never mistaken for a contender.
pub(super) fn sequence_of(name: &str) -> Option<i64> {
    protected_sequence(name, LOCK_NAME)
}

/// The sequence of `_c_<uuid>-<kind><10 digits>`, or `None` for a child of
/// any other form.
pub(super) fn protected_sequence(child: &str, kind: &str) -> Option<i64> {
    let rest = child.strip_prefix("_c_")?;
    let (uuid, rest) = rest.split_at_checked(36)?;
    let digits = rest.strip_prefix('-')?.strip_prefix(kind)?;
    let is_uuid = uuid.char_indices().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => c == '-',
        _ => c.is_ascii_hexdigit(),
    });
    let is_sequence = digits.len() == 10 && digits.bytes().all(|b| b.is_ascii_digit());
    if is_uuid && is_sequence {
        digits.parse().ok()
    } else {
        None
    }
}

/// The side and sequence of a read-write lock child: a write node
/// `_c_<uuid>-__WRIT__<10 digits>` or a read node `_c_<uuid>-__READ__<10
/// digits>`; `None` for any other child (strict as [`sequence_of`]).
fn rw_node(name: &str) -> Option<(RwMode, i64)> {
    protected_sequence(name, WRITE_NAME)
        .map(|seq| (RwMode::Write, seq))
        .or_else(|| protected_sequence(name, READ_NAME).map(|seq| (RwMode::Read, seq)))
}

/// The read-write lock children among `children`, with side and sequence.
fn rw_nodes(children: &[String]) -> impl Iterator<Item = (RwMode, i64, &str)> {
    children
        .iter()
        .filter_map(|c| rw_node(c).map(|(mode, seq)| (mode, seq, c.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three contenders out of sequence order, and a node that is not one.
    fn three_contenders() -> Vec<String> {
        [
            "_c_00000000-0000-4000-8000-000000626262-lock-0000000007",
            "_c_00000000-0000-4000-8000-000000616161-lock-0000000005",
            "_c_00000000-0000-4000-8000-000000636363-lock-0000000009",
            "unrelated",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_lock_waits_for_the_next_lower_sequence() {
        let children = three_contenders();
        let turn = |own| Queue::Lock.turn(&children, own);
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000616161-lock-0000000005"),
            Some(Turn::Ours)
        );
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000626262-lock-0000000007"),
            Some(Turn::After(
                "_c_00000000-0000-4000-8000-000000616161-lock-0000000005"
            ))
        );
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000636363-lock-0000000009"),
            Some(Turn::After(
                "_c_00000000-0000-4000-8000-000000626262-lock-0000000007"
            ))
        );
        assert_eq!(turn("garbage"), None);
        // Only the exact names dlock and Curator create are lock nodes: a
        // key directory named like a sequence node (another prefix's keys
        // under this directory) is not one (issue 31).
        for stray in [
            "lock-0",
            "lock-0000000001",
            "_c_x-lock-0000000001",
            "_c_00000000-0000-4000-8000-000000000078-lock-1",
            "_c_00000000-0000-4000-8000-000000000078-lock-00000000012",
            "_c_00000000-0000-4000-8000-000000000078-lock--000000012",
            "_c_00000000-0000-4000-8000-000000000078-lock-lock-0000000012",
            "_c_00000000-0000-4000-8000-000000000078-__READ__0000000012",
            "x_c_00000000-0000-4000-8000-000000000078-lock-0000000012",
            "_c_00000000-0000-4000-8000-00000000007g-lock-0000000012",
        ] {
            assert_eq!(sequence_of(stray), None, "{stray}");
        }
        assert_eq!(
            sequence_of("_c_00000000-0000-4000-8000-000000000078-lock-0000000012"),
            Some(12)
        );
        assert_eq!(rw_node("__WRIT__0000000003"), None);
        assert_eq!(rw_node("_c_x-__READ__0000000003"), None);
    }

    /// Curator's interleaving example: R1 W2 R3 R4 W5 R6, listed shuffled,
    /// with a plain lock node and a stray node in the directory.
    fn mixed_queue() -> Vec<String> {
        [
            "_c_00000000-0000-4000-8000-000000007234-__READ__0000000004",
            "_c_00000000-0000-4000-8000-000000007732-__WRIT__0000000002",
            "_c_00000000-0000-4000-8000-000000007236-__READ__0000000006",
            "_c_00000000-0000-4000-8000-000000007231-__READ__0000000001",
            "_c_00000000-0000-4000-8000-000000006d30-lock-0000000000",
            "_c_00000000-0000-4000-8000-000000007735-__WRIT__0000000005",
            "stray",
            "_c_00000000-0000-4000-8000-000000007233-__READ__0000000003",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn a_reader_waits_only_for_the_first_write_ahead_of_it() {
        let children = mixed_queue();
        let turn = |own| Queue::Read.turn(&children, own);
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000007231-__READ__0000000001"),
            Some(Turn::Ours)
        );
        // Behind W2: every later reader waits for W2, the first write, not
        // for its predecessor (R3 waits for W2, R6 too, not for W5).
        for reader in [
            "_c_00000000-0000-4000-8000-000000007233-__READ__0000000003",
            "_c_00000000-0000-4000-8000-000000007234-__READ__0000000004",
            "_c_00000000-0000-4000-8000-000000007236-__READ__0000000006",
        ] {
            assert_eq!(
                turn(reader),
                Some(Turn::After(
                    "_c_00000000-0000-4000-8000-000000007732-__WRIT__0000000002"
                )),
                "{reader}"
            );
        }
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000006d30-lock-0000000000"),
            None
        );
    }

    #[test]
    fn a_writer_waits_for_its_predecessor_of_either_kind() {
        let children = mixed_queue();
        let turn = |own| Queue::Write.turn(&children, own);
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000007732-__WRIT__0000000002"),
            Some(Turn::After(
                "_c_00000000-0000-4000-8000-000000007231-__READ__0000000001"
            ))
        );
        assert_eq!(
            turn("_c_00000000-0000-4000-8000-000000007735-__WRIT__0000000005"),
            Some(Turn::After(
                "_c_00000000-0000-4000-8000-000000007234-__READ__0000000004"
            ))
        );
        let alone = vec![
            "_c_00000000-0000-4000-8000-000000007737-__WRIT__0000000007".to_owned(),
            "stray".to_owned(),
        ];
        assert_eq!(
            Queue::Write.turn(
                &alone,
                "_c_00000000-0000-4000-8000-000000007737-__WRIT__0000000007"
            ),
            Some(Turn::Ours)
        );
    }

    #[test]
    fn readers_share_until_a_writer_comes() {
        let children: Vec<String> = (1..=3)
            .map(|seq| format!("_c_00000000-0000-4000-8000-{seq:012}-__READ__{seq:010}"))
            .collect();
        for own in &children {
            assert_eq!(Queue::Read.turn(&children, own), Some(Turn::Ours));
        }
        // A writer behind them waits for the last reader, and the lock
        // side's nodes are not in the read-write queue at all.
        let mut with_writer = children.clone();
        with_writer.push("_c_00000000-0000-4000-8000-000000000077-__WRIT__0000000004".to_owned());
        assert_eq!(
            Queue::Write.turn(
                &with_writer,
                "_c_00000000-0000-4000-8000-000000000077-__WRIT__0000000004"
            ),
            Some(Turn::After(
                "_c_00000000-0000-4000-8000-000000000003-__READ__0000000003"
            ))
        );
        assert_eq!(
            Queue::Lock.turn(
                &with_writer,
                "_c_00000000-0000-4000-8000-000000000077-__WRIT__0000000004"
            ),
            None
        );
    }

    #[test]
    fn node_names_are_curators() {
        assert_eq!(Queue::of(RwMode::Read).node_name(), "__READ__");
        assert_eq!(Queue::of(RwMode::Write).node_name(), "__WRIT__");
        assert_eq!(Queue::Lock.node_name(), "lock-");
        // Curator's sorting depends on the two having one length.
        assert_eq!(READ_NAME.len(), WRITE_NAME.len());
    }
}
