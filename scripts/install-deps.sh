#!/usr/bin/env bash
# Installs the servers and build tools the tests need, only where missing:
# Redis, etcd, ZooKeeper (+ Curator jars for the interop test), and protoc
# with the well-known protos for building etcd-client.
set -euo pipefail

missing=()
need() { # need <package> <test command...>
  local pkg=$1; shift
  if ! "$@" >/dev/null 2>&1; then missing+=("$pkg"); fi
}
need redis-server command -v redis-server
need redis-tools command -v redis-cli
need etcd-server command -v etcd
need etcd-client command -v etcdctl
need zookeeper test -f /usr/share/java/zookeeper.jar
need libslf4j-java test -f /usr/share/java/slf4j-simple.jar
need protobuf-compiler command -v protoc
need libprotobuf-dev test -f /usr/include/google/protobuf/descriptor.proto
need libcurator-recipes-java test -f /usr/share/java/curator-recipes.jar
need libcurator-framework-java test -f /usr/share/java/curator-framework.jar
need libcurator-client-java test -f /usr/share/java/curator-client.jar

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything is installed"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
