#!/usr/bin/env bash
# valgrind for the benchmarks' instruction counts (benchmarks/instructions.py; never CI).
# Idempotent and quiet: installs Debian's `valgrind` only when it is missing, and only as
# root; otherwise says so (the benchmarks then report no instruction counts).
set -euo pipefail
if command -v valgrind >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "valgrind.sh: no valgrind; install the 'valgrind' package for instruction counts" >&2
    exit 0
fi
echo "valgrind.sh: installing valgrind (apt-get install valgrind)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends valgrind >/dev/null
