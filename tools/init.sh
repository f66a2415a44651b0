#!/bin/sh
# Initialise tools/external.tools.jsonc for the bundled sidecars (no sidecar code is imported).
# Usage: tools/init.sh [--force] [--stdout]
set -e
cd "$(dirname "$0")/.."
if command -v toolhost >/dev/null 2>&1; then
  exec toolhost init --app-root . "$@"
elif [ -x .venv/bin/toolhost ]; then
  exec .venv/bin/toolhost init --app-root . "$@"
else
  exec python3 -m supervisor init --app-root . "$@"
fi
