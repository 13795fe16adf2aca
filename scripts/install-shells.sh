#!/usr/bin/env bash
# Install the shells whose completion scripts the tests run (zsh, fish) from Debian, as root or
# via sudo. Idempotent: does nothing when both are there already.
set -euo pipefail
missing=()
command -v zsh >/dev/null 2>&1 || missing+=(zsh)
command -v fish >/dev/null 2>&1 || missing+=(fish)
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "shells: zsh and fish present"; exit 0
fi
SUDO=""
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "shells: missing ${missing[*]} and not root: their completion tests will say so" >&2
        exit 0
    fi
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "shells: installed ${missing[*]}"
