#!/usr/bin/env bash
# Places ONNX Runtime's shared library, libonnxruntime.so.1, taken from the
# npm package onnxruntime-node (pinned by sha256), in DIR (default
# third_party/onnxruntime, where CMake copies it from next to the backend).
# Used by scripts/setup.sh and by deploy/Dockerfile's build stage.
# Idempotent: returns at once when the checked library is already there.
set -euo pipefail
ORT_VERSION=1.30.0
ORT_SHA256=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
ORT_DIR=${1:-$(cd "$(dirname "$0")/.." && pwd)/third_party/onnxruntime}
ORT_LIB=$ORT_DIR/libonnxruntime.so.1
ORT_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/nereid/onnxruntime-$ORT_VERSION/libonnxruntime.so.1
if [ ! -f "$ORT_LIB" ] && [ -f "$ORT_CACHE" ]; then
  mkdir -p "$ORT_DIR" && cp "$ORT_CACHE" "$ORT_LIB"
fi
if ! { [ -f "$ORT_LIB" ] && echo "$ORT_SHA256  $ORT_LIB" | sha256sum -c --status; }; then
  echo "fetch_onnxruntime: fetching onnxruntime-node@$ORT_VERSION from npm"
  mkdir -p "$ORT_DIR"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "onnxruntime-node@$ORT_VERSION" >/dev/null)
  tar -xzf "$tmp"/onnxruntime-node-*.tgz -C "$tmp" package/bin/napi-v6/linux/x64/libonnxruntime.so.1
  cp "$tmp/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" "$ORT_LIB.tmp"
  rm -rf "$tmp"
  echo "$ORT_SHA256  $ORT_LIB.tmp" | sha256sum -c --status || { echo "fetch_onnxruntime: sha256 mismatch for libonnxruntime.so.1" >&2; rm -f "$ORT_LIB.tmp"; exit 1; }
  mv "$ORT_LIB.tmp" "$ORT_LIB"
  mkdir -p "$(dirname "$ORT_CACHE")" && cp "$ORT_LIB" "$ORT_CACHE"
fi
