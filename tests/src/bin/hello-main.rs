//! The README's hello world as a process of its own: takes KEY on URL,
//! prints, and returns from `#[tokio::main]` with the guard still alive, so
//! that the guard is dropped as `main` returns. `tests/tests/release_at_exit.rs`
//! checks that the key is free as soon as the process has exited.
//!
//! Usage: `hello-main URL KEY`

#[tokio::main]
async fn main() -> Result<(), dlock::LockError> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(key)) = (args.next(), args.next()) else {
        eprintln!("usage: hello-main URL KEY");
        std::process::exit(2);
    };
    dlock::registry().set_default(dlock::connect(&url).await?);
    let guard = dlock::Lock::new(key).acquire().await?;
    println!("hello from the holder of {}", guard.key());
    Ok(())
}
