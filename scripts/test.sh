#!/usr/bin/env bash
# The project's test command (README: "Run the tests").
# Installs what is missing (servers, protoc), then checks formatting, lints,
# docs, and runs every test: unit, macro UI, conformance on every backend
# against real servers, and the fault tests.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# A one-off build (CI's fresh clone) gains nothing from incremental caches,
# which are a third of the target directory.
if [ "${CI:-}" = "true" ]; then
  export CARGO_INCREMENTAL=0
fi

# The build of every backend and its tests takes a few GiB: say so up front
# rather than fail later with "No space left on device" halfway through.
target_dir="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target_dir"
free_gib=$(df --output=avail -B1G "$target_dir" | tail -1 | tr -d ' ')
if [ "${free_gib:-0}" -lt 6 ]; then
  echo "warning: only ${free_gib} GiB free for $target_dir; the full test build needs about 6 GiB." >&2
  echo "         Free some space (old target/ directories, /tmp) if the build fails with ENOSPC." >&2
fi
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
