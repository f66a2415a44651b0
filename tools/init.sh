#!/bin/sh
# Initialise tools/external.tools.jsonc for the bundled sidecars (no sidecar code is imported).
# Usage: tools/init.sh [--force] [--stdout]          default families (utility)
#        tools/init.sh web|media [...] [--force]     add opt-in families (toolhost init --add)
set -e
cd "$(dirname "$0")/.."
set -- $(for a in "$@"; do case "$a" in -*) echo "$a" ;; *) echo "--add $a" ;; esac; done)
if command -v toolhost >/dev/null 2>&1; then
  exec toolhost init --app-root . "$@"
elif [ -x .venv/bin/toolhost ]; then
  exec .venv/bin/toolhost init --app-root . "$@"
else
  exec python3 -m supervisor init --app-root . "$@"
fi
