#!/usr/bin/env bash
# Installs every dependency Nereid needs on Debian 12: apt packages and the
# ONNX Runtime shared library from the npm package onnxruntime-node (pinned by
# sha256). Idempotent: returns quickly when everything is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: the lists in scripts/packages/ (deploy/Dockerfile installs
# the same build and runtime lists). To add one, add it to the right list.
bash scripts/packages/apt-install.sh build runtime dev libtorch-build libtorch-runtime

# ONNX Runtime's shared library from npm (deploy/Dockerfile fetches it the same way).
bash scripts/fetch_onnxruntime.sh third_party/onnxruntime

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
