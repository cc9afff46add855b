//! Release of a lease whose acquire script was in flight when its caller
//! gave up.
//!
//! A caller may drop an `acquire` future at any `.await`: a timeout, a
//! `select!`, or a `SegmentedLock` that keeps the first of several waits and
//! drops the rest. If the acquire script was already sent, Redis runs it
//! anyway, and without this the lease would sit unused until its ttl ran out
//! (with `SegmentedLock` that is frequent, not a corner case: a waiter often
//! has several segment attempts in flight when one wins).
//!
//! The guard is armed before the script is sent and disarmed once its answer
//! was read. Dropped while armed, it queues the compare-and-delete script
//! with the same token on the same connection (the lane it is dropped in,
//! the acquire's: see `lanes.rs`), behind the acquire script, so Redis runs
//! it after the acquire; if the acquire never ran, it is a no-op.

use redis::Script;

use crate::backends::redis::protocol::scripts::{evalsha, run};
use crate::backends::redis::Conn;

/// Releases `token` on `key` if dropped before [`disarm`](Self::disarm).
///
/// It borrows what it needs and copies it only when it fires, so arming it
/// on every attempt costs no allocation.
pub(in crate::backends::redis) struct ReleaseIfDropped<'a> {
    armed: Option<Armed<'a>>,
}

struct Armed<'a> {
    conn: &'a Conn,
    /// `RELEASE` or `RELEASE_PERMIT`: both take one key, the token and the
    /// release channel.
    script: &'static Script,
    key: &'a str,
    token: &'a str,
    channel: &'a str,
}

impl<'a> ReleaseIfDropped<'a> {
    pub(in crate::backends::redis) fn arm(
        conn: &'a Conn,
        script: &'static Script,
        key: &'a str,
        token: &'a str,
        channel: &'a str,
    ) -> Self {
        ReleaseIfDropped {
            armed: Some(Armed {
                conn,
                script,
                key,
                token,
                channel,
            }),
        }
    }

    /// The answer was read: the caller owns the outcome now.
    pub(in crate::backends::redis) fn disarm(&mut self) {
        self.armed = None;
    }
}

impl crate::backends::redis::topology::replicas::Disarm for ReleaseIfDropped<'_> {
    fn disarm(&mut self) {
        ReleaseIfDropped::disarm(self);
    }
}

impl Drop for ReleaseIfDropped<'_> {
    fn drop(&mut self) {
        let Some(armed) = self.armed.take() else {
            return;
        };
        let (conn, script) = (armed.conn.clone(), armed.script);
        let (key, token, channel) = (
            armed.key.to_owned(),
            armed.token.to_owned(),
            armed.channel.to_owned(),
        );
        // On dlock's background runtime: the caller's runtime may be
        // shutting down (the likely reason the acquire was dropped) or
        // idle. In the lane of the acquire (see `lanes.rs`) and handed over
        // after the acquire's own request, it reaches the same connection
        // behind it. If it cannot run at all, the ttl is the backstop.
        crate::backends::redis::transport::lanes::spawn_following(async move {
            match conn {
                Conn::Single(mut c) => {
                    release_abandoned(&mut c, script, &key, &token, &channel).await
                }
                Conn::Cluster(mut c) => {
                    release_abandoned(&mut c, script, &key, &token, &channel).await
                }
            }
        });
    }
}

/// Runs `script` (`RELEASE` or `RELEASE_PERMIT`: one key, the token, the
/// release channel) for an acquisition whose caller went away. A failure is
/// only logged: the lease then expires by its ttl.
pub(in crate::backends::redis) async fn release_abandoned<C>(
    conn: &mut C,
    script: &Script,
    key: &str,
    token: &str,
    channel: &str,
) where
    C: redis::aio::ConnectionLike + Send,
{
    let mut call = evalsha(script, 1);
    call.arg(key).arg(token).arg(channel);
    let answer: redis::RedisResult<i64> = run(conn, script, &call).await;
    if let Err(e) = answer {
        tracing::debug!(%key, error = %e, "could not release an abandoned acquisition; it expires by its ttl");
    }
}
