//! `Semaphore::acquire_many` from 10 processes on 10 permits (n in 1..=4):
//! never more than 10 out, served in arrival order (see
//! `dlock_tests::semaphore::processes`), on Redis, etcd, ZooKeeper and
//! files (one shared temporary directory) and PostgreSQL. Not on MySQL,
//! whose semaphores take one permit at a time (slot named locks).

use std::sync::Arc;

use dlock::backends::redis::RedisBackend;
use dlock_tests::semaphore::processes::ten_processes_take_many_permits_in_order;
use dlock_tests::servers::redis::RedisServer;

const TAKER: &str = env!("CARGO_BIN_EXE_many-permits-taker");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_ten_processes_take_many_permits_in_order() {
    let server = RedisServer::start();
    let backend = Arc::new(RedisBackend::connect(&server.url()).await.unwrap());
    ten_processes_take_many_permits_in_order(TAKER, &server.url(), backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_ten_processes_take_many_permits_in_order() {
    let server = dlock_tests::servers::etcd::EtcdServer::start();
    let backend = dlock::connect(&server.url()).await.unwrap();
    ten_processes_take_many_permits_in_order(TAKER, &server.url(), backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ten_processes_take_many_permits_in_order() {
    let server = dlock_tests::servers::zookeeper::ZkServer::start();
    let backend = dlock::connect(&server.url()).await.unwrap();
    ten_processes_take_many_permits_in_order(TAKER, &server.url(), backend).await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_ten_processes_take_many_permits_in_order() {
    let fixture = dlock_tests::fixtures::file::FileFixture::start();
    let backend = dlock::connect(&fixture.url).await.unwrap();
    ten_processes_take_many_permits_in_order(TAKER, &fixture.url, backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ten_processes_take_many_permits_in_order() {
    let server = dlock_tests::servers::postgres::PgServer::start();
    let backend = dlock::connect(&server.url()).await.unwrap();
    ten_processes_take_many_permits_in_order(TAKER, &server.url(), backend).await;
}
