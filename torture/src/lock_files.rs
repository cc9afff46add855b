//! `--local file`: a throwaway directory of lock files, and the `replace-lock-file` fault
//! that takes a held one from its holder.

use std::path::Path;

use dlock::backends::file::FileBackend;
use dlock::LockBackend;

use crate::sessions::application_name;

/// The directory of `--local file`, and what the `replace-lock-file` fault needs: dlock's
/// own view of the directory (`list` finds the held lock files and their holders from
/// `/proc/locks` and the records) on a runtime of its own (the nemesis is a plain thread).
pub struct LockFiles {
    // Field order: the backend closes its directory before the directory goes.
    backend: FileBackend,
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
    /// How many `replace-lock-file` faults ran: even ones remove the file, odd ones replace it.
    replaced: usize,
}

impl LockFiles {
    /// A fresh directory under `$TMPDIR`.
    ///
    /// # Errors
    /// The directory or the runtime could not be made, or dlock refused the directory.
    pub fn start() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("dlock-torture-files-")
            .tempdir()
            .map_err(|e| format!("create a temp directory for the lock files: {e}"))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        let url = format!(
            "file://{}?client_name=torture-nemesis",
            dir.path().display()
        );
        let backend = runtime
            .block_on(FileBackend::connect(&url))
            .map_err(|e| format!("{url}: {e}"))?;
        Ok(Self {
            backend,
            runtime,
            dir,
            replaced: 0,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `replace-lock-file` fault: takes one held lock file away from its holder,
    /// worker `worker`'s if it holds one, else another worker's: removes it (even faults)
    /// or renames a new empty file over it (odd ones, as `force_release` does). Returns
    /// the worker whose file it was (if its record names one) and what was done, or `None`
    /// if no lock file was held.
    ///
    /// # Errors
    /// Listing the directory, removing or replacing the file failed.
    pub fn replace_held(
        &mut self,
        worker: usize,
    ) -> Result<Option<(Option<usize>, String)>, String> {
        let held = self
            .runtime
            .block_on(self.backend.list("torture:"))
            .map_err(|e| format!("list the lock files: {e}"))?;
        let mine = application_name(worker);
        let pick = held
            .iter()
            .find(|(_, info)| info.holder.as_deref() == Some(mine.as_str()))
            .or_else(|| held.first());
        let Some((key, info)) = pick else {
            return Ok(None);
        };
        let owner = info
            .holder
            .as_deref()
            .and_then(|h| h.strip_prefix("torture-w"))
            .and_then(|n| n.parse::<usize>().ok());
        let path = self.backend.lock_path(key);
        let how = if self.replaced.is_multiple_of(2) {
            std::fs::remove_file(&path).map_err(|e| format!("remove {}: {e}", path.display()))?;
            "removed"
        } else {
            let replaced = self
                .runtime
                .block_on(self.backend.force_release(key))
                .map_err(|e| format!("replace {}: {e}", path.display()))?;
            if replaced {
                "replaced"
            } else {
                "found free (released meanwhile)"
            }
        };
        self.replaced += 1;
        let who = owner.map_or("a lock file".to_string(), |w| format!("worker {w}"));
        Ok(Some((
            owner,
            format!(
                "{who} ({key}, fence {}, {how})",
                info.fencing_token
                    .map_or("none".to_string(), |f| f.to_string())
            ),
        )))
    }
}
