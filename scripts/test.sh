#!/usr/bin/env bash
# The project's test command (README: "Run the tests").
# Installs what is missing (servers, protoc), then checks formatting, lints,
# docs, and runs every test: unit, macro UI, conformance on every backend
# against real servers, and the fault tests.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
echo "== cargo test (macro UI cases, built without backend features: see dlock/tests/ui.rs)"
cargo test -p dlock --no-default-features --test ui
echo "== cargo test"
cargo test --workspace --all-features
