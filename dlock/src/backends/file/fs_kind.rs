//! Local file systems only: `flock(2)` excludes processes of one kernel.
//! On NFS (where Linux turns `flock` into a byte-range lock on the server,
//! which `fcntl` locks then conflict with, and which a client's lost lease
//! drops), SMB/CIFS (where a lock may stay local to each client), 9p,
//! cluster file systems and network FUSE file systems, two hosts could both
//! believe they hold a lock, and a hung server would hang every lock call.
//! The directory's file system type (`statfs(2)`'s `f_type`; for FUSE, the
//! mount's subtype in `/proc/self/mounts`) is checked at `connect`, and the
//! ones below are refused by name. A file system the list does not know is
//! taken as local: the docs say so.

use std::path::Path;

/// `f_type` magic numbers of network and cluster file systems (from
/// Linux's `include/uapi/linux/magic.h` and the file systems' sources).
const NETWORK: &[(u32, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2/SMB3"),
    (0x0102_1997, "9p (v9fs)"),
    (0x00C3_6400, "CephFS"),
    (0x6B41_4653, "AFS (kAFS)"),
    (0x5346_414F, "AFS (OpenAFS)"),
    (0x0116_1970, "GFS2"),
    (0x7461_636F, "OCFS2"),
    (0x0BD0_0BD0, "Lustre"),
    (0x564C, "NCP (NetWare)"),
];
/// FUSE's magic number: local or network, as its subtype says.
const FUSE: u32 = 0x6573_5546;
/// FUSE file systems that reach other hosts.
const NETWORK_FUSE: &[&str] = &[
    "fuse.sshfs",
    "fuse.rclone",
    "fuse.s3fs",
    "fuse.gcsfuse",
    "fuse.glusterfs",
    "fuse.ceph-fuse",
    "fuse.juicefs",
    "fuse.curlftpfs",
    "fuse.smbnetfs",
    "fuse.davfs",
    "fuse.goofys",
    "fuse.mountpoint-s3",
    "fuse.lizardfs",
    "fuse.moosefs",
    "fuse.seaweedfs",
];

/// `Err` naming the file system when `dir` is on one that is not local.
pub(super) fn check_local(dir: &Path) -> Result<(), String> {
    let stats = rustix::fs::statfs(dir).map_err(|e| format!("statfs: {e}"))?;
    // `f_type` is a signed or unsigned word by platform; the magic numbers
    // are 32-bit.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let kind = stats.f_type as u32;
    if let Some((_, name)) = NETWORK.iter().find(|(magic, _)| *magic == kind) {
        return Err(refusal(name));
    }
    if kind == FUSE
        && let Some(subtype) = fuse_subtype(dir)
        && NETWORK_FUSE.contains(&subtype.as_str())
    {
        return Err(refusal(&subtype));
    }
    Ok(())
}

fn refusal(name: &str) -> String {
    format!(
        "the directory is on {name}, a network file system: `flock` locks there do not exclude processes of other hosts reliably, and a hung server hangs every lock call; the file backend needs a local file system (a directory on the host's own disk or tmpfs, e.g. /var/lock or /run/user/<uid>); for locks across hosts use a server backend (redis://, postgres://, etcd://, zk://)"
    )
}

/// The type (`fuse.sshfs`) of the mount `dir` is on: the mount point in
/// `/proc/self/mounts` that is the longest prefix of its real path.
fn fuse_subtype(dir: &Path) -> Option<String> {
    let real = std::fs::canonicalize(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_device, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            let point = unescape(point);
            real.starts_with(&point)
                .then(|| (point.len(), kind.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

/// `/proc/self/mounts` writes a space, tab, newline and `\` as octal
/// escapes (`\040`).
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest
            .get(at + 1..at + 4)
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_passes() {
        check_local(&std::env::temp_dir()).unwrap();
        check_local(Path::new("/")).unwrap();
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape(r"/mnt/my\040disk"), "/mnt/my disk");
        assert_eq!(unescape(r"/a\134b"), r"/a\b");
    }
}
