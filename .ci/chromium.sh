#!/usr/bin/env bash
# Chromium for the web UI's browser tests (tests/faces/test_ui*.py drive it through
# Playwright with executable_path=/usr/bin/chromium; Playwright's own browser download
# cannot work here). Idempotent and quiet, like postgres.sh: installs Debian's
# `chromium` only when it is missing, and only as root; otherwise says what is missing
# (the browser tests then skip, or fail under CI).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium.sh: no chromium found; install the 'chromium' package" \
        "to run the web UI's browser tests" >&2
    exit 0
fi
echo "chromium.sh: installing Chromium (apt-get install chromium)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
[ -x /usr/bin/chromium ] || { echo "chromium.sh: installed chromium, still no /usr/bin/chromium" >&2; exit 1; }
