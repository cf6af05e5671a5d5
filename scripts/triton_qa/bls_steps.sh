#!/usr/bin/env bash
# Triton's qa/L0_backend_python/bls/test.sh, its three last steps, against a
# Nereid binary:
#   1. "Test model loading API with BLS"         (bls_model_loading, explicit mode,
#                                                  curl load + test_infer_shm_leak.py)
#   2. "Test model loading API with BLS warmup"  (same model + model_warmup, curl load)
#   3. "Test BLS parameters"                     (bls_parameters_test.py)
#
#   bls_steps.sh NEREID_BINARY [BACKEND_DIR]
#
# BACKEND_DIR defaults to <dir of NEREID_BINARY>/backends (the build's).
# COMPAT_DIR (default /tmp/compat) is what the compat harness's build.sh
# assembled (../shared/compat/README.md); HARNESS (default ../shared/compat
# beside this checkout) its shims; nothing there is changed.
# STEPS_TIMEOUT (s, default 1200) bounds the whole run.  ONLY_PARAMS=1 runs
# step 3 alone.
#
# Triton's files are not changed: the script that runs is cut out of the
# scratch copy of bls/test.sh with awk, lines kept verbatim: its header (up
# to "rm -fr *.log ./models *.txt *.xml"), the "if [[ ${TEST_WINDOWS} == 0 ]]"
# line that opens the block of step 1-2, and everything from
# "# Test model loading API with BLS" to the end.  Cut: the GPU model loop
# (first TEST_WINDOWS block), bls_init_error and bls_finalize_error.
# It runs as the parent qa/L0_backend_python/test.sh runs it:
# "(cd bls && bash -ex test.sh)", with the variables that script exports.
#
# The whole thing runs in a private network, pid and mount namespace
# (ports 8000-8002 of its own; /dev/shm a private tmpfs of 1 GiB, as
# Triton's CI container has --shm-size=1g).  Logs are copied to
# $COMPAT_DIR/runs/<time>/ at the end.  Results: docs/compatibility.md,
# "The bls model-loading steps".
set -uo pipefail
if [ -z "${BLS_STEPS_INNER:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: $0 NEREID_BINARY [BACKEND_DIR]" >&2; exit 2; }
  export BLS_STEPS_INNER=1
  exec unshare -n -p -f -m --mount-proc bash -c \
    'ip link set lo up && mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$0" "$@"' "$0" "$@"
fi

NEREID=$(readlink -f "$1")
BDIR=$(readlink -f "${2:-$(dirname "$NEREID")/backends}")
COMPAT_DIR=${COMPAT_DIR:-/tmp/compat}
HARNESS=${HARNESS:-$(readlink -f "$(dirname "$0")/../../../shared/compat")}
STEPS_TIMEOUT=${STEPS_TIMEOUT:-1200}
STAMP=$(date -u +%Y%m%dT%H%M%S)
OUT=$COMPAT_DIR/runs/$STAMP
mkdir -p "$OUT"

# the harness's shims, fresh (tritonserver execs $COMPAT_SERVER in place)
rm -rf "$COMPAT_DIR/shims" && cp -r "$HARNESS/shims" "$COMPAT_DIR/shims"
cp "$HARNESS/shims/tritonserver" "$COMPAT_DIR/triton/bin/tritonserver"
rm -f "$COMPAT_DIR/.server-flags"
# Stand-in for Triton's triton_shm_monitor (a C++ module of its build, which
# shm_util.ShmLeakDetector imports).  It watches the stub's
# /dev/shm/triton_python_backend_shm_region_* pools; Nereid makes none, so
# the detector finds no region and never constructs one.  If a region ever
# appears, constructing it fails loudly instead of inventing a number.
mkdir -p "$COMPAT_DIR/shm_monitor_standin"
cat > "$COMPAT_DIR/shm_monitor_standin/triton_shm_monitor.py" <<'PY'
class SharedMemoryManager:
    def __init__(self, name):
        raise RuntimeError("triton_shm_monitor stand-in: no monitor for region %r" % name)
PY

export COMPAT_DIR COMPAT_SERVER="$NEREID" COMPAT_TRITON_DIR="$COMPAT_DIR/triton" \
       COMPAT_DATADIR="$COMPAT_DIR/data" COMPAT_SUITE=L0_backend_python.bls_steps COMPAT_PHASE=bls
export COMPAT_RESULTS="$OUT/results.jsonl"
export PATH="$COMPAT_DIR/shims/bin:$COMPAT_TRITON_DIR/bin:$PATH"
export PYTHONPATH="$COMPAT_DIR/shims:$COMPAT_DIR/shm_monitor_standin:$COMPAT_DIR/pylib:$COMPAT_DIR/qa/common"
export PYTEST_ADDOPTS="-p compat_pytest_recorder"
export PYTHONDONTWRITEBYTECODE=1
export COMPAT_PY_TIMEOUT=${COMPAT_PY_TIMEOUT:-600}
# what qa/L0_backend_python/test.sh exports for its sub-suites
QA=$COMPAT_DIR/qa
export REPO_VERSION=compat NVIDIA_TRITON_SERVER_VERSION=compat TEST_WINDOWS=0 \
       DATADIR="$COMPAT_DATADIR" TRITON_DIR="$COMPAT_TRITON_DIR" \
       SERVER="$COMPAT_TRITON_DIR/bin/tritonserver" BACKEND_DIR="$BDIR" \
       MODELDIR="$QA/L0_backend_python" TEST_JETSON=0 CUDA_VISIBLE_DEVICES=0 \
       PYTHON_ENV_VERSION=12 PYTHON_BACKEND_REPO_TAG=main
unset TRITONSERVER_IPADDR SERVER_IPADDR SERVER_LOG SERVER_TIMEOUT   # util.sh's defaults

cd "$QA/L0_backend_python/bls" || exit 2
# ONLY_PARAMS=1: step 3 alone (the header and "# Test BLS parameters" to the end)
awk -v only_params="${ONLY_PARAMS:-0}" '
  !hdr { print; if ($0 == "rm -fr *.log ./models *.txt *.xml") hdr = 1; next }
  only_params == 1 && /^# Test BLS parameters$/ { tail = 1 }
  only_params != 1 && /^# FIXME: \[DLIS-6122\]/ { fixme = 1; next }
  only_params != 1 && fixme == 1 && /^if \[\[ \$\{TEST_WINDOWS\} == 0 \]\]; then$/ { print; fixme = 2; next }
  only_params != 1 && /^    # Test model loading API with BLS$/ { tail = 1 }
  tail { print }
' test.sh > bls_last_steps.sh
{ echo "=== cut from test.sh (diff test.sh bls_last_steps.sh)"; diff test.sh bls_last_steps.sh | grep '^[<>]' | head -3; echo "... $(diff test.sh bls_last_steps.sh | grep -c '^<') lines cut, $(diff test.sh bls_last_steps.sh | grep -c '^>') added"; } > "$OUT/cut.txt"

echo "[bls_steps] $NEREID, backends $BDIR, logs $OUT"
rm -f /dev/shm/triton_python_backend_shm_region_* 2>/dev/null || true
start=$(date +%s)
timeout -k 30 "$STEPS_TIMEOUT" bash -ex bls_last_steps.sh > "$OUT/test.sh.out" 2>&1
rc=$?
end=$(date +%s)
echo "bls_last_steps.sh exit $rc after $((end - start)) s" | tee -a "$OUT/test.sh.out"
# any server left (a timeout): by pid, those carrying this run's COMPAT_SUITE
for p in $(pgrep -f "^$NEREID" 2>/dev/null); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "COMPAT_SUITE=$COMPAT_SUITE" && kill -9 "$p"
done
cp ./*.log ./*.xml "$COMPAT_DIR/server-adaptations.log" "$OUT/" 2>/dev/null
cp -r models "$OUT/models_after" 2>/dev/null
/usr/bin/python3 - "$OUT/results.jsonl" <<'PY'
import json, sys, collections
c = collections.Counter()
try:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r.get("kind") == "test":
            c[r.get("outcome")] += 1
            print("  %-8s %s" % (r.get("outcome"), r.get("test") or r.get("id") or r))
        elif r.get("kind") == "invocation":
            print("  python rc=%s %s" % (r["rc"], " ".join(r["argv"])))
except FileNotFoundError:
    pass
print("  outcomes:", dict(c))
PY
grep -E '^\*\*\* |Failed to load|test FAILED|PASSED' "$OUT/test.sh.out" | sed 's/^/  /'
exit $rc
