//! ACLs, as Curator's `ACLProvider` allows: the ACL of every node dlock
//! creates (`?acl=`), and the check of the directory a node queues in.
//!
//! ZooKeeper checks a delete against the *parent's* ACL, so what protects a
//! holder's node is its key directory's ACL. A directory someone else made
//! (before dlock, or after the server removed an idle container) may be
//! open to anyone; a lock taken under it could be deleted, and taken over,
//! by any client. So, with credentials, every acquisition reads its
//! directory's ACL right behind the create of its node (pipelined: no round
//! trip of its own), and hands out no lease under a directory whose ACL is
//! weaker than what dlock would set: it tightens it (`setACL`, when its
//! identity may), or refuses with an error naming the node and its ACL.
//!
//! Why a check on every acquisition, and not persistent directories: key
//! directories stay containers, which the server removes once idle, so they
//! do not pile up one per key ever locked; a directory that vanished and
//! came back open is caught by the next acquisition's check. The check reads
//! the ACL once our node is inside: a directory with a child cannot be
//! deleted, and once its ACL is dlock's nobody else can delete that child or
//! change the ACL, so the directory read is the one the lease lives in.

use zookeeper_client::{Acl, Acls, Client, Error as ZkError, Permission, Stat};

use super::config::AclMode;
use super::ZooKeeperBackend;
use crate::LockError;

/// `creator_read`: the creator's identity may do everything, anyone may
/// read (list and watch the queue, read a holder's node).
static CREATOR_ALL_ANYONE_READ: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

impl AclMode {
    /// The ACL of the nodes dlock creates.
    pub(super) fn acls(self) -> Acls<'static> {
        match self {
            AclMode::CreatorRead => Acls::new(&CREATOR_ALL_ANYONE_READ),
            AclMode::Creator => Acls::creator_all(),
            AclMode::Open => Acls::anyone_all(),
        }
    }

    /// What identities other than the URL's may do on a node with this ACL.
    fn others_may(self) -> Permission {
        match self {
            AclMode::CreatorRead => Permission::READ,
            AclMode::Creator => Permission::NONE,
            AclMode::Open => Permission::ALL,
        }
    }
}

/// The id ZooKeeper's digest scheme gives the credentials `user:password`:
/// `user:base64(sha1("user:password"))`. ACLs name an identity so.
pub(super) fn digest_id(credentials: &str) -> String {
    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
    let hash = sha1_smol::Sha1::from(credentials.as_bytes())
        .digest()
        .bytes();
    format!("{user}:{}", base64(&hash))
}

/// Standard base64 with padding (the digest scheme's encoding).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Whether `acl` lets an identity other than `own` (the URL's digest id) do
/// more than `mode` lets others do.
pub(super) fn is_weaker(acl: &[Acl], mode: AclMode, own: &str) -> bool {
    acl.iter().any(|entry| {
        let is_own = entry.scheme() == "digest" && entry.id() == own;
        !is_own && !mode.others_may().has(entry.permission())
    })
}

/// Whether `acl` lets `own` change it.
fn may_change(acl: &[Acl], own: &str) -> bool {
    acl.iter().any(|entry| {
        let applies = (entry.scheme() == "digest" && entry.id() == own)
            || (entry.scheme() == "world" && entry.id() == "anyone");
        applies && entry.permission().has(Permission::ADMIN)
    })
}

/// An ACL as `zkCli.sh getAcl` shows it, one `scheme:id:perms` per entry,
/// with digest hashes left out (only the user shows).
pub(super) fn shown(acl: &[Acl]) -> String {
    let entries: Vec<String> = acl
        .iter()
        .map(|entry| {
            let id = match entry.scheme() {
                "digest" => format!("{}:…", entry.id().split(':').next().unwrap_or("")),
                _ => entry.id().to_owned(),
            };
            format!("{}:{id}:{}", entry.scheme(), perms(entry.permission()))
        })
        .collect();
    entries.join(",")
}

/// `cdrwa` letters, as ZooKeeper's tools write permissions.
fn perms(p: Permission) -> String {
    [
        (Permission::CREATE, 'c'),
        (Permission::DELETE, 'd'),
        (Permission::READ, 'r'),
        (Permission::WRITE, 'w'),
        (Permission::ADMIN, 'a'),
    ]
    .into_iter()
    .filter(|(bit, _)| p.has(*bit))
    .map(|(_, c)| c)
    .collect()
}

impl ZooKeeperBackend {
    /// Whether nodes must be checked against their directory's ACL: only
    /// with credentials and an ACL other than the open one.
    pub(super) fn guards_dirs(&self) -> bool {
        self.config.acl != AclMode::Open
    }

    /// Checks the ACL of `dir` (`answer`, read right behind our create in
    /// it): weaker than the URL's `acl` means it is tightened, or the
    /// acquisition refused. `Ok(true)`: it was tightened, so the queue must
    /// be listed again (someone may have queued or deleted meanwhile).
    pub(super) async fn guard_dir(
        &self,
        client: &Client,
        dir: &str,
        answer: Result<(Vec<Acl>, Stat), ZkError>,
    ) -> Result<bool, LockError> {
        let Some(own) = self.config.digest.as_deref().map(digest_id) else {
            return Ok(false);
        };
        let (acl, stat) =
            answer.map_err(|e| self.error(format_args!("cannot read the ACL of {dir}"), e))?;
        let mode = self.config.acl;
        if !is_weaker(&acl, mode, &own) {
            return Ok(false);
        }
        let refused = |why: &str| {
            LockError::backend(
                self.shown.clone(),
                format!(
                    "refusing to lock under {dir}: its ACL `{}` lets other clients do more than `acl={}` allows (they could delete a holder's node), and {why}; fix its ACL or choose another prefix",
                    shown(&acl),
                    mode.name()
                ),
            )
        };
        if !may_change(&acl, &own) {
            return Err(refused(
                "this identity may not change it (no ADMIN permission)",
            ));
        }
        match client.set_acl(dir, &mode.acls(), Some(stat.aversion)).await {
            Ok(_) => {
                tracing::warn!(%dir, was = %shown(&acl), acl = mode.name(), "ZooKeeper: tightened the ACL of a lock directory");
                Ok(true)
            }
            Err(ZkError::NoAuth) => Err(refused("setting dlock's ACL was refused")),
            Err(ZkError::BadVersion) => Err(refused("its ACL changed while dlock tightened it")),
            Err(e) => Err(self.error(format_args!("cannot tighten the ACL of {dir}"), e)),
        }
    }
}

impl ZooKeeperBackend {
    /// The error of a create the ACL of `dir` refused, naming that ACL.
    pub(super) async fn not_permitted(&self, client: &Client, dir: &str) -> LockError {
        let acl = match client.get_acl(dir).await {
            Ok((acl, _)) => format!("its ACL `{}`", shown(&acl)),
            Err(e) => format!("its ACL (unreadable: {e})"),
        };
        let who = match self.config.digest.as_deref() {
            Some(credentials) => format!(
                "the URL's identity `digest:{}`",
                credentials.split_once(':').map_or(credentials, |(u, _)| u)
            ),
            None => "a client without credentials".to_owned(),
        };
        LockError::backend(
            self.shown.clone(),
            format!("cannot create a lock node under {dir}: {acl} does not let {who} create nodes there"),
        )
    }
}

impl AclMode {
    /// The option value that names this mode.
    pub(super) fn name(self) -> &'static str {
        match self {
            AclMode::CreatorRead => "creator_read",
            AclMode::Creator => "creator",
            AclMode::Open => "open",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_ids_are_zookeepers() {
        // base64(sha1("super:secret")), as `DigestAuthenticationProvider`
        // computes it (the server tests check it against real ACLs).
        assert_eq!(
            digest_id("super:secret"),
            "super:lK75jTNcA+U9vtVEw5vB51mj/w4="
        );
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"abc"), "YWJj");
    }

    #[test]
    fn an_acl_is_weaker_when_others_may_do_more() {
        let own = digest_id("app:pw");
        let mine = Acl::new(
            Permission::ALL,
            zookeeper_client::AuthId::new("digest", &own),
        );
        let anyone = |p| Acl::new(p, zookeeper_client::AuthId::anyone());
        let strong = [mine.clone(), anyone(Permission::READ)];
        assert!(!is_weaker(&strong, AclMode::CreatorRead, &own));
        assert!(is_weaker(&strong, AclMode::Creator, &own));
        assert!(!is_weaker(&strong[..1], AclMode::Creator, &own));
        let open = [anyone(Permission::ALL)];
        assert!(is_weaker(&open, AclMode::CreatorRead, &own));
        assert!(may_change(&open, &own));
        assert_eq!(shown(&open), "world:anyone:cdrwa");
        // Another identity that may delete is weaker, even with our user name.
        let impostor = Acl::new(
            Permission::ALL,
            zookeeper_client::AuthId::new("digest", "app:AAAA"),
        );
        assert!(is_weaker(
            &[mine, impostor.clone()],
            AclMode::CreatorRead,
            &own
        ));
        assert!(!may_change(std::slice::from_ref(&impostor), &own));
        assert_eq!(shown(&[impostor]), "digest:app:…:cdrwa");
    }
}
