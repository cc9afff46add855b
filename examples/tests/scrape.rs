//! Runs the observability example as an operator would and scrapes its
//! `/metrics` over HTTP until every dlock metric name is there.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod example_binary;

const NAMES: [&str; 8] = [
    "dlock_acquire_total",
    "dlock_acquire_wait_seconds",
    "dlock_hold_seconds",
    "dlock_lost_total",
    "dlock_renew_total",
    "dlock_renew_seconds",
    "dlock_held_leases",
    "dlock_waiting",
];

/// A port nobody listens on now, for the example's metrics listener.
fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().expect("its address").port()
}

async fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await.ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_name_is_served() {
    let port = free_port();
    let mut child =
        tokio::process::Command::new(example_binary::path("observability", &["observability"]))
            .env("DLOCK_METRICS_ADDR", format!("127.0.0.1:{port}"))
            .env("DLOCK_URL", "memory://")
            .env("DLOCK_DEMO_SECS", "30")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the observability example");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Some(body) = scrape(port).await {
            if NAMES.iter().all(|name| body.contains(name)) {
                assert!(body.contains("backend=\"default\""), "{body}");
                assert!(
                    body.contains("kind=\"permit\"") && body.contains("kind=\"segment\""),
                    "{body}"
                );
                assert!(!body.contains("order:"), "a key became a label:\n{body}");
                break;
            }
            last = body;
        }
        assert!(
            Instant::now() < deadline,
            "not every metric name within 30 s; missing {:?} in:\n{last}",
            NAMES
                .iter()
                .filter(|n| !last.contains(*n))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    child.kill().await.ok();
}
