//! The scheme table: every URL scheme `connect` knows, the backend and the
//! cargo feature behind it, and whether that backend has semaphores,
//! read-write locks and leader election.
//! `connect`, its errors, `backend::no_semaphores` and
//! `backend::no_rw_locks` read it; the table in `backends`' docs shows it.

/// One backend's row.
#[derive(Debug)]
pub(crate) struct Scheme {
    /// Its URL schemes; the first one names the backend in lists.
    pub(crate) names: &'static [&'static str],
    /// The cargo feature that builds it; `None`: always built.
    pub(crate) feature: Option<&'static str>,
    /// Whether the backend has semaphores (implements `PermitBackend`).
    pub(crate) semaphores: bool,
    /// Whether its semaphores take several permits in one request
    /// (`PermitBackend::many_permits`).
    pub(crate) many_permits: bool,
    /// Whether the backend has read-write locks (implements `RwBackend`).
    pub(crate) rw_locks: bool,
    /// Whether the backend has leader election (implements `ElectionBackend`).
    pub(crate) elections: bool,
    /// Which backend `connect` builds for it.
    pub(crate) backend: Backend,
}

/// The backends `connect` can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    Redis,
    Redlock,
    Etcd,
    ZooKeeper,
    Postgres,
    Mysql,
    File,
}

/// Every scheme, in the order errors list them.
pub(crate) const SCHEMES: &[Scheme] = &[
    Scheme {
        names: &["memory"],
        feature: None,
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::Memory,
    },
    Scheme {
        names: &[
            "redis",
            "rediss",
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ],
        feature: Some("redis"),
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::Redis,
    },
    Scheme {
        names: &["redlock"],
        feature: Some("redlock"),
        semaphores: false,
        many_permits: false,
        rw_locks: false,
        elections: false,
        backend: Backend::Redlock,
    },
    Scheme {
        names: &["etcd", "etcds"],
        feature: Some("etcd"),
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::Etcd,
    },
    Scheme {
        names: &["zk", "zks"],
        feature: Some("zookeeper"),
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::ZooKeeper,
    },
    Scheme {
        names: &["postgres", "postgresql"],
        feature: Some("postgres"),
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::Postgres,
    },
    Scheme {
        names: &["mysql", "mysqls"],
        feature: Some("mysql"),
        semaphores: true,
        many_permits: false,
        rw_locks: false,
        elections: false,
        backend: Backend::Mysql,
    },
    Scheme {
        names: &["file"],
        feature: Some("file"),
        semaphores: true,
        many_permits: true,
        rw_locks: true,
        elections: true,
        backend: Backend::File,
    },
];

/// The row of the URL scheme `scheme`.
pub(crate) fn find(scheme: &str) -> Option<&'static Scheme> {
    SCHEMES.iter().find(|row| row.names.contains(&scheme))
}

/// Every scheme `connect` knows, as `memory://, redis://, … and zks://`.
pub(crate) fn all_listed() -> String {
    listed(SCHEMES.iter().flat_map(|row| row.names).copied(), "and")
}

/// The backends with semaphores, by their first scheme: `memory://, …
/// or zk://`.
pub(crate) fn with_semaphores_listed() -> String {
    listed(
        SCHEMES
            .iter()
            .filter(|row| row.semaphores)
            .map(|row| row.names[0]),
        "or",
    )
}

/// The backends whose semaphores take several permits at once, by their
/// first scheme.
pub(crate) fn with_many_permits_listed() -> String {
    listed(
        SCHEMES
            .iter()
            .filter(|row| row.many_permits)
            .map(|row| row.names[0]),
        "or",
    )
}

/// The backends with read-write locks, by their first scheme.
pub(crate) fn with_rw_locks_listed() -> String {
    listed(
        SCHEMES
            .iter()
            .filter(|row| row.rw_locks)
            .map(|row| row.names[0]),
        "or",
    )
}

/// The backends with leader election, by their first scheme.
pub(crate) fn with_elections_listed() -> String {
    listed(
        SCHEMES
            .iter()
            .filter(|row| row.elections)
            .map(|row| row.names[0]),
        "or",
    )
}

/// `a://, b:// <last_joiner> c://`.
fn listed<'a>(schemes: impl Iterator<Item = &'a str>, last_joiner: &str) -> String {
    let schemes: Vec<String> = schemes.map(|s| format!("{s}://")).collect();
    match schemes.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} {last_joiner} {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_is_in_one_row() {
        let mut names: Vec<&str> = SCHEMES.iter().flat_map(|row| row.names).copied().collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a scheme is in two rows");
        assert_eq!(find("etcds").map(|row| row.backend), Some(Backend::Etcd));
        assert!(find("mongo").is_none());
    }

    #[test]
    fn lists_read_as_prose() {
        assert_eq!(
            with_semaphores_listed(),
            "memory://, redis://, etcd://, zk://, postgres://, mysql:// or file://"
        );
        assert_eq!(
            with_rw_locks_listed(),
            "memory://, redis://, etcd://, zk://, postgres:// or file://"
        );
        assert_eq!(
            with_elections_listed(),
            "memory://, redis://, etcd://, zk://, postgres:// or file://"
        );
        assert!(all_listed().starts_with("memory://, redis://, rediss://"));
        assert!(
            all_listed().ends_with(", postgres://, postgresql://, mysql://, mysqls:// and file://")
        );
    }
}
