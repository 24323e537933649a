#!/usr/bin/env bash
# System packages the tests use. Installs only what is missing; needs root (CI runs as root).
set -euo pipefail
packages=(numactl libjemalloc2 libgoogle-perftools4 chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-system: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
