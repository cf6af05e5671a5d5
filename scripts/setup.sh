#!/usr/bin/env bash
# Installs every dependency Nereid needs on Debian 12: apt packages and the
# ONNX Runtime shared library from the npm package onnxruntime-node (pinned by
# sha256). Idempotent: returns quickly when everything is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="build-essential cmake pkg-config clang libclang-rt-14-dev \
libprotobuf-c-dev protobuf-c-compiler libmicrohttpd-dev libjansson-dev zlib1g-dev \
libgrpc-dev protobuf-compiler protobuf-compiler-grpc \
python3-pytest python3-requests python3-numpy python3-onnx python3-grpcio python3-protobuf \
wrk libtorch-dev python3-torch nginx python3-yaml libcurl4-openssl-dev \
rapidjson-dev libfast-float-dev libgnutls28-dev openssl libre2-dev libarchive-dev"

missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  echo "setup: installing apt packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

ORT_VERSION=1.30.0
ORT_SHA256=ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
ORT_DIR=third_party/onnxruntime
ORT_LIB=$ORT_DIR/libonnxruntime.so.1
ORT_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/nereid/onnxruntime-$ORT_VERSION/libonnxruntime.so.1
if [ ! -f "$ORT_LIB" ] && [ -f "$ORT_CACHE" ]; then
  mkdir -p "$ORT_DIR" && cp "$ORT_CACHE" "$ORT_LIB"
fi
if ! { [ -f "$ORT_LIB" ] && echo "$ORT_SHA256  $ORT_LIB" | sha256sum -c --status; }; then
  echo "setup: fetching onnxruntime-node@$ORT_VERSION from npm"
  mkdir -p "$ORT_DIR"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "onnxruntime-node@$ORT_VERSION" >/dev/null)
  tar -xzf "$tmp"/onnxruntime-node-*.tgz -C "$tmp" package/bin/napi-v6/linux/x64/libonnxruntime.so.1
  cp "$tmp/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" "$ORT_LIB.tmp"
  rm -rf "$tmp"
  echo "$ORT_SHA256  $ORT_LIB.tmp" | sha256sum -c --status || { echo "setup: sha256 mismatch for libonnxruntime.so.1" >&2; rm -f "$ORT_LIB.tmp"; exit 1; }
  mv "$ORT_LIB.tmp" "$ORT_LIB"
  mkdir -p "$(dirname "$ORT_CACHE")" && cp "$ORT_LIB" "$ORT_CACHE"
fi

# Offline Kubernetes schema validation of deploy/k8s (npm, versions pinned
# by deploy/k8s/validate/package-lock.json); skipped when already installed.
K8S_VALIDATE=deploy/k8s/validate
if ! cmp -s "$K8S_VALIDATE/package-lock.json" "$K8S_VALIDATE/node_modules/.nereid-lock" 2>/dev/null; then
  echo "setup: installing the deploy/k8s validator from npm"
  (cd "$K8S_VALIDATE" && npm ci --no-audit --no-fund --silent)
  cp "$K8S_VALIDATE/package-lock.json" "$K8S_VALIDATE/node_modules/.nereid-lock"
fi

# Object storage emulators (s3rver, azurite) and the AWS / Azure SDK clients
# that tests/integration/test_storage.py uploads with (npm, versions pinned by
# tools/storage-emulators/package-lock.json); skipped when already installed.
STORAGE_EMU=tools/storage-emulators
if ! cmp -s "$STORAGE_EMU/package-lock.json" "$STORAGE_EMU/node_modules/.nereid-lock" 2>/dev/null; then
  echo "setup: installing the object storage emulators from npm"
  (cd "$STORAGE_EMU" && npm ci --no-audit --no-fund --silent)
  cp "$STORAGE_EMU/package-lock.json" "$STORAGE_EMU/node_modules/.nereid-lock"
fi
