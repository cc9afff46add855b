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
# here) refuses a std API newer than `rust-version` (Cargo.toml); with
# `-D warnings` in every clippy step the build is checked against it. It
# does not compile with that old compiler (no old toolchain is installed):
# syntax or a language feature newer than the MSRV is not caught.
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
