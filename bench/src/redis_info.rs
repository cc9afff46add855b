//! What the benches read from a Redis server's `INFO`: its CPU time and
//! how many times it ran each command (calls made inside scripts count).

use redis::aio::MultiplexedConnection;

use super::workloads::BoxError;

/// One reading of `INFO cpu` and `INFO commandstats`.
pub struct RedisInfo {
    /// `used_cpu_user` + `used_cpu_sys`, in seconds.
    pub cpu_seconds: f64,
    commandstats: String,
}

impl RedisInfo {
    /// Reads both sections (two `INFO` calls, which the server counts too).
    pub async fn read(conn: &mut MultiplexedConnection) -> Result<RedisInfo, BoxError> {
        let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let seconds = |name: &str| {
            cpu.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let commandstats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        Ok(RedisInfo {
            cpu_seconds: seconds("used_cpu_user:") + seconds("used_cpu_sys:"),
            commandstats,
        })
    }

    /// How many times the server ran `command` (lower case, e.g. `evalsha`).
    pub fn calls(&self, command: &str) -> u64 {
        self.commandstats
            .lines()
            .find_map(|l| {
                l.strip_prefix("cmdstat_")?
                    .strip_prefix(command)?
                    .strip_prefix(':')
            })
            .map_or(0, calls_of)
    }

    /// How many commands the server ran, `INFO` itself left out.
    pub fn all_calls(&self) -> u64 {
        self.commandstats
            .lines()
            .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
            .map(calls_of)
            .sum()
    }
}

/// The `calls=` figure of one `cmdstat_…` line.
fn calls_of(line: &str) -> u64 {
    line.split_once("calls=")
        .and_then(|(_, rest)| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_calls_of_one_command_and_of_all() {
        let info = RedisInfo {
            cpu_seconds: 0.0,
            commandstats: "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30\r\ncmdstat_eval:calls=5,usec=1\r\ncmdstat_info:calls=9,usec=2\r\n".to_owned(),
        };
        assert_eq!(info.calls("evalsha"), 12);
        assert_eq!(info.calls("eval"), 5);
        assert_eq!(info.calls("pexpire"), 0);
        assert_eq!(info.all_calls(), 17);
    }
}
