#!/usr/bin/env bash
# Builds the Nereid image (deploy/Dockerfile) with buildah, no daemon needed:
#   apt-get install buildah debootstrap; make setup; bash deploy/build-image.sh [TAG]
# When the debian:12-slim base cannot be pulled (no container registry
# reachable), a stand-in is made from Debian's own mirror with debootstrap
# (minbase bookworm) and tagged docker.io/library/debian:12-slim locally.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/nereid:latest}
BASE=docker.io/library/debian:12-slim
[ -f third_party/onnxruntime/libonnxruntime.so.1 ] || { echo "run make setup first" >&2; exit 1; }
if ! buildah inspect --type image "$BASE" >/dev/null 2>&1 && ! buildah pull -q "$BASE" >/dev/null 2>&1; then
  echo "build-image: $BASE cannot be pulled; making it with debootstrap"
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  ctr=$(buildah from scratch)
  cp -a "$root"/. "$(buildah mount "$ctr")"/
  buildah umount "$ctr" >/dev/null
  buildah config --cmd /bin/bash "$ctr"
  buildah commit -q "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
  rm -rf "$root"
fi
buildah bud --isolation chroot --pull=false -f deploy/Dockerfile -t "$TAG" .
