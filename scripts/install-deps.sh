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
set -euo pipefail

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

if [[ ${#missing[@]} -eq 0 ]]; then
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
