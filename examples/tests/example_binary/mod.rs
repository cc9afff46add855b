//! Where `cargo test` put an example's binary, for the tests that run an
//! example as its user would: as a process of its own.

use std::path::PathBuf;

/// The binary of the example `name`, built by `cargo test` into
/// `<target>/<profile>/examples/`, beside the `deps/` that holds this
/// test's own binary. `features` are those the example needs, for the
/// message that says how to build it when it is missing.
pub fn path(name: &str, features: &[&str]) -> PathBuf {
    let test_binary = std::env::current_exe().expect("the test binary's own path");
    let deps = test_binary.parent().expect("the test binary's folder");
    let profile = if deps.ends_with("deps") {
        deps.parent().unwrap_or(deps)
    } else {
        deps
    };
    let binary = profile.join("examples").join(name);
    if !binary.exists() {
        let features: String = features
            .iter()
            .map(|f| format!(" --features {f}"))
            .collect();
        panic!(
            "{} is missing: build it with `cargo build -p dlock-examples --example {name}{features}`",
            binary.display()
        );
    }
    binary
}
