//! The web-service example (`examples/examples/web_service.rs`) as it is
//! deployed: two instances against one real Redis, 200 concurrent
//! `POST /orders/7/pay` split between them. The counter each payment
//! increments with a read-sleep-write must equal the successful requests.
//!
//! The example's binary is built by `cargo test --workspace --all-features`
//! (and by `cargo build -p dlock-examples --features web --example
//! web_service`); this test finds it beside its own binary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use dlock_tests::servers::redis::RedisServer;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

const REQUESTS: usize = 200;

fn example() -> PathBuf {
    let mut dir = std::env::current_exe().unwrap();
    dir.pop(); // the test binary
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("examples").join("web_service");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p dlock-examples --features web --example web_service`",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts one instance and waits (bounded) for its "listening" line.
async fn instance(redis_url: &str) -> (Child, u16) {
    let port = free_port();
    let mut child = Command::new(example())
        .env("DLOCK_URL", redis_url)
        .env("PORT", port.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the web_service example");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the instance did not start within 20 s")
        .unwrap()
        .unwrap_or_default();
    assert!(listening.starts_with("listening on"), "{listening}");
    (child, port)
}

/// One HTTP/1.1 request; the status code and the body.
async fn request(port: u16, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_count_every_successful_payment_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (_a, port_a) = instance(&url).await;
    let (_b, port_b) = instance(&url).await;

    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let port = if i % 2 == 0 { port_a } else { port_b };
            tokio::spawn(async move { request(port, "POST", "/orders/7/pay").await.0 })
        })
        .collect();
    let mut ok = 0;
    let mut conflict = 0;
    tokio::time::timeout(Duration::from_secs(60), async {
        for request in requests {
            match request.await.unwrap() {
                200 => ok += 1,
                409 => conflict += 1,
                other => panic!("a payment answered {other}"),
            }
        }
    })
    .await
    .expect("the requests did not finish within 60 s");
    let (status, body) = request(port_a, "GET", "/orders/7").await;
    assert_eq!(status, 200);
    let counter: usize = body.trim().parse().expect("the counter");
    eprintln!("web service: {ok} paid, {conflict} busy (409), counter {counter}");
    assert_eq!(ok + conflict, REQUESTS);
    assert_eq!(
        counter, ok,
        "the counter must equal the successful payments"
    );
    assert!(ok > 0);
}
