//! The options every lease is taken with (key, ttl, wait, renewal, backend),
//! their checks, and the builder setters `Lock`, `SegmentedLock` and
//! `Semaphore` share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::LockBackend;
use crate::lease::ttl::{DEFAULT_TTL, MAX_TTL, MIN_TTL};
use crate::{lease::observe, registry, LockError};

/// A key (a lock key, a semaphore name, a segmented lock's base key) and
/// how to take a lease on it.
#[derive(Clone)]
pub(crate) struct LeaseOptions {
    pub(crate) key: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: bool,
    pub(crate) backend: BackendChoice,
    /// The key stays taken at least this long after the acquisition, even
    /// when released sooner (`hold_at_least`).
    pub(crate) hold_at_least: Option<Duration>,
}

#[derive(Clone)]
pub(crate) enum BackendChoice {
    Default,
    Named(Arc<str>),
    /// The backend, and its scheme: the `backend` label operators see.
    Given(Arc<dyn LockBackend>, Arc<str>),
}

impl BackendChoice {
    /// A backend given directly, labelled by its scheme.
    pub(crate) fn given(backend: Arc<dyn LockBackend>) -> Self {
        let described = backend.describe();
        let scheme = crate::url::scheme(&described).unwrap_or("custom");
        BackendChoice::Given(backend, Arc::from(scheme))
    }
}

impl fmt::Debug for LeaseOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match &self.backend {
            BackendChoice::Default => "default".to_owned(),
            BackendChoice::Named(name) => format!("named {name:?}"),
            BackendChoice::Given(b, _) => b.describe(),
        };
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("renew", &self.renew)
            .field("hold_at_least", &self.hold_at_least)
            .field("backend", &backend)
            .finish()
    }
}

impl LeaseOptions {
    /// `key` with the default options.
    pub(crate) fn new(key: String) -> Self {
        LeaseOptions {
            key: Arc::from(key),
            ttl: DEFAULT_TTL,
            wait: None,
            renew: true,
            backend: BackendChoice::Default,
            hold_at_least: None,
        }
    }

    /// The same options on another key (a segment's key).
    pub(crate) fn with_key(&self, key: String) -> Self {
        LeaseOptions {
            key: Arc::from(key),
            ..self.clone()
        }
    }

    /// The `backend` label of spans and metrics: the registered name, or
    /// the scheme of a backend given directly (never an address or a
    /// credential).
    pub(crate) fn label(&self) -> Arc<str> {
        match &self.backend {
            BackendChoice::Default => observe::DEFAULT_BACKEND.clone(),
            BackendChoice::Named(name) => name.clone(),
            BackendChoice::Given(_, scheme) => scheme.clone(),
        }
    }

    /// Validates the key and ttl and finds the backend.
    pub(crate) fn check(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        crate::lease::background::check()?;
        crate::backend::key::validate(&self.key)?;
        if self.ttl < MIN_TTL {
            return Err(LockError::invalid_option(format!(
                "ttl {:?} for lock `{}` is shorter than the {MIN_TTL:?} minimum that renewal can keep; use a longer ttl",
                self.ttl, self.key
            )));
        }
        if self.ttl > MAX_TTL {
            return Err(LockError::invalid_option(format!(
                "ttl {:?} for lock `{}` is longer than the maximum of {MAX_TTL:?} (365 days, dlock::MAX_TTL); with renewal on, a 30 s ttl already keeps the lock for as long as the guard lives",
                self.ttl, self.key
            )));
        }
        if self
            .hold_at_least
            .is_some_and(|at_least| at_least > MAX_TTL)
        {
            return Err(LockError::invalid_option(format!(
                "hold_at_least {:?} for lock `{}` is longer than the maximum of {MAX_TTL:?} (dlock::MAX_TTL)",
                self.hold_at_least.unwrap_or_default(),
                self.key
            )));
        }
        match &self.backend {
            BackendChoice::Default => registry().default_backend(),
            BackendChoice::Named(name) => registry().get(name),
            BackendChoice::Given(b, _) => Ok(b.clone()),
        }
    }
}

/// The option setters of a type with a `options: LeaseOptions` field; the
/// docs of `ttl`, `wait` and `renew` are the type's own.
macro_rules! lease_option_setters {
    (ttl: $ttl:expr, wait: $wait:expr, renew: $renew:expr $(,)?) => {
        #[doc = $ttl]
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.options.ttl = ttl;
            self
        }

        #[doc = $wait]
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.options.wait = Some(wait);
            self
        }

        #[doc = $renew]
        pub fn renew(mut self, renew: bool) -> Self {
            self.options.renew = renew;
            self
        }

        /// Uses the backend registered under `name` in [`registry()`](crate::registry()).
        pub fn backend(mut self, name: impl Into<String>) -> Self {
            self.options.backend =
                $crate::lease::options::BackendChoice::Named(std::sync::Arc::from(name.into()));
            self
        }

        /// Uses this backend, bypassing the registry.
        pub fn with_backend(mut self, backend: std::sync::Arc<dyn $crate::LockBackend>) -> Self {
            self.options.backend = $crate::lease::options::BackendChoice::given(backend);
            self
        }
    };
}
pub(crate) use lease_option_setters;

/// The `hold_at_least` setter of a type with a `options: LeaseOptions`
/// field (locks, segmented locks, read-write locks: what a scheduled job
/// takes). Its doc example makes the lock `$new` of the type `$type`, then
/// runs `$then` (Rust lines, or none).
macro_rules! hold_at_least_setter {
    (type: $type:literal, new: $new:literal, then: $then:literal) => {
        /// Keeps the key taken at least `at_least` after the acquisition,
        /// even when the guard is released (or dropped) sooner: the
        /// `lockAtLeastFor` of a job that replicas run on a schedule, so a
        /// replica whose tick comes a little later finds the key still
        /// taken and skips the run, instead of running it again.
        ///
        /// - Redis and Redlock: the release sets the key's expiry to the
        ///   time left (a compare-and-set of its `PEXPIRE`, token checked)
        ///   instead of deleting it; the server keeps it, even if this
        ///   process crashes, and waiters are woken by its expiry.
        /// - memory, etcd, ZooKeeper: the release is deferred to that time,
        ///   on dlock's background runtime, the lease renewed until then.
        ///   A crash frees the key at the lease's expiry (etcd's lease, a
        ///   ZooKeeper session), which may be sooner.
        /// - A release after that time is an ordinary release. Default:
        ///   none. Longer than `MAX_TTL` is `InvalidOption`.
        ///
        #[doc = concat!(
            "```
use dlock::", $type, ";
use std::time::Duration;

# #[tokio::main(flavor = \"current_thread\")] async fn main() -> Result<(), dlock::LockError> {
let backend = dlock::connect(\"memory://\").await?;
// The nightly report: whichever replica runs it first, the others skip
// this tick even if the report takes a second.
let lock = ", $new, "
    .with_backend(backend)
    .wait(Duration::ZERO)
    .hold_at_least(Duration::from_secs(50));
", $then, "# Ok(()) }
```"
        )]
        pub fn hold_at_least(mut self, at_least: std::time::Duration) -> Self {
            self.options.hold_at_least = Some(at_least);
            self
        }
    };
}
pub(crate) use hold_at_least_setter;
