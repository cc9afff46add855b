//! What an acquisition dropped with its script in flight may have taken:
//! given back in the background, so that it is not left held until its ttl
//! by nobody.

use super::scripts::RELEASE;
use crate::backends::redis::protocol::scripts::run;
use crate::backends::redis::Conn;

/// Sends its release call on drop unless disarmed.
pub(super) struct ReleaseIfDropped {
    armed: Option<(Conn, redis::Cmd)>,
}

impl ReleaseIfDropped {
    /// Armed with `call`, a [`RELEASE`] call of the attempt's holder field.
    pub(super) fn arm(conn: &Conn, call: redis::Cmd) -> Self {
        ReleaseIfDropped {
            armed: Some((conn.clone(), call)),
        }
    }

    /// The attempt's answer arrived: nothing to give back.
    pub(super) fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for ReleaseIfDropped {
    fn drop(&mut self) {
        let Some((conn, call)) = self.armed.take() else {
            return;
        };
        // On dlock's background runtime, in the attempt's lane: behind the
        // attempt on the same connection. The ttl is the backstop.
        crate::backends::redis::transport::lanes::spawn_following(async move {
            let answer: redis::RedisResult<i64> = match conn {
                Conn::Single(mut c) => run(&mut c, &RELEASE, &call).await,
                Conn::Cluster(mut c) => run(&mut c, &RELEASE, &call).await,
            };
            if let Err(e) = answer {
                tracing::debug!(error = %e, "could not release an abandoned Redisson-layout acquisition; it expires by its ttl");
            }
        });
    }
}
