#!/usr/bin/env bash
# Installs the Debian packages of the named lists, scripts/packages/<list>.txt:
# the one source of truth for scripts/setup.sh and deploy/Dockerfile.
#   bash scripts/packages/apt-install.sh build runtime      install what is missing
#   bash scripts/packages/apt-install.sh --print build      print the names only
# Idempotent: nothing is fetched when every package is already installed.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
print=0
if [ "${1:-}" = --print ]; then print=1; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [--print] LIST..." >&2; exit 2; }
pkgs=""
for list in "$@"; do
  f="$dir/$list.txt"
  [ -f "$f" ] || { echo "apt-install: no package list $f" >&2; exit 2; }
  pkgs="$pkgs $(sed -e 's/#.*//' "$f" | tr -s ' \t' '\n\n')"
done
if [ "$print" = 1 ]; then
  printf '%s\n' $pkgs
  exit 0
fi
# one dpkg query for all: the names installed
installed=" $(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' $pkgs 2>/dev/null | awk '$2 == "ii" {printf "%s ", $1}' || true)"
missing=""
for p in $pkgs; do
  # npm may come with a Node.js installed otherwise
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  [[ "$installed" == *" $p "* ]] || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
echo "apt-install: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
