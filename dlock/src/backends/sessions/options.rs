//! The URL options of the backends whose locks live in server sessions
//! (PostgreSQL, MySQL): how many sessions, their bounds and timeouts, the
//! client's name and the fences' retention. Each is parsed and documented
//! here once; a backend's own options (TLS, schema or database, prefix)
//! stay in its `config.rs`.

use std::time::Duration;

use crate::url::options;

/// How many sessions (connections) hold locks, unless `?sessions=` says
/// otherwise; as many again may wait in the server's queues.
const DEFAULT_SESSIONS: usize = 4;
/// The most sessions of each kind one backend opens.
const MAX_SESSIONS: usize = 64;
/// The bound on connecting and on one request, unless `?timeout=` says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server lets a lock-holding session be silent before it
/// ends it, unless `?session_timeout=` says otherwise.
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `?session_timeout=`: a day.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(86_400);

/// How a backend's server counts its session timeout.
pub(crate) struct SessionClock {
    /// The shortest `?session_timeout=` the backend takes.
    pub(crate) min: Duration,
    /// Whether the server counts whole seconds (MySQL's `wait_timeout`):
    /// then a fraction is dropped, and the error says why the minimum is what it is.
    pub(crate) whole_seconds: bool,
}

/// The session options of one URL, each its default until the URL sets it.
#[derive(Debug, Clone)]
pub(crate) struct SessionOptions {
    /// `?sessions=`: how many sessions hold locks.
    pub(crate) sessions: usize,
    /// `?timeout=`: the bound on connecting and on one request.
    pub(crate) timeout: Duration,
    /// `?session_timeout=`: the server ends a session silent that long.
    pub(crate) session_timeout: Duration,
    /// `?client_name=`.
    pub(crate) client_name: Option<String>,
    /// `?tcp_keepalive=` as written: `None` when not given, `Some(None)` for `off`.
    pub(crate) tcp_keepalive: Option<Option<Duration>>,
    /// `?fence_retention=`.
    pub(crate) fence_retention: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            sessions: DEFAULT_SESSIONS,
            timeout: DEFAULT_TIMEOUT,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            client_name: None,
            tcp_keepalive: None,
            fence_retention: crate::backends::fence_retention::DEFAULT_FENCE_RETENTION,
        }
    }
}

impl SessionOptions {
    /// The client name the backend gives its holders: `?client_name=`, or
    /// the process's default (`backend/holder.rs`).
    pub(crate) fn client_name(&self) -> &str {
        self.client_name
            .as_deref()
            .unwrap_or_else(|| crate::backend::holder::default_client_name())
    }

    /// Takes the URL parameter `name` with its decoded `value` if it is one
    /// of these options: `Ok(true)` when taken, `Ok(false)` when it is not
    /// one of them (the backend reads it), an error naming the parameter
    /// and what it takes when its value is wrong.
    pub(crate) fn take(
        &mut self,
        name: &str,
        value: &str,
        clock: &SessionClock,
    ) -> Result<bool, String> {
        match name {
            "client_name" => {
                let checked =
                    crate::backend::holder::check_client_name(value).map_err(|e| e.to_string())?;
                self.client_name = Some(checked);
            }
            "timeout" => self.timeout = options::duration(name, value)?,
            "tcp_keepalive" => self.tcp_keepalive = Some(options::duration_or_off(name, value)?),
            "session_timeout" => self.session_timeout = session_timeout(value, clock)?,
            "sessions" => {
                self.sessions = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_SESSIONS).contains(n))
                    .ok_or_else(|| {
                        format!("`sessions={value}` must be a number from 1 to {MAX_SESSIONS}")
                    })?
            }
            "fence_retention" => {
                self.fence_retention = crate::backends::fence_retention::parse(value)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `?session_timeout=`: between the server's shortest and a day.
fn session_timeout(value: &str, clock: &SessionClock) -> Result<Duration, String> {
    let d = options::duration("session_timeout", value)?;
    if !(clock.min..=MAX_SESSION_TIMEOUT).contains(&d) {
        let why = if clock.whole_seconds {
            " (the server's `wait_timeout` counts whole seconds)"
        } else {
            ""
        };
        return Err(format!(
            "`session_timeout={value}` must be between {:?} and one day{why}",
            clock.min
        ));
    }
    Ok(if clock.whole_seconds {
        Duration::from_secs(d.as_secs())
    } else {
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MYSQL: SessionClock = SessionClock {
        min: Duration::from_secs(2),
        whole_seconds: true,
    };

    #[test]
    fn takes_its_own_options_and_leaves_the_others() {
        let mut o = SessionOptions::default();
        assert_eq!(o.take("sessions", "8", &MYSQL), Ok(true));
        assert_eq!(o.take("tcp_keepalive", "0", &MYSQL), Ok(true));
        assert_eq!(o.take("schema", "locks", &MYSQL), Ok(false));
        assert_eq!((o.sessions, o.tcp_keepalive), (8, Some(None)));
    }

    #[test]
    fn bad_values_name_the_option_and_its_range() {
        let mut o = SessionOptions::default();
        let e = o.take("sessions", "0", &MYSQL).unwrap_err();
        assert!(
            e.contains("`sessions=0` must be a number from 1 to 64"),
            "{e}"
        );
        let e = o.take("session_timeout", "1s", &MYSQL).unwrap_err();
        assert!(e.contains("between 2s and one day"), "{e}");
        assert!(e.contains("whole seconds"), "{e}");
    }

    #[test]
    fn whole_second_servers_drop_the_fraction() {
        let mut o = SessionOptions::default();
        o.take("session_timeout", "2500ms", &MYSQL).unwrap();
        assert_eq!(o.session_timeout, Duration::from_secs(2));
    }
}
