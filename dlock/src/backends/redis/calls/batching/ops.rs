//! The two batched requests of the Redis protocol: acquire attempts and
//! releases (the queue itself is `batching.rs`).

use std::future::Future;
use std::pin::Pin;

use redis::{Cmd, Script};

use super::BatchKind;
use crate::backends::redis::calls::unfinished::release_abandoned;
use crate::backends::redis::protocol::scripts::{evalsha, ACQUIRE_MANY, RELEASE, RELEASE_MANY};
use crate::backends::redis::topology::server::Server;

/// Acquire attempts: `{won, fence or pttl}` per key.
pub(crate) struct Acquires;

pub(crate) struct AcquireOp {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) token: String,
    pub(crate) ttl_ms: u64,
    /// The fencing counter's retention in ms (`?fence_retention=`): one
    /// value for a backend, so a batch sends the first op's.
    pub(crate) retention_ms: u64,
    /// The release channel, if a lease taken for a caller that went away is
    /// to be released at once. Redlock says no: it retries with the same
    /// token, and a late release could delete the retry's lease; its own
    /// release on every node after a failed or dropped round cleans up
    /// instead (an acquisition whose round gave up before its batch was
    /// sent is never sent, see `batch.rs`).
    pub(crate) release_unclaimed: Option<String>,
}

impl BatchKind for Acquires {
    type Op = AcquireOp;
    type Out = (i64, i64);

    fn script() -> &'static Script {
        &ACQUIRE_MANY
    }

    fn call(ops: &[AcquireOp]) -> Cmd {
        let mut call = evalsha(&ACQUIRE_MANY, 2 * ops.len());
        for op in ops {
            call.arg(&op.lock).arg(&op.fence);
        }
        for op in ops {
            call.arg(&op.token).arg(op.ttl_ms);
        }
        call.arg(ops.iter().map(|op| op.retention_ms).max().unwrap_or(0));
        call
    }

    fn split(ops: usize, answer: Vec<i64>) -> Option<Vec<(i64, i64)>> {
        (answer.len() == 2 * ops).then(|| answer.chunks(2).map(|p| (p[0], p[1])).collect())
    }

    fn unclaimed(
        mut conn: Server,
        op: AcquireOp,
        (won, _): (i64, i64),
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let Some(channel) = op.release_unclaimed.filter(|_| won == 1) else {
                return;
            };
            release_abandoned(&mut conn, &RELEASE, &op.lock, &op.token, &channel).await;
        })
    }
}

/// Compare-and-delete releases: 1 (released) or 0 (not ours) per key.
pub(crate) struct Releases;

pub(crate) struct ReleaseOp {
    pub(crate) lock: String,
    pub(crate) token: String,
    pub(crate) channel: String,
}

impl BatchKind for Releases {
    type Op = ReleaseOp;
    type Out = i64;

    fn script() -> &'static Script {
        &RELEASE_MANY
    }

    fn call(ops: &[ReleaseOp]) -> Cmd {
        let mut call = evalsha(&RELEASE_MANY, ops.len());
        for op in ops {
            call.arg(&op.lock);
        }
        for op in ops {
            call.arg(&op.token).arg(&op.channel);
        }
        call
    }

    fn split(ops: usize, answer: Vec<i64>) -> Option<Vec<i64>> {
        (answer.len() == ops).then_some(answer)
    }

    fn unclaimed(
        _conn: Server,
        _op: ReleaseOp,
        _released: i64,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // The release happened; nobody needs to hear it.
        Box::pin(async {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_answers_pair_up_per_key() {
        assert_eq!(
            Acquires::split(2, vec![1, 7, 0, 1500]),
            Some(vec![(1, 7), (0, 1500)])
        );
        assert_eq!(Acquires::split(2, vec![1, 7, 0]), None, "a short answer");
        assert_eq!(Acquires::split(1, vec![1, 7, 0, 1]), None, "a long answer");
    }

    #[test]
    fn release_answers_are_one_per_key() {
        assert_eq!(Releases::split(3, vec![1, 0, 1]), Some(vec![1, 0, 1]));
        assert_eq!(Releases::split(3, vec![1, 0]), None);
    }

    #[test]
    fn calls_list_every_key_before_every_argument() {
        let ops = [
            AcquireOp {
                lock: "p:{a}".into(),
                fence: "p:{a}:fence".into(),
                token: "t1".into(),
                ttl_ms: 100,
                retention_ms: 5000,
                release_unclaimed: None,
            },
            AcquireOp {
                lock: "p:{b}".into(),
                fence: "p:{b}:fence".into(),
                token: "t2".into(),
                ttl_ms: 200,
                retention_ms: 5000,
                release_unclaimed: None,
            },
        ];
        let call = Acquires::call(&ops);
        let words: Vec<String> = call
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a plain argument>".to_owned(),
            })
            .collect();
        assert_eq!(
            words[2..],
            [
                "4",
                "p:{a}",
                "p:{a}:fence",
                "p:{b}",
                "p:{b}:fence",
                "t1",
                "100",
                "t2",
                "200",
                "5000"
            ]
        );
        assert_eq!(words[0], "EVALSHA");
    }
}
