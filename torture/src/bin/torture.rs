//! `torture`: a long randomized fault run against a lock service (see
//! `dlock::guide::reliability`); `torture worker …` is one of its worker processes.

#![forbid(unsafe_code)]

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dlock_torture::options::{parse_run, parse_worker, USAGE};
use dlock_torture::soak::options::{parse_soak, SOAK_USAGE};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        std::process::exit(worker(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("soak") {
        std::process::exit(soak(&args[1..]));
    }
    if args.iter().any(|a| a == "--help" || a == "-h") || args.is_empty() {
        print!("{USAGE}");
        std::process::exit(if args.is_empty() { 2 } else { 0 });
    }
    let clock_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    let options = match parse_run(&args, clock_seed) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("torture: {e}");
            std::process::exit(2);
        }
    };
    match dlock_torture::run::run(&options) {
        Ok(outcome) => std::process::exit(if outcome.passed { 0 } else { 1 }),
        Err(e) => {
            eprintln!("torture: {e}");
            std::process::exit(2);
        }
    }
}

/// `torture soak …`: 0 on PASS, 1 on FAIL, 2 on a bad command line or an error.
fn soak(args: &[String]) -> i32 {
    if args.iter().any(|a| a == "--help" || a == "-h") || args.is_empty() {
        print!("{SOAK_USAGE}");
        return if args.is_empty() { 2 } else { 0 };
    }
    let options = match parse_soak(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("torture soak: {e}");
            return 2;
        }
    };
    // dlock's WARN events (a lease lost and why, a failed background
    // release, a stale grant) on stderr, so that a count in the report can
    // be traced to its cause; the report and the samples stay on stdout.
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    match dlock_torture::soak::run(&options) {
        Ok(outcome) => i32::from(!outcome.passed),
        Err(e) => {
            eprintln!("torture soak: {e}");
            2
        }
    }
}

fn worker(args: &[String]) -> i32 {
    let options = match parse_worker(args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("torture worker: {e}");
            return 2;
        }
    };
    // The run closes our stdin to say "finish the round and stop".
    let stop = Arc::new(AtomicBool::new(false));
    let stop_on_eof = Arc::clone(&stop);
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        stop_on_eof.store(true, Ordering::Relaxed);
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("torture worker: tokio runtime: {e}");
            return 2;
        }
    };
    match runtime.block_on(dlock_torture::worker::run(options, stop)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("torture worker: {e}");
            3
        }
    }
}
