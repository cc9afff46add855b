#!/usr/bin/env bash
# The project's test command (README: "Run the tests").
# Installs what is missing (servers, protoc), then checks formatting, that the
# examples build without protoc, lints, docs, and runs every test: unit, macro
# UI, conformance on every backend against real servers, and the fault tests.
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
echo "== $(date +%T) cargo fmt"
cargo fmt --all -- --check
# Everything but the tests themselves (the examples without protoc, lints, docs, packaging,
# the macro's compile-error cases, the doc tests) is building, and runs beside the tests at
# idle priority (below): the test phase leaves about a third of the 2 cores idle, waiting on
# servers and timers, and these fill it. One after another before the tests, they took 7.4
# minutes of a 21 m 39 s fresh-clone run (916ba42). Not beside the test build, which keeps
# both cores busy: started beside it (949b31c, 960d855, 0bb5a02), they took its idle tenth
# and no time off the whole (1,148 to 1,278 s against 1,112 to 1,230 s), and in one run the
# test build took 5 m 34 s instead of 4 m 11 s to 4 m 24 s.
no_protoc_bin=$(mktemp -d)
checks_log=$(mktemp)
torture_log=$(mktemp)
main_log=$(mktemp)
cleanup() { rm -rf "$no_protoc_bin" "$checks_log" "$torture_log" "$main_log" ${test_tmp:+"$test_tmp"}; }
trap cleanup EXIT
printf '#!/bin/sh\necho "protoc is hidden here: the examples must build without it" >&2\nexit 1\n' >"$no_protoc_bin/protoc"
chmod +x "$no_protoc_bin/protoc"

# At idle priority: the tests' processes always come first, so a test's timing is not the
# builds' to spend.
idle() {
  if command -v chrt >/dev/null 2>&1 && chrt --idle 0 true 2>/dev/null; then
    chrt --idle 0 "$@"
  else
    nice -n 19 "$@"
  fi
}

step() {
  echo "== $(date +%T) $1"
  shift
  idle "$@"
}

# The README's quick start must work on a machine with only a Rust toolchain: nothing in the
# examples' graph compiles protobuf code (the crates whose build scripts call protoc), and the
# examples compile with protoc hidden (install-deps.sh has just put it on this machine:
# PROTOC points nowhere, and a `protoc` first on PATH fails) and without a warning. In the
# main target directory, after the lints: the dependencies checked there are reused (26 s; in
# a target directory of its own every dependency was checked and every build script run
# again: 2.4 minutes at idle priority beside the tests). The graph check is what makes that
# reuse safe, since a build script run earlier with protoc is not run again.
first_run() {
  local needs_protoc output
  needs_protoc=$(idle cargo tree -p dlock-examples -e normal,build --prefix none | awk '{print $1}' |
    sort -u | grep -xE 'prost-build|tonic-build|tonic-prost-build|protobuf-codegen|protobuf-src|protoc-bin-vendored' || true)
  if [ -n "$needs_protoc" ]; then
    echo "error: the examples' default graph builds protobuf code, which needs protoc: $(echo "$needs_protoc" | tr '\n' ' ')" >&2
    echo "       keep the crate that pulls it (see \`cargo tree -p dlock-examples -i <crate>\`) behind a feature that is off by default" >&2
    return 1
  fi
  output=$(idle env PROTOC=/nonexistent PATH="$no_protoc_bin:$PATH" \
    cargo check -p dlock-examples --example quickstart --example seckill_segmented --message-format=short 2>&1) || {
    echo "$output"
    return 1
  }
  echo "$output"
  if grep -q ': warning' <<<"$output"; then
    echo "error: the quick start's examples compile with a warning (above): every user's first build shows it" >&2
    return 1
  fi
}

# Each step stops the chain when it fails (its output says why).
checks() {
  step "cargo clippy" cargo clippy --workspace --all-targets --all-features -- -D warnings || return
  # CI's clippy above builds every feature at once; a user's build with the defaults, or one
  # backend alone, compiles other code paths (a helper only Redlock uses is dead code without
  # it), and a warning there shows in every user's build.
  for features in "--no-default-features" "" "--no-default-features --features redlock" \
    "--no-default-features --features etcd" "--no-default-features --features zookeeper" \
    "--no-default-features --features postgres" "--no-default-features --features mysql" \
    "--no-default-features --features file"; do
    # shellcheck disable=SC2086 # the feature flags are words
    step "cargo clippy of the library, ${features:-default features}: no warnings in the feature sets users build" \
      cargo clippy -p dlock-rs --lib $features -- -D warnings || return
  done
  step "a user's build: clippy of the library against freshly updated dependencies, and a build with the MSRV's compiler (scripts/fresh_deps.sh)" \
    bash scripts/fresh_deps.sh || return
  echo "== $(date +%T) first run: the quickstart and seckill_segmented compile with cargo alone (no protoc), without a warning"
  first_run || return
  step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features || return
  # Not the build of the packages: the manifest is checked here, and what a packaged build
  # would find beyond it, a file the source includes but the package leaves out, is checked
  # by scripts/package_includes.py.
  step "cargo publish --dry-run (the library and its macro package stay publishable: manifest and files)" \
    cargo publish --dry-run --no-verify --allow-dirty -p dlock-macros -p dlock-rs || return
  python3 scripts/package_includes.py || return
  step "cargo test (macro UI cases and allocation-free tracing, built with the axum feature alone: see dlock/tests/ui.rs and quiet_observability.rs)" \
    cargo test -p dlock-rs --no-default-features --features axum --test ui --test quiet_observability || return
  step "doc tests (nextest does not run them)" cargo test --workspace --all-features --doc || return
  echo "== $(date +%T) checks done"
}

echo "== $(date +%T) cargo nextest (.config/nextest.toml): every test, each in its own process"
# The servers' data directories (tempfile's, through TMPDIR) go to memory: etcd, ZooKeeper
# and PostgreSQL sync their logs to disk on every write, which the tests only wait on.
# World-writable like /tmp: the PostgreSQL and MariaDB servers run as the `postgres` and
# `mysql` users.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  test_tmp=$(mktemp -d /dev/shm/dlock-tests.XXXXXX)
  chmod 1777 "$test_tmp"
  export TMPDIR="$test_tmp"
fi
status=0
alone='binary(held_50k) | binary(held_50k_loss) | binary(mysql_held)'
torture='package(dlock-torture) & binary(runs)'
echo "== $(date +%T) nextest, alone (after building every test): 50,000 held locks renewed on time need the whole machine"
cargo nextest run --workspace --all-features --profile alone -E "$alone" || status=$?
# The torture runs (30 s each, 4 worker processes and up to 7 servers) one at a time, beside
# the rest of the suite: their output goes to a file, printed when they are done.
echo "== $(date +%T) nextest: the torture runs one at a time, beside the rest (output below when done)"
cargo nextest run --workspace --all-features --profile one-at-a-time -E "$torture" \
  >"$torture_log" 2>&1 &
torture_pid=$!
echo "== $(date +%T) nextest: every other test, eight at a time"
(cargo nextest run --workspace --all-features -E "not ($alone) & not ($torture)" 2>&1 | tee "$main_log") &
main_pid=$!
# The checks take cargo's lock on the target directory for minutes: start them once both
# runs are past their (no-op) build and running tests.
for log in "$torture_log" "$main_log"; do
  for _ in $(seq 1 600); do
    grep -q "Starting" "$log" && break
    sleep 0.2
  done
done
echo "== $(date +%T) beside the tests, at idle priority: lints, the examples without protoc, docs, packaging, macro UI cases, doc tests (output below when done)"
checks >"$checks_log" 2>&1 &
checks_pid=$!
wait "$main_pid" || status=$?
wait "$torture_pid" || status=$?
echo "== $(date +%T) the torture runs"
cat "$torture_log"
checks_status=0
wait "$checks_pid" || checks_status=$?
echo "== $(date +%T) the checks beside the tests"
cat "$checks_log"
if [ "$checks_status" -ne 0 ]; then
  echo "error: a check failed (exit $checks_status): see its output above" >&2
  status=$checks_status
fi
# Where the time went, and the run's count, from nextest's JUnit reports.
echo "== $(date +%T) done"
python3 scripts/slowest.py "$target_dir"/nextest/{alone,one-at-a-time,default}/junit.xml || true
exit "$status"
