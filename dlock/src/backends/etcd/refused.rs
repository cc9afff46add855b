//! A request etcd refused (`etcdserver: permission denied`: the user's role
//! lacks a grant) becomes an error that names the lock and the key range
//! the role needs.

use super::names::Kind;
use super::Inner;
pub(super) use crate::backend::refusal::About;
use crate::backend::refusal::{explain, says, SEE_PERMISSIONS};
use crate::LockError;

impl Inner {
    /// `error`, or, if etcd refused it for want of permission, an error
    /// that names `about` and the prefix its role needs.
    pub(super) fn name_refusal(&self, error: LockError, about: About<'_>) -> LockError {
        explain(
            error,
            |source| says(source, "permission denied"),
            || {
                let range = match about {
                    About::Lock(_) => self.root(Kind::Lock),
                    About::Rw(_) => self.root(Kind::Rw),
                    About::Semaphore(_) => self.root(Kind::Semaphore),
                    About::Election(_) => self.root(Kind::Election),
                };
                let (kind, name) = (about.kind(), about.name());
                format!(
                    "etcd refused a request for the {kind} `{name}`: the user's role needs readwrite on the key prefix `{range}` (`etcdctl role grant-permission --prefix=true <role> readwrite {range}`; {SEE_PERMISSIONS})"
                )
            },
        )
    }

    /// `error`, or, if etcd refused the read at connect, an error that names
    /// the prefix the role must be able to read.
    pub(super) fn name_connect_refusal(&self, error: LockError) -> LockError {
        explain(
            error,
            |source| says(source, "permission denied"),
            || {
                format!(
                    "etcd refused to let this user read the key prefix `{0}/`: its role needs readwrite on `{0}/`, `{0}-rw/` and `{0}-semaphores/`, and `{0}-election/` for leader elections ({SEE_PERMISSIONS})",
                    self.prefix
                )
            },
        )
    }
}
