#!/usr/bin/env bash
# A user's build: the library linted against the newest semver-compatible
# dependencies (what `cargo add dlock-rs` resolves), not the ones in our lock
# file. A dependency's new deprecation or lint shows here before a user
# reports it (rustls 0.23.48 deprecated `ring::default_provider` while the
# lock file held 0.23.46). Run by scripts/test.sh's checks at idle priority.
#
# The workspace's files (tracked and new, not ignored ones) are copied to a
# temporary directory whose lock file `cargo update` renews; the build goes
# to the main target directory, after the workspace's own clippy step, so
# only the dependencies `cargo update` changed (and the workspace's crates)
# are checked again: artifacts are keyed by version and features, so the
# updated ones sit beside the locked ones. In a directory of its own, the
# cold check of every dependency took 1,404 s at idle priority beside the
# tests. Needs crates.io.
#
# MSRV: clippy's `incompatible_msrv` lint (on by default, made explicit
# here) refuses a std API newer than `rust-version` (Cargo.toml). Then the
# library is checked with that compiler itself (installed with rustup when
# missing: a minimal toolchain, ~30 s), against the dependencies a user on
# it resolves: cargo's MSRV-aware resolver (`incompatible-rust-versions =
# fallback`, the default of resolver 3) picks, for each dependency, the
# newest version whose own `rust-version` that compiler meets. This is how
# 1.85 was found to be wrong: every redis 1.x needs 1.88. Its target
# directory is kept under the user's cache (a cold check takes about 9
# minutes at idle priority beside other builds; a warm one seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir="$(realpath "${CARGO_TARGET_DIR:-target}")"
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
start=$SECONDS
git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} sh -c 'test -f "$1" && printf "%s\0" "$1" || true' _ {} |
  tar --null -T - -cf - | tar -xf - -C "$copy"
cd "$copy"
cargo update --quiet
echo "dependencies updated: $(git diff --no-index --stat "$OLDPWD/Cargo.lock" "$copy/Cargo.lock" 2>/dev/null | tail -1 || true)"
CARGO_TARGET_DIR="$target_dir" cargo clippy -p dlock-rs --lib --all-features --message-format=short \
  -- -D warnings -W clippy::incompatible_msrv
echo "fresh dependencies: the library lints clean in $((SECONDS - start)) s"

# The MSRV's own compiler, on the dependencies a user with it resolves.
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
if [[ -z "$msrv" ]]; then
  echo "fresh_deps: no rust-version in Cargo.toml's [workspace.package]" >&2
  exit 1
fi
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  if ! command -v rustup >/dev/null; then
    echo "fresh_deps: the MSRV check needs rustup to install Rust $msrv (https://rustup.rs)" >&2
    exit 1
  fi
  echo "fresh_deps: installing Rust $msrv (rustup toolchain install $msrv --profile minimal)"
  rustup toolchain install "$msrv" --profile minimal
fi
start=$SECONDS
CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo update --quiet
msrv_target="${XDG_CACHE_HOME:-$HOME/.cache}/dlock/msrv-target"
mkdir -p "$msrv_target"
CARGO_TARGET_DIR="$msrv_target" cargo "+$msrv" check -p dlock-rs --lib --all-features --message-format=short
echo "MSRV: the library builds with Rust $msrv and every feature in $((SECONDS - start)) s"
