#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for the dashboard's browser tests (as root or via
# sudo). Idempotent: does nothing when /usr/bin/chromium (or CONTEND_CHROMIUM) is already there.
# The tests drive it with the `playwright` Python package; `playwright install` (which downloads
# a browser build of its own) is never used.
set -euo pipefail

bin="${CONTEND_CHROMIUM:-/usr/bin/chromium}"
if [[ -x "$bin" ]]; then
    echo "chromium: $bin ($("$bin" --version 2>/dev/null | head -n1))"; exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "chromium: $bin ($("$bin" --version 2>/dev/null | head -n1))"
