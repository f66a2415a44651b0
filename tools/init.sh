#!/bin/sh
# Initialise tools/external.tools.jsonc for the bundled sidecars (no sidecar code is imported).
# Usage: tools/init.sh [family...] [--force] [--stdout]
#   A family name (e.g. `browser`) registers that opt-in family too (`toolhost init --add`);
#   with an existing registry it is added to it.
set -e
cd "$(dirname "$0")/.."
n=$#
for a in "$@"; do
  case "$a" in
    -*) set -- "$@" "$a" ;;
    *) set -- "$@" --add "$a" ;;
  esac
done
shift "$n"
if command -v toolhost >/dev/null 2>&1; then
  exec toolhost init --app-root . "$@"
elif [ -x .venv/bin/toolhost ]; then
  exec .venv/bin/toolhost init --app-root . "$@"
else
  exec python3 -m supervisor init --app-root . "$@"
fi
