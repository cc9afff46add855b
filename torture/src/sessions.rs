//! Faults on the sessions that hold locks on a server (PostgreSQL's advisory locks,
//! MySQL's named locks): the server ends one, as its superuser, and its locks with it.

use crate::targets::LocalServers;

impl LocalServers {
    /// The `terminate-backend` fault: the server ends one worker session
    /// (`pg_terminate_backend`; each worker's sessions carry
    /// `application_name=torture-w<id>`), one that holds advisory locks if any does
    /// (so that its locks are freed and taken over), worker `worker`'s first among
    /// those, then at random. Returns the worker whose session it ended and the session's
    /// description, or `None` if no worker had a session.
    ///
    /// # Errors
    /// Not PostgreSQL, or `psql` failed.
    pub fn terminate_backend(&self, worker: usize) -> Result<Option<(usize, String)>, String> {
        let Self::Postgres(s) = self else {
            return Err("terminate-backend needs `--local postgres`".into());
        };
        let sql = format!(
            "SELECT a.application_name, a.pid, l.pid IS NOT NULL, pg_terminate_backend(a.pid) \
             FROM pg_stat_activity a \
             LEFT JOIN (SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted) l \
               ON l.pid = a.pid \
             WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid() \
               AND a.application_name LIKE 'torture-w%' \
             ORDER BY l.pid IS NULL, a.application_name <> '{}', random() LIMIT 1",
            application_name(worker)
        );
        let out = s.try_psql(&sql).map_err(|e| e.to_string())?;
        let fields: Vec<&str> = out.split('|').collect();
        let [name, pid, holds, _] = fields[..] else {
            return Ok(None);
        };
        let Some(Ok(ended)) = name.strip_prefix("torture-w").map(str::parse::<usize>) else {
            return Err(format!("terminate-backend: unexpected answer `{out}`"));
        };
        let holding = if holds == "t" { ", holding locks" } else { "" };
        Ok(Some((
            ended,
            format!("worker {ended} (session pid {pid}{holding})"),
        )))
    }

    /// The `terminate-backend` fault on MariaDB: `KILL` of one dlock session, one that
    /// holds a named lock if any does (found from the fence rows: the row's `conn` is the
    /// session that holds `name` when `IS_USED_LOCK(name)` says so; each worker's owner
    /// tokens end in `@torture-w<id>`, its `client_name`), worker `worker`'s first among
    /// those, then at random; if none holds one, any other session of the `dlock`
    /// database (a waiting or idle one, whose worker is not known). Returns the worker
    /// whose session it ended (if known) and the session's description, or `None` if
    /// there was no session.
    ///
    /// # Errors
    /// Not MySQL, or the `mariadb` client failed.
    pub fn kill_session(&self, worker: usize) -> Result<Option<(Option<usize>, String)>, String> {
        let Self::Mysql(s) = self else {
            return Err("killing a MySQL session needs `--local mysql`".into());
        };
        let sql = format!(
            "SELECT conn, holder FROM dlock_fences \
             WHERE conn IS NOT NULL AND IS_USED_LOCK(name) = conn \
             ORDER BY holder NOT LIKE '%@{}', RAND() LIMIT 1",
            application_name(worker)
        );
        let out = s.try_sql(&sql).map_err(|e| e.to_string())?;
        let (id, text, ended) = match out.split_once('\t') {
            Some((id, holder)) => {
                let ended = holder
                    .rsplit_once("@torture-w")
                    .and_then(|(_, n)| n.parse::<usize>().ok());
                let who = ended.map_or("a session".to_string(), |w| format!("worker {w}"));
                (
                    id.to_string(),
                    format!("{who} (connection {id}, holding locks)"),
                    ended,
                )
            }
            None => {
                let id = s
                    .try_sql(
                        "SELECT ID FROM information_schema.PROCESSLIST \
                         WHERE DB = 'dlock' AND ID <> CONNECTION_ID() ORDER BY RAND() LIMIT 1",
                    )
                    .map_err(|e| e.to_string())?;
                if id.is_empty() {
                    return Ok(None);
                }
                let text = format!("a session (connection {id}, holding nothing)");
                (id, text, None)
            }
        };
        if id.parse::<u64>().is_err() {
            return Err(format!("terminate-backend: unexpected answer `{out}`"));
        }
        match s.try_sql(&format!("KILL {id}")) {
            Ok(_) => Ok(Some((ended, text))),
            // it ended between the query and the KILL (its worker let go or died)
            Err(e) if e.to_string().contains("Unknown thread id") => {
                Ok(Some((ended, format!("{text}, gone before the KILL"))))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The `terminate-backend` fault where locks live in sessions: PostgreSQL's
    /// [`terminate_backend`](Self::terminate_backend), MariaDB's
    /// [`kill_session`](Self::kill_session). Returns the worker whose session ended (if
    /// known) and its description, or `None` if there was no session.
    ///
    /// # Errors
    /// Neither PostgreSQL nor MySQL, or the SQL client failed.
    pub fn end_session(&self, worker: usize) -> Result<Option<(Option<usize>, String)>, String> {
        match self {
            Self::Mysql(_) => self.kill_session(worker),
            _ => Ok(self
                .terminate_backend(worker)?
                .map(|(ended, text)| (Some(ended), text))),
        }
    }
}

/// The `application_name` worker `worker`'s PostgreSQL sessions carry, and the
/// `client_name` of its MySQL and file leases, so that `terminate-backend` and
/// `replace-lock-file` can find them (set in its URL unless the URL names one).
pub fn application_name(worker: usize) -> String {
    format!("torture-w{worker}")
}
