//! What each fixture tells of a latch on its server.

use std::time::Duration;

use crate::fixtures::etcd::EtcdFixture;
use crate::fixtures::memory::MemoryFixture;
use crate::fixtures::postgres::PgFixture;
use crate::fixtures::redis::RedisFixture;
use crate::fixtures::redisson::RedissonFixture;
use crate::fixtures::sentinel::SentinelFixture;
use crate::fixtures::zookeeper::{ZkFixture, ZkServers};

use super::LatchFixture;

#[async_trait::async_trait]
impl LatchFixture for MemoryFixture {
    async fn latch_subscriptions(&self, _name: &str) -> Option<usize> {
        None
    }

    async fn latch_state(&self, _name: &str) -> Vec<String> {
        // One fixture per case: every latch it keeps is this case's.
        match self.server().latches_kept() {
            0 => Vec::new(),
            n => vec![format!("{n} latches kept in memory")],
        }
    }
}

/// `PUBSUB NUMSUB <channel>` on one server.
fn numsub(cli: impl Fn(&[&str]) -> String, channel: &str) -> Option<usize> {
    let answer = cli(&["PUBSUB", "NUMSUB", channel]);
    answer.lines().nth(1).and_then(|n| n.trim().parse().ok())
}

/// `PUBSUB NUMSUB <channel>` summed over every node of the Cluster at
/// `url` (`redis+cluster://h1:p1,h2:p2,...`): each node counts only the
/// clients subscribed on it.
async fn numsub_on_every_node(url: &str, channel: &str) -> Option<usize> {
    let rest = url.split_once("://")?.1;
    let hosts = rest.split_once('?').map_or(rest, |(hosts, _)| hosts);
    let mut total = 0;
    for host in hosts.split(',') {
        let client = redis::Client::open(format!("redis://{host}")).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let (_, n): (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await
            .ok()?;
        total += n;
    }
    Some(total)
}

/// The key, if it exists.
fn existing(cli: impl Fn(&[&str]) -> String, key: &str) -> Vec<String> {
    match cli(&["EXISTS", key]).trim() {
        "0" => Vec::new(),
        _ => vec![key.to_owned()],
    }
}

fn dlock_names(name: &str) -> (String, String) {
    let base = format!("dlock:{{{name}}}:latch");
    (base.clone(), format!("{base}:changed"))
}

#[async_trait::async_trait]
impl LatchFixture for RedisFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let (_, channel) = dlock_names(name);
        if self.url().contains("+cluster") {
            return numsub_on_every_node(self.url(), &channel).await;
        }
        tokio::task::block_in_place(|| numsub(|a| self.redis_cli(a), &channel))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let (key, _) = dlock_names(name);
        tokio::task::block_in_place(|| existing(|a| self.redis_cli(a), &key))
    }

    fn subscription_linger(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl LatchFixture for RedissonFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let channel = format!("redisson_countdownlatch__channel__{{{name}}}");
        if self.is_cluster() {
            return numsub_on_every_node(self.plain_url(), &channel).await;
        }
        tokio::task::block_in_place(|| numsub(|a| self.redis_cli(a), &channel))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        tokio::task::block_in_place(|| existing(|a| self.redis_cli(a), name))
    }

    fn subscription_linger(&self) -> Duration {
        Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl LatchFixture for SentinelFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let (_, channel) = dlock_names(name);
        tokio::task::block_in_place(|| numsub(|a| self.redis_cli(a), &channel))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let (key, _) = dlock_names(name);
        tokio::task::block_in_place(|| existing(|a| self.redis_cli(a), &key))
    }

    fn subscription_linger(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// The watchers etcd counts now (`etcd_debugging_mvcc_watcher_total` on the
/// first member's `/metrics`): the suite's fixtures hold no other watch.
fn etcd_watchers(url: &str) -> Option<usize> {
    let rest = url.split_once("://")?.1;
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let host = rest.split([',', '/', '?']).next()?;
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "5", &format!("http://{host}/metrics")])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .map(|n| n as usize)
}

#[async_trait::async_trait]
impl LatchFixture for EtcdFixture {
    async fn latch_subscriptions(&self, _name: &str) -> Option<usize> {
        tokio::task::block_in_place(|| etcd_watchers(self.url()))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let key = format!(
            "dlock-latches/{}",
            name.replace('%', "%25").replace('/', "%2F")
        );
        let got = tokio::task::block_in_place(|| self.etcdctl(&["get", &key]));
        if got.trim().is_empty() {
            Vec::new()
        } else {
            vec![key]
        }
    }
}

/// PostgreSQL tells no session which channels another one listens on; the
/// listening connection runs nothing but `LISTEN`s and `UNLISTEN`s after
/// its first batch, so the sessions whose last statement is the latch's
/// `LISTEN` are those listening on it (the suite waits on one latch at a
/// time per server). The number of listening connections is printed beside
/// it.
#[async_trait::async_trait]
impl LatchFixture for PgFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let channel = dlock::backends::postgres::latch_channel("dlock", name);
        let sql =
            format!("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN \"{channel}\"'");
        let out = tokio::task::block_in_place(|| self.server().psql(&sql));
        let listening = tokio::task::block_in_place(|| {
            self.server().psql(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND pid <> pg_backend_pid()",
            )
        });
        eprintln!("postgres latch `{name}`: {out} sessions on its LISTEN, {listening} listening connections");
        out.trim().parse().ok()
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let sql = format!(
            "SELECT name || ' = ' || remaining FROM public.dlock_latches WHERE to_regclass('public.dlock_latches') IS NOT NULL AND name = 'dlock:{}'",
            name.replace('\'', "''")
        );
        let out = tokio::task::block_in_place(|| self.server().try_psql(&sql));
        match out {
            Ok(rows) => rows
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_owned)
                .collect(),
            // No table yet: no latch was ever set.
            Err(e) if e.to_string().contains("does not exist") => Vec::new(),
            Err(e) => panic!("{e}"),
        }
    }
}

/// The inotify watches this process holds on the inode `ino`: lines of
/// `/proc/self/fdinfo/<fd>` of each inotify descriptor (`ino:<hex>`).
pub(crate) fn inotify_watches_on(ino: u64) -> usize {
    let wanted = format!("ino:{ino:x} ");
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().contains("inotify"))
        })
        .filter_map(|fd| {
            std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .ok()
        })
        .map(|info| {
            info.lines()
                .filter(|line| line.starts_with("inotify wd:") && line.contains(&wanted))
                .count()
        })
        .sum()
}

#[async_trait::async_trait]
impl LatchFixture for crate::fixtures::file::FileFixture {
    async fn latch_subscriptions(&self, _name: &str) -> Option<usize> {
        // Waiters watch the directory (one fixture, one directory per case).
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(self.dir()).ok()?.ino();
        Some(inotify_watches_on(ino))
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let escaped: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':') {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let stem = format!("~latch~{escaped}");
        std::fs::read_dir(self.dir())
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|f| f.contains(&stem))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How many sessions watch `path` on `server` (the four-letter word `wchp`:
/// each watched path, then one line per session watching it).
fn zk_watchers(server: &crate::servers::zookeeper::ZkServer, path: &str) -> Option<usize> {
    let answer = server.four_letter("wchp").ok()?;
    let mut lines = answer.lines().skip_while(|l| l.trim() != path);
    lines.next()?;
    Some(lines.take_while(|l| l.trim().starts_with("0x")).count())
}

#[async_trait::async_trait]
impl LatchFixture for ZkFixture {
    async fn latch_subscriptions(&self, name: &str) -> Option<usize> {
        let path = self.latch_path(name);
        match &self.servers {
            ZkServers::Single(server) => {
                // `wchp` omits a path nobody watches.
                tokio::task::block_in_place(|| zk_watchers(server, &path).or(Some(0)))
            }
            ZkServers::Ensemble(_) => None,
        }
    }

    async fn latch_state(&self, name: &str) -> Vec<String> {
        let path = self.latch_path(name);
        let admin = self.admin();
        admin
            .sync("/")
            .await
            .expect("sync before reading a latch node");
        match admin.check_stat(&path).await {
            Ok(Some(_)) => vec![path],
            Ok(None) => Vec::new(),
            Err(e) => panic!("read {path}: {e}"),
        }
    }
}
