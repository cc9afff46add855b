//! Names for the sets of backend features that several modules are compiled
//! under, so each set is spelled once instead of in every `#[cfg(any(...))]`:
//!
//! - `cfg(server_backend)`: a backend that talks to a server over the
//!   network is compiled in (`redis`, `etcd`, `zookeeper`, `postgres`,
//!   `mysql`); it needs dlock's background runtime to run its requests.
//! - `cfg(url_backend)`: a backend whose URL carries options is compiled
//!   in (any server backend, or `file`); the URL helpers serve them.

/// The features of the backends that talk to a server.
const SERVER_BACKENDS: [&str; 5] = ["redis", "etcd", "zookeeper", "postgres", "mysql"];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(server_backend)");
    println!("cargo::rustc-check-cfg=cfg(url_backend)");
    let on = |feature: &str| {
        std::env::var_os(format!("CARGO_FEATURE_{}", feature.to_uppercase())).is_some()
    };
    let server = SERVER_BACKENDS.iter().any(|f| on(f));
    if server {
        println!("cargo::rustc-cfg=server_backend");
    }
    if server || on("file") {
        println!("cargo::rustc-cfg=url_backend");
    }
}
