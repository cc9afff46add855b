//! A request etcd refused (`etcdserver: permission denied`: the user's role
//! lacks a grant) becomes an error that names the lock and the key range
//! the role needs.

use super::names::Kind;
use super::Inner;
use crate::backend::refusal::{explain, says};
use crate::LockError;

/// What a request was about: the lock, read-write lock, semaphore or election name.
#[derive(Clone, Copy)]
pub(super) enum About<'a> {
    Lock(&'a str),
    Rw(&'a str),
    Semaphore(&'a str),
    Election(&'a str),
}

impl Inner {
    /// `error`, or, if etcd refused it for want of permission, an error
    /// that names `about` and the prefix its role needs.
    pub(super) fn name_refusal(&self, error: LockError, about: About<'_>) -> LockError {
        explain(
            error,
            |source| says(source, "permission denied"),
            || {
                let (kind, name, range) = match about {
                    About::Lock(key) => ("lock", key, self.root(Kind::Lock)),
                    About::Rw(key) => ("read-write lock", key, self.root(Kind::Rw)),
                    About::Semaphore(name) => ("semaphore", name, self.root(Kind::Semaphore)),
                    About::Election(name) => ("election", name, self.root(Kind::Election)),
                };
                format!(
                    "etcd refused a request for the {kind} `{name}`: the user's role needs readwrite on the key prefix `{range}` (`etcdctl role grant-permission --prefix=true <role> readwrite {range}`; see the README's Permissions section)"
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
                    "etcd refused to let this user read the key prefix `{0}/`: its role needs readwrite on `{0}/`, `{0}-rw/` and `{0}-semaphores/`, and `{0}-election/` for leader elections (see the README's Permissions section)",
                    self.prefix
                )
            },
        )
    }
}
