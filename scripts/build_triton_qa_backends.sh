#!/usr/bin/env bash
# build_triton_qa_backends.sh SERVER_GIT OUT_DIR [QA_DIR] — builds Triton's QA C++ test
# backends (the server repository's src/test/<name>/ backends that
# L0_implicit_state, L0_sequence_batcher, L0_dyna_sequence_batcher,
# L0_iterative_sequence, ... load) against Nereid's own Triton headers
# (include/triton/core/) and Nereid's build/libtritonserver.so, on a CPU-only
# machine, offline.
#
#   SERVER_GIT   git directory of triton-inference-server/server (from `fetch`)
#   OUT_DIR      receives backends/<name>/libtriton_<name>.so (Triton's image
#                layout, /opt/tritonserver/backends), build-status.txt, SOURCES.txt
#   QA_DIR       optional: a copy of the server repository's qa/ directory; the
#                libraries are also copied where Triton's Dockerfile.QA puts them
#                (qa/L0_implicit_state/, qa/custom_models/custom_*sequence_int32/1/,
#                qa/L0_iterative_sequence/models/iterative_sequence/1/, ...)
#
# Environment (optional):
#   BACKEND_GIT  triton-inference-server/backend (utilities library); default:
#                the sibling mirror of SERVER_GIT (…+backend/repo)
#   COMMON_GIT   triton-inference-server/common (triton_json.h, error); same default
#   NEREID_BUILD Nereid build directory with libtritonserver.so (default: build/
#                next to this script's scripts/ directory)
#   QA_BACKENDS  which src/test/ backends (default: implicit_state sequence
#                dyna_sequence iterative_sequence query distributed_addsub)
#
# The sources are compiled unchanged; scripts/triton_qa/cuda_cpu_stubs.h is
# force-included so their unconditional cudaMemcpy/cudaMemset/... calls (on
# GPU paths Nereid never takes: every buffer is CPU memory) compile without
# CUDA. Backend utilities are built with TRITON_ENABLE_GPU off and
# TRITON_ENABLE_STATS on, as upstream's CPU build.
# Exit status: 0 when every backend built, 1 when one did not, 2 on bad usage.
set -euo pipefail

usage() { sed -n '2,28p' "$0" >&2; exit 2; }
[ $# -eq 2 ] || [ $# -eq 3 ] || usage
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SERVER_GIT=$1
mirror_sibling() { echo "${SERVER_GIT%/}" | sed "s|+server/|+$1/|; s|+server\$|+$1|"; }
BACKEND_GIT=${BACKEND_GIT:-$(mirror_sibling backend)}
COMMON_GIT=${COMMON_GIT:-$(mirror_sibling common)}
NEREID_BUILD=$(cd "${NEREID_BUILD:-$ROOT/build}" 2>/dev/null && pwd) || NEREID_BUILD=""
QA_BACKENDS=${QA_BACKENDS:-"implicit_state sequence dyna_sequence iterative_sequence query distributed_addsub"}
CXX=${CXX:-g++}

for v in SERVER_GIT BACKEND_GIT COMMON_GIT; do
  if ! git --git-dir="${!v}" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    echo "build_triton_qa_backends.sh: $v='${!v}' is not a git directory" >&2
    exit 2
  fi
done
if [ -z "$NEREID_BUILD" ] || [ ! -f "$NEREID_BUILD/libtritonserver.so" ]; then
  echo "build_triton_qa_backends.sh: no libtritonserver.so in NEREID_BUILD (run make build first)" >&2
  exit 2
fi
if ! echo '#include <rapidjson/document.h>' | $CXX -x c++ -fsyntax-only - 2>/dev/null; then
  echo "build_triton_qa_backends.sh: needs $CXX and rapidjson-dev (apt-get install g++ rapidjson-dev)" >&2
  exit 2
fi

mkdir -p "$2"
OUT=$(cd "$2" && pwd)
SRC="$OUT/src"
B="$OUT/build"
rm -rf "$SRC" "$B"
mkdir -p "$SRC" "$B/obj"
: >"$OUT/SOURCES.txt"
extract() {  # extract NAME GITDIR PATH...
  local name=$1 git=$2
  shift 2
  mkdir -p "$SRC/$name"
  git --git-dir="$git" archive --format=tar HEAD -- "$@" | tar -x -C "$SRC/$name"
  printf '%-8s %s %s\n' "$name" "$(git --git-dir="$git" rev-parse HEAD)" \
    "$(git --git-dir="$git" log -1 --format=%cs HEAD)" >>"$OUT/SOURCES.txt"
}
extract server "$SERVER_GIT" src/test
extract backend "$BACKEND_GIT" include src
extract common "$COMMON_GIT" include src/error.cc

NICE="nice -n 19"
CXXFLAGS="-std=c++17 -O2 -fPIC -Wall -Wno-unused-parameter -Wno-unused-variable"
DEFS="-DTRITON_ENABLE_STATS=1"
# Nereid's headers first: the backends see only Nereid's declarations.
INC="-I$ROOT/include -I$SRC/common/include -I$SRC/backend/include"
LOG="$B/compile.log"
: >"$LOG"

# The backend utilities the QA backends use (backend_common, backend_model,
# backend_model_instance and what they pull in), as a static library.
UTILS="backend_common backend_input_collector backend_memory backend_model backend_model_instance backend_output_responder"
echo "[qa-backends] backend utilities"
for f in $UTILS; do
  $NICE $CXX $CXXFLAGS $DEFS $INC -c "$SRC/backend/src/$f.cc" -o "$B/obj/$f.o" >>"$LOG" 2>&1
done
$NICE $CXX $CXXFLAGS $INC -c "$SRC/common/src/error.cc" -o "$B/obj/common_error.o" >>"$LOG" 2>&1
ar rcs "$B/libtritonbackendutils.a" "$B"/obj/*.o

FAILED=0
: >"$OUT/build-status.txt"
for name in $QA_BACKENDS; do
  dir="$SRC/server/src/test/$name"
  [ -d "$dir" ] || dir="$SRC/server/src/test/${name}_backend"
  lib=$name
  if [ ! -d "$dir" ]; then
    printf '%-20s MISSING (no src/test/%s in the server repository)\n' "$name" "$name" >>"$OUT/build-status.txt"
    FAILED=1
    continue
  fi
  ld="$dir/src/libtriton_$lib.ldscript"
  dest="$OUT/backends/$lib"
  mkdir -p "$dest"
  echo "[qa-backends] libtriton_$lib.so"
  # Upstream's shape: version script exporting TRITONBACKEND_*, utilities
  # linked statically, NEEDED libtritonserver.so (Nereid's).
  if $NICE $CXX $CXXFLAGS $DEFS -include "$HERE/triton_qa/cuda_cpu_stubs.h" $INC \
      "$dir"/src/*.cc -shared -o "$dest/libtriton_$lib.so" \
      -Wl,--version-script="$ld" -Wl,--no-undefined \
      "$B/libtritonbackendutils.a" -L"$NEREID_BUILD" -ltritonserver -lpthread >>"$LOG" 2>&1; then
    printf '%-20s built  backends/%s/libtriton_%s.so\n' "$name" "$lib" "$lib" >>"$OUT/build-status.txt"
  else
    printf '%-20s FAILED (see build/compile.log)\n' "$name" >>"$OUT/build-status.txt"
    rm -rf "$dest"
    FAILED=1
  fi
done
# Dockerfile.QA's places (mkdir + cp, as the image does).
if [ $# -eq 3 ]; then
  QA=$(cd "$3" && pwd)
  install_qa() {  # install_qa LIB DEST-DIR-UNDER-QA
    local so="$OUT/backends/$1/libtriton_$1.so"
    [ -f "$so" ] || return 0
    mkdir -p "$QA/$2"
    cp "$so" "$QA/$2/"
    echo "[qa-backends] installed libtriton_$1.so in qa/$2"
  }
  install_qa implicit_state L0_implicit_state
  install_qa sequence custom_models/custom_sequence_int32/1
  install_qa dyna_sequence custom_models/custom_dyna_sequence_int32/1
  install_qa iterative_sequence L0_iterative_sequence/models/iterative_sequence/1
  install_qa query L0_query/models/query/1
  install_qa distributed_addsub L0_passive_instance/models/distributed_int32_int32_int32/1
fi
cat "$OUT/build-status.txt"
exit $FAILED
