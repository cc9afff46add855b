//! What an operator reads of a semaphore in a lock directory: who holds
//! its slot files (the processes `/proc/locks` names) and the count file's
//! number; the semaphores are the count files of the directory.

use std::collections::BTreeMap;

use super::inspect::flock_holders;
use super::permits::MAX_PERMITS;
use super::{lock_file, names, FileBackend};
use crate::backend::holder::{too_many_to_list, MAX_LISTED};
use crate::backend::{LockBackend, PermitHolder, SemaphoreInfo};
use crate::LockError;

impl FileBackend {
    /// The holders of `name`'s slots below its stored count, one per
    /// process (`pid <n>`; without `/proc/locks`, one unnamed holder per
    /// held slot), and the count; nothing while no slot is held.
    pub(super) fn semaphore_info(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        crate::backend::key::validate(name)?;
        let files = self.sem_files(name);
        let stored = self.stored_count(&files)?;
        let Some(stored) = stored else {
            return Ok(SemaphoreInfo::new(None, Vec::new()));
        };
        let table = flock_holders();
        let mut by_pid: BTreeMap<u32, usize> = BTreeMap::new();
        let mut unnamed = 0;
        for i in 0..stored.min(MAX_PERMITS) {
            let slot = files.slot(i);
            match &table {
                Some(table) => {
                    let id = lock_file::identity_at(&self.dir, &slot).map_err(|e| {
                        self.failed(
                            "cannot read the semaphore file",
                            &slot,
                            lock_file::FileError::from(e),
                        )
                    })?;
                    if let Some(pid) = id.and_then(|id| table.get(&id)) {
                        *by_pid.entry(*pid).or_default() += 1;
                    }
                }
                None => {
                    if self.slot_held(&slot, None)? {
                        unnamed += 1;
                    }
                }
            }
        }
        let mut holders: Vec<_> = by_pid
            .into_iter()
            .map(|(pid, count)| {
                // 0: a process outside this pid namespace.
                let session = (pid != 0).then(|| format!("pid {pid}"));
                PermitHolder::new(None, session, count)
            })
            .collect();
        holders.extend((0..unnamed).map(|_| PermitHolder::new(None, None, 1)));
        let permits = (!holders.is_empty()).then_some(stored);
        Ok(SemaphoreInfo::new(permits, holders))
    }

    /// The semaphores of this prefix whose names start with `prefix`: their
    /// count files (a semaphore with a hashed long name is not found).
    pub(super) fn semaphores_named(&self, prefix: &str) -> Result<Vec<String>, LockError> {
        let entries = self.entries()?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file
                .to_str()
                .and_then(|f| names::sem_name_of(&self.config.prefix, f))
            else {
                continue;
            };
            if !name.starts_with(prefix) {
                continue;
            }
            if found.len() == MAX_LISTED {
                return Err(too_many_to_list(&self.describe(), prefix));
            }
            found.push(name);
        }
        Ok(found)
    }
}
