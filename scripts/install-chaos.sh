#!/usr/bin/env bash
# Install what the chaos suite needs from Debian (as root or via sudo): iproute2 (ip, ss) for
# network namespaces, nftables for the faults on their links (iptables for the gossip tests'
# loss and partitions), libfaketime for the wall-clock jump. Idempotent: does nothing when
# every tool is there already.
set -euo pipefail

have_faketime() {
    compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || [[ -e /usr/lib/faketime/libfaketime.so.1 ]]
}
missing=()
command -v ip >/dev/null 2>&1 && command -v ss >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)  # the gossip tests (testing/netns.py)
have_faketime || missing+=(libfaketime)
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "chaos: iproute2, nftables, iptables and libfaketime present"; exit 0
fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "chaos: missing ${missing[*]} and not root: the scenarios that need them are skipped" >&2
        exit 0
    fi
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "chaos: installed ${missing[*]}"
