//! Free loopback ports for the servers the harness starts.
//!
//! Ports are chosen at random *below* the kernel's ephemeral range
//! (`/proc/sys/net/ipv4/ip_local_port_range`), not with `bind(127.0.0.1:0)`, for two reasons:
//! a port handed out by the kernel for `:0` lies in the ephemeral range, so between our check
//! and the server's own `bind` (and again while a server is stopped for a restart on the
//! same port) an outgoing client connection could take it as its local port; and some servers
//! need companion ports at fixed offsets (Redis Cluster's bus at port + 10000), which must fit
//! below 65536. Each candidate (and each companion) is checked by binding it on 127.0.0.1, and
//! a port is never handed out twice while its test process lives: not by that process (a set
//! in memory), nor by another (a lock file per port, `flock`ed until the process exits, which
//! the kernel releases even after `kill -9`). The test runner runs every test in a process of
//! its own and several at once, and a test that stops a server to restart it on the same port
//! leaves that port unbound for a while: only the lock keeps another test from taking it then.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::sync::Mutex;

use crate::error::{HarnessError, HarnessResult};

/// Lowest port the harness hands out (keeps clear of well-known service ports).
const LOWEST: u16 = 10_000;
/// Random candidates tried before giving up.
const ATTEMPTS: usize = 500;

/// Ports (including companions) already handed out by this process.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The lock files of the ports handed out by this process, held open (and so locked) until
/// it exits.
static RESERVED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// One free port on 127.0.0.1.
pub fn free_port() -> HarnessResult<u16> {
    free_port_with_offsets(&[])
}

/// `n` distinct free ports on 127.0.0.1.
pub fn free_ports(n: usize) -> HarnessResult<Vec<u16>> {
    (0..n).map(|_| free_port()).collect()
}

/// A free port `p` such that every `p + offset` is free as well (e.g. `&[10_000]` for a Redis
/// Cluster node and its cluster bus port). All of them are reserved for this process.
pub fn free_port_with_offsets(offsets: &[u16]) -> HarnessResult<u16> {
    let max_offset = offsets.iter().copied().max().unwrap_or(0);
    let upper = ephemeral_low().saturating_sub(max_offset);
    if upper <= LOWEST + 100 {
        return Err(HarnessError::new(format!(
            "no room for a port with offsets {offsets:?} below the ephemeral range"
        )));
    }
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..ATTEMPTS {
        let port: u16 = rand::random_range(LOWEST..upper);
        let all: Vec<u16> = std::iter::once(port)
            .chain(offsets.iter().map(|o| port + o))
            .collect();
        if all.iter().any(|p| handed.contains(p)) {
            continue;
        }
        if all.iter().all(|&p| is_free(p)) {
            let Some(locks) = reserve_across_processes(&all)? else {
                continue;
            };
            handed.extend(all);
            RESERVED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(locks);
            return Ok(port);
        }
    }
    Err(HarnessError::new(format!(
        "found no free loopback port (offsets {offsets:?}) in {ATTEMPTS} attempts"
    )))
}

/// Locks one file per port in a directory every test process of the machine shares; `None`
/// when another live process holds one of them (its locks went with it if it died).
fn reserve_across_processes(ports: &[u16]) -> HarnessResult<Option<Vec<File>>> {
    let dir = reservations_dir();
    std::fs::create_dir_all(&dir).map_err(|e| {
        HarnessError::new(format!(
            "create the port reservations directory {}: {e}",
            dir.display()
        ))
    })?;
    let mut locks = Vec::with_capacity(ports.len());
    for port in ports {
        let path = dir.join(format!("{port}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| HarnessError::new(format!("open {}: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => locks.push(file),
            // Taken by another process: the caller tries another port (the locks taken so far
            // are released as `locks` drops).
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(HarnessError::new(format!("lock {}: {e}", path.display())))
            }
        }
    }
    Ok(Some(locks))
}

/// Where the ports' lock files live: one directory per user, so that the lock files of a
/// run as root and of one as `postgres` do not refuse each other's permissions.
fn reservations_dir() -> PathBuf {
    let user = std::env::var("USER").unwrap_or_else(|_| "user".to_string());
    std::env::temp_dir().join(format!("dlock-test-ports-{user}"))
}

/// Whether a TCP listener can bind `127.0.0.1:port` right now.
pub fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Attempts at starting a server when its freshly checked port was taken meanwhile.
const PORT_CLASH_ATTEMPTS: usize = 3;

/// Runs `start` again (with new ports, as `start` picks them) when it failed because a port
/// was taken between our check and the server's own bind, e.g. by another process on the
/// machine; any other error is returned at once.
pub(crate) fn retry_port_clash<T>(mut start: impl FnMut() -> HarnessResult<T>) -> HarnessResult<T> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(e)
                if attempt < PORT_CLASH_ATTEMPTS
                    && e.message()
                        .to_ascii_lowercase()
                        .contains("address already in use") =>
            {
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_only_port_clashes_and_only_a_few_times() {
        let mut calls = 0;
        let r: HarnessResult<()> = retry_port_clash(|| {
            calls += 1;
            Err(HarnessError::new("bind: Address already in use"))
        });
        assert!(r.is_err());
        assert_eq!(calls, PORT_CLASH_ATTEMPTS);

        let mut calls = 0;
        let r: HarnessResult<()> = retry_port_clash(|| {
            calls += 1;
            Err(HarnessError::new("redis-server not found"))
        });
        assert!(r.is_err());
        assert_eq!(calls, 1);

        let mut calls = 0;
        let r = retry_port_clash(|| {
            calls += 1;
            if calls == 1 {
                Err(HarnessError::new("address already in use"))
            } else {
                Ok(7)
            }
        });
        assert_eq!(r, Ok(7));
    }

    #[test]
    fn ports_with_offsets_are_free_and_distinct() {
        let a = free_port_with_offsets(&[10_000]).unwrap();
        let b = free_port_with_offsets(&[10_000]).unwrap();
        assert_ne!(a, b);
        assert!(a < ephemeral_low() && b < ephemeral_low());
        assert!(is_free(a) && is_free(a + 10_000));
    }
}
