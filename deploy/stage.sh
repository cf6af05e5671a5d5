#!/usr/bin/env bash
# Lays out what an installation ships, from a build tree (the nereid_dist
# target): deploy/stage.sh BUILD DEST
#   DEST/bin/nereid, DEST/bin/libtritonserver.so (next to the executable,
#   where the Triton-API backends' loader looks), DEST/backends/: every
#   backend library, libonnxruntime.so.1 and the whole python/ folder (the
#   worker and triton_python_backend_utils), without CMake's own files.
# Debug information is stripped (set STRIP=true to keep it). Used by
# deploy/Dockerfile; tests/integration/test_image_files.py runs it too.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BUILD DEST" >&2; exit 2; }
build=$1 dest=$2
STRIP=${STRIP:-strip}
mkdir -p "$dest/bin" "$dest/backends"
cp "$build/nereid" "$build/libtritonserver.so" "$dest/bin/"
tar -C "$build/backends" --exclude=CMakeFiles --exclude=Makefile --exclude=cmake_install.cmake \
  --exclude=CTestTestfile.cmake --exclude=__pycache__ --exclude='*.o' -cf - . | tar -C "$dest/backends" -xf -
find "$dest/backends" -type d -empty -delete
mkdir -p "$dest/backends"
$STRIP --strip-debug "$dest/bin/nereid" "$dest/bin/libtritonserver.so"
find "$dest/backends" -name 'libnereid_*.so' -exec $STRIP --strip-debug {} +
