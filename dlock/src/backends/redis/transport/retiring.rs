//! A connection that a request left without an answer retires, for one
//! server's connections (`connection.rs`) and a Cluster's (`cluster.rs`).

use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use redis::RedisResult;

/// One connection, which a request left without an answer retires.
///
/// Why: the client library resends or reconnects only when it sees the
/// connection drop. A flow that a NAT or a load balancer forgot, or a
/// server that stopped answering, drops nothing: every request times out
/// on it, for ever, while a new connection would work at once. So a
/// request that timed out retires its connection: new requests open a new
/// one; requests in flight on it finish there (a late answer reaches only
/// the request it belongs to, in the connection's order). TCP keep-alive
/// and `TCP_USER_TIMEOUT` (`config.rs`) catch the same on an idle
/// connection, where no request times out.
///
/// Work that follows a request (`lanes::following`: the release of an
/// acquisition that failed or was dropped) still goes on the retired
/// connection until a new one is open: the request it follows may yet
/// reach the server (bytes held in the network are delivered late), and
/// only on the same connection is the follower sure to land after it. Sent
/// on a new connection, the release could land first and leave the late
/// grant on the key until its ttl.
pub(in crate::backends::redis) struct Retiring<C> {
    current: Mutex<Current<C>>,
    /// Held while a new connection opens, so that concurrent requests open
    /// one, not one each.
    opening: tokio::sync::Mutex<()>,
}

impl<C> Default for Retiring<C> {
    fn default() -> Self {
        Retiring {
            current: Mutex::new(Current {
                conn: None,
                retired: false,
                opened: 0,
            }),
            opening: tokio::sync::Mutex::new(()),
        }
    }
}

/// The connection in use, if any, whether it is retired, and how many
/// were opened (the next one's number).
struct Current<C> {
    conn: Option<Numbered<C>>,
    retired: bool,
    opened: u64,
}

/// A connection, and which one it is (so that a late timeout of an
/// earlier one does not retire its successor).
#[derive(Clone)]
pub(in crate::backends::redis) struct Numbered<C> {
    pub(in crate::backends::redis) number: u64,
    pub(in crate::backends::redis) conn: C,
}

impl<C: Clone> Retiring<C> {
    pub(in crate::backends::redis) fn with(conn: C) -> Self {
        let retiring = Retiring::default();
        retiring.install(conn);
        retiring
    }

    fn lock(&self) -> MutexGuard<'_, Current<C>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn install(&self, conn: C) -> Numbered<C> {
        let mut current = self.lock();
        let numbered = Numbered {
            number: current.opened,
            conn,
        };
        current.opened += 1;
        current.conn = Some(numbered.clone());
        current.retired = false;
        numbered
    }

    /// The connection for a request: the one in use if it is not retired,
    /// or if the request follows another (see the type's docs).
    fn get(&self, following: bool) -> Option<Numbered<C>> {
        let current = self.lock();
        match &current.conn {
            Some(conn) if !current.retired || following => Some(conn.clone()),
            _ => None,
        }
    }

    /// Whether this has a connection, retired or not.
    pub(in crate::backends::redis) fn is_empty(&self) -> bool {
        self.lock().conn.is_none()
    }

    /// The connection for a request, or a new one that `open` opens here
    /// (a connection's driver lives where it is opened).
    pub(in crate::backends::redis) async fn get_or_open<F>(
        &self,
        open: impl FnOnce() -> F,
        following: bool,
    ) -> RedisResult<Numbered<C>>
    where
        F: Future<Output = RedisResult<C>>,
    {
        if let Some(current) = self.get(following) {
            return Ok(current);
        }
        let _opening = self.opening.lock().await;
        if let Some(current) = self.get(following) {
            return Ok(current);
        }
        Ok(self.install(open().await?))
    }

    /// Retires the connection in use, whatever it is (see
    /// `Connection::retire_all`).
    #[cfg(feature = "redlock")]
    pub(in crate::backends::redis) fn retire(&self) {
        let mut current = self.lock();
        if current.conn.is_some() {
            current.retired = true;
        }
    }

    /// Retires connection `number` if `answer` says it did not answer in
    /// time; returns `answer`.
    pub(in crate::backends::redis) fn check<T>(
        &self,
        number: u64,
        answer: RedisResult<T>,
    ) -> RedisResult<T> {
        self.check_by(number, answer, redis::RedisError::is_timeout)
    }

    /// Retires connection `number` if `answer` is an error that `retires`
    /// says the connection cannot come back from; returns `answer`.
    pub(in crate::backends::redis) fn check_by<T>(
        &self,
        number: u64,
        answer: RedisResult<T>,
        retires: impl Fn(&redis::RedisError) -> bool,
    ) -> RedisResult<T> {
        if let Err(e) = &answer
            && retires(e)
        {
            let mut current = self.lock();
            let this = current.conn.as_ref().is_some_and(|c| c.number == number);
            if this && !current.retired {
                current.retired = true;
                drop(current);
                tracing::debug!(error = %e,
                        "a Redis request failed for good on its connection (no answer in time); the connection is retired, the next request opens a new one");
            }
        }
        answer
    }
}
