//! A wait in a server queue on a session ([`Session::wait_then`]), and how
//! it is left when its caller goes (the steps, and why only a
//! [`QueueWait`] is ever killed, are in `cancel.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use super::{bounded, opened, Failure, Parcel, Session, Undo};
use crate::backends::mysql::cancel::{self, QueueWait};

/// What follows a wait, on the same connection, while its caller is
/// there: given the wait's answer (1 granted, 0 ran out, `None` cut
/// short). Never killed.
pub(in crate::backends::mysql) type Then<T> = Box<
    dyn for<'c> FnOnce(
            &'c mut Conn,
            Option<i64>,
        )
            -> Pin<Box<dyn Future<Output = Result<T, mysql_async::Error>> + Send + 'c>>
        + Send,
>;

/// How a wait in a server queue is left when its caller leaves.
pub(in crate::backends::mysql) struct Cancel {
    /// A live session of the lock pool to send `KILL QUERY` from (`None`:
    /// none could be had; the waiting session is closed instead).
    pub(in crate::backends::mysql) killer: Option<Arc<Session>>,
    /// Statements that let go whatever the wait may have taken (harmless
    /// where nothing is held).
    pub(in crate::backends::mysql) let_go: String,
}

impl Cancel {
    /// The answer of `work`, the wait on connection `id`, once killed;
    /// `None` if no kill could be sent or it did not answer.
    async fn answer_of<F: Future>(&self, id: u32, mut work: Pin<&mut F>) -> Option<F::Output> {
        let killer = self.killer.as_ref()?;
        for _ in 0..cancel::KILLS {
            if !killer.kill_query(id).await {
                return None;
            }
            if let Ok(answer) = tokio::time::timeout(cancel::ANSWER_WITHIN, work.as_mut()).await {
                return Some(answer);
            }
        }
        None
    }
}

/// How a wait ended.
enum Waited {
    /// Answered while its caller was there.
    Answered(Result<Option<i64>, Failure>),
    /// Its caller left first: killed, and answered (`None`: not).
    Left(Option<Result<Option<i64>, Failure>>),
}

impl Session {
    /// Waits in a server queue with `wait` (at most `limit`), then runs
    /// `then` with its answer (within `then_limit`), in one task on dlock's
    /// background runtime, behind the session's earlier requests.
    ///
    /// If the caller leaves during the wait, the wait is killed, and what
    /// it may have taken is let go as `cancel` says; if it leaves as the
    /// wait answers, `then` is not sent and the same is let go. If it
    /// leaves during `then`, `then` finishes (it is never killed) and
    /// `abandoned` says what to undo, as for [`call`](Self::call).
    pub(in crate::backends::mysql) async fn wait_then<T: Send + 'static>(
        self: &Arc<Self>,
        limit: Option<Duration>,
        wait: QueueWait,
        cancel: Cancel,
        then: (Then<T>, Duration),
        abandoned: impl FnOnce(Option<&T>) -> Undo + Send + 'static,
    ) -> Result<T, Failure> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let session = self.clone();
        crate::lease::background::spawn_daemon(async move {
            session
                .serve_wait(tx, limit, wait, cancel, then, abandoned)
                .await;
        });
        opened(rx).await
    }

    async fn serve_wait<T: Send + 'static>(
        self: Arc<Self>,
        mut tx: tokio::sync::oneshot::Sender<Parcel<T>>,
        limit: Option<Duration>,
        wait: QueueWait,
        cancel: Cancel,
        (then, then_limit): (Then<T>, Duration),
        abandoned: impl FnOnce(Option<&T>) -> Undo,
    ) {
        let mut guard = self.conn.lock().await;
        if tx.is_closed() {
            // The caller left before the wait was sent: not sent.
            if let Some(name) = abandoned(None).forget {
                self.unreserve(&name);
            }
            return;
        }
        let waited = match guard.as_mut() {
            None => Waited::Answered(Err(Failure::closed())),
            Some(conn) => {
                let work = bounded(limit, wait.answer(conn));
                tokio::pin!(work);
                tokio::select! {
                    answer = &mut work => Waited::Answered(answer),
                    () = tx.closed() => Waited::Left(cancel.answer_of(self.id, work).await),
                }
            }
        };
        let (answer, killed) = match waited {
            Waited::Answered(answer) if !tx.is_closed() => {
                // The caller is there: what follows the wait.
                let answer = match (answer, guard.as_mut()) {
                    (Ok(got), Some(conn)) => bounded(Some(then_limit), then(conn, got)).await,
                    (Ok(_), None) => Err(Failure::closed()),
                    (Err(failure), _) => Err(failure),
                };
                self.deliver(&mut guard, tx, answer, abandoned).await;
                return;
            }
            Waited::Answered(answer) => (answer, false),
            Waited::Left(Some(answer)) => (answer, true),
            Waited::Left(None) => {
                // Not ended by a kill: closing the connection takes the
                // session out of the server's queue and frees any grant.
                *guard = None;
                self.died();
                return;
            }
        };
        // Nobody reads the answer: what the wait took is let go here.
        if answer.as_ref().is_err_and(|f| f.broken) {
            *guard = None;
            self.died();
        }
        let kept = match guard.as_mut() {
            Some(conn) => cancel::let_go(conn, &cancel.let_go).await,
            None => false,
        };
        if !kept {
            *guard = None;
            self.died();
        }
        tracing::debug!(
            id = self.id,
            killed,
            granted_in_race = matches!(answer, Ok(Some(1))),
            kept,
            "MySQL wait left by its caller: what it took let go"
        );
        if let Some(name) = abandoned(None).forget {
            self.unreserve(&name);
        }
    }

    /// Sends `KILL QUERY id` on this session, behind its requests: whether
    /// the server took it. Run on the task of the killed wait.
    async fn kill_query(&self, id: u32) -> bool {
        let mut guard = self.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            return false;
        };
        let sent = tokio::time::timeout(cancel::LIMIT, conn.query_drop(cancel::kill_query(id)));
        match sent.await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(id, error = %e, "MySQL KILL QUERY of a cancelled wait refused");
                if Failure::from(e).broken {
                    *guard = None;
                    self.died();
                }
                false
            }
            Err(_) => {
                *guard = None;
                self.died();
                false
            }
        }
    }
}
