//! The fenced store process of a torture run: `torture-store --log PATH [--listen ADDR]`.
//! Prints `LISTENING <addr>` once bound, then serves until a `SHUTDOWN` request.

#![forbid(unsafe_code)]

use std::net::SocketAddr;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut log = None;
    let mut listen: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match (arg.as_str(), it.next()) {
            ("--log", Some(path)) => log = Some(path.clone()),
            ("--listen", Some(addr)) => match addr.parse::<SocketAddr>() {
                Ok(addr) if addr.ip().is_loopback() => listen = addr,
                _ => fail(&format!("`--listen {addr}`: write a loopback address, e.g. 127.0.0.1:0")),
            },
            _ => fail(&format!("unknown or incomplete argument `{arg}`; usage: torture-store --log PATH [--listen 127.0.0.1:PORT]")),
        }
    }
    let Some(log) = log else {
        fail("usage: torture-store --log PATH [--listen 127.0.0.1:PORT]");
    };
    let file = std::fs::File::create(&log).unwrap_or_else(|e| fail(&format!("create {log}: {e}")));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("tokio runtime: {e}")));
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        println!("LISTENING {}", listener.local_addr()?);
        dlock_torture::store_server::serve(listener, file).await
    });
    if let Err(e) = result {
        fail(&format!("serve on {listen}: {e}"));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("torture-store: {message}");
    std::process::exit(2);
}
