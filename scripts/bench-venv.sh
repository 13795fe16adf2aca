#!/usr/bin/env bash
# The throwaway virtualenv of the peer and sustained-load benchmarks: PgQueuer, Procrastinate,
# Huey, redis-py and matplotlib from PyPI, as pinned in benchmarks/peers/requirements.txt.
# It lives in .bench-venv (gitignored; BENCH_VENV to put it elsewhere), never in .venv, and is
# made again whenever the requirements change. Prints the virtualenv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BENCH_VENV:-.bench-venv}"
req=benchmarks/peers/requirements.txt
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$req" "$venv/requirements.txt"; then
    echo "making the bench virtualenv in $venv (peers from PyPI)" >&2
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    cp "$req" "$venv/requirements.txt"
fi
echo "$venv/bin/python"
