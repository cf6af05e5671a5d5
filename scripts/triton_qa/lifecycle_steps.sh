#!/usr/bin/env bash
# Triton's qa/L0_lifecycle/test.sh step by step against a Nereid binary.
#
#   lifecycle_steps.sh NEREID_BINARY [STEP...]
#   lifecycle_steps.sh --list              (the steps, without running any)
#
# A step is one block of test.sh: its model set-up, one server start (or a
# few, for the port-collision and negative-start checks) and its client
# test(s) or shell checks.  STEP is a number (from --list) or a substring of
# a step's name; none = every step.  Each step runs as a script of its own
# (the header of test.sh, the step, its footer), so a step that fails or
# "exit 1"s does not hide the ones after it.  One line per step:
#   NN name: passed | failed (first failure line) | skipped (reason: model)
# A step is "skipped" only when it did not pass and its set-up uses a model
# this machine cannot serve (TensorRT plan_*/OpenVINO placeholders,
# Triton's C++ "sequence" test backend, a GPU), and no
# failing python test's error names only models outside that set; the
# model is named, and so is the step's first failure (check it: an error
# that names no model at all cannot be told apart automatically).
#
# COMPAT_DIR (default /tmp/compat) is what the compat harness's build.sh
# assembled (../shared/compat/README.md); HARNESS (default ../shared/compat
# beside this checkout, or beside the checkout's parent) its shims; nothing
# there is changed.  The port-collision steps (05-08) need a shim that keeps
# the addresses a test gives when COMPAT_KEEP_ADDRESSES=1 (this script sets
# it): through a shim that forces 127.0.0.1 their greps cannot match.
# LENIENT (default 1, as run.sh runs L0_lifecycle) lets the shim add
# --exit-on-error=false --strict-readiness=false when a step does not give
# them (so a placeholder model does not stop a server that Triton would have
# started); steps whose server is meant to fail to start, and steps that give
# --exit-on-error or --strict-readiness themselves, run with it off.
# STEP_TIMEOUT (s, default 900) bounds one step.
#
# Triton's files are not changed: each step's script is cut out of the
# scratch copy of test.sh with awk, lines verbatim.  Header: line 1 up to
# the first step.  A step starts at a top-level "# ..." comment line whose
# previous non-blank line is a top-level "LOG_IDX=$((LOG_IDX+1))" or "done"
# after at least one LOG_IDX increment since the previous step start (the
# one exception: test_load_gpu_limit's "# Run server to stop model loading"
# stays in its step).  Footer: from "if [ $RET -eq 0 ]; then" to the end.
# A step that reuses the models of the step before it (no "rm -fr models"
# before its first SERVER_ARGS) gets that step's set-up lines (up to its
# first SERVER_ARGS) in front of it.
#
# Everything runs in a private network, pid and mount namespace (ports
# 8000-8005 of its own).  Logs: $COMPAT_DIR/runs/lifecycle-<time>/NN_name/.
set -uo pipefail
if [ "${1:-}" != "--list" ] && [ -z "${LC_STEPS_INNER:-}" ]; then
  [ $# -ge 1 ] || { echo "usage: $0 NEREID_BINARY [STEP...] | --list" >&2; exit 2; }
  export LC_STEPS_INNER=1
  exec unshare -n -p -f -m --mount-proc bash -c \
    'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi

COMPAT_DIR=${COMPAT_DIR:-/tmp/compat}
HARNESS=${HARNESS:-$(readlink -f "$(dirname "$0")/../../../shared/compat")}
[ -d "$HARNESS/shims" ] || HARNESS=$(readlink -f "$(dirname "$0")/../../../../shared/compat")   # from a worktree in /work/wt
[ -d "$HARNESS/shims" ] || { echo "no harness shims in '$HARNESS' (set HARNESS)" >&2; exit 2; }
QA=$COMPAT_DIR/qa
LC=$QA/L0_lifecycle
[ -f "$LC/test.sh" ] || { echo "no $LC/test.sh: run the harness's build.sh first" >&2; exit 2; }

STAMP=$(date -u +%Y%m%dT%H%M%S)
OUT=$COMPAT_DIR/runs/lifecycle-$STAMP
SPLIT=$(mktemp -d)
trap 'rm -rf "$SPLIT"' EXIT

# ---- cut test.sh into header, steps, footer ($SPLIT/header.sh, NN.sh, footer.sh, names)
awk -v dir="$SPLIT" '
  function flush_step() { if (n > 0) close(sprintf("%s/%02d.sh", dir, n)) }
  function name_of(line,   s) {
    s = line; sub(/^# */, "", s)
    if (s ~ /^LifeCycleTest\./) { sub(/^LifeCycleTest\./, "", s) }
    gsub(/[^A-Za-z0-9_]+/, "_", s); sub(/_+$/, "", s)
    return substr(s, 1, 48)
  }
  /^if \[ \$RET -eq 0 \]; then$/ { footer = 1 }
  footer { print > (dir "/footer.sh"); next }
  {
    start = 0
    if ($0 ~ /^# / && (n == 0 ? ($0 ~ /^# LifeCycleTest\./) : (incs > 0 && (prev == "LOG_IDX=$((LOG_IDX+1))" || prev == "done"))) \
        && $0 !~ /^# Run server to stop model loading/) start = 1
    if (start) {
      flush_step(); n++; incs = 0
      print sprintf("%02d %s", n, name_of($0)) > (dir "/names")
    }
    if (n == 0) print > (dir "/header.sh")
    else print > sprintf("%s/%02d.sh", dir, n)
    if ($0 ~ /^ *LOG_IDX=\$\(\(LOG_IDX\+1\)\)$/) incs++
    if ($0 !~ /^[ \t]*$/) prev = $0
  }
' "$LC/test.sh"
# test_parse_error_noexit_strict appears twice and test_multiple_model_repository_control_startup_models
# is re-used: make names unique by their number anyway
if [ "${1:-}" = "--list" ]; then cat "$SPLIT/names"; exit 0; fi

NEREID=$(readlink -f "$1"); shift
STEP_TIMEOUT=${STEP_TIMEOUT:-900}
mkdir -p "$OUT"

# which steps
sel=()
while read -r num name; do
  if [ $# -eq 0 ]; then sel+=("$num"); continue; fi
  for s in "$@"; do
    if [[ "$s" =~ ^[0-9]+$ ]]; then [ "$((10#$s))" = "$((10#$num))" ] && sel+=("$num")
    elif [[ "$name" == *"$s"* ]]; then sel+=("$num"); fi
  done
done < "$SPLIT/names"
[ ${#sel[@]} -gt 0 ] || { echo "no step matches: $*" >&2; exit 2; }

# the harness's shims, fresh (tritonserver execs $COMPAT_SERVER in place)
rm -rf "$COMPAT_DIR/shims" && cp -r "$HARNESS/shims" "$COMPAT_DIR/shims"
cp "$HARNESS/shims/tritonserver" "$COMPAT_DIR/triton/bin/tritonserver"
rm -f "$COMPAT_DIR/.server-flags"

# what run.sh exports for an L0 suite
# COMPAT_KEEP_ADDRESSES=1: a shim that knows it keeps Triton's 0.0.0.0 (the
# port-collision steps grep "Socket '0.0.0.0:8001' already in use"); safe
# here, in a network namespace of our own
export COMPAT_DIR COMPAT_SERVER="$NEREID" COMPAT_TRITON_DIR="$COMPAT_DIR/triton" \
       COMPAT_DATADIR="$COMPAT_DIR/data" COMPAT_SUITE=L0_lifecycle.steps COMPAT_KEEP_ADDRESSES=1
export PATH="$COMPAT_DIR/shims/bin:$COMPAT_TRITON_DIR/bin:$PATH"
export PYTHONPATH="$COMPAT_DIR/shims:$COMPAT_DIR/pylib:$COMPAT_DIR/qa/common"
export PYTEST_ADDOPTS="-p compat_pytest_recorder"
export PYTHONDONTWRITEBYTECODE=1
export COMPAT_PY_TIMEOUT=${COMPAT_PY_TIMEOUT:-600}
export DATADIR="$COMPAT_DATADIR" TRITON_DIR="$COMPAT_TRITON_DIR" REPO_VERSION=compat \
       NVIDIA_TRITON_SERVER_VERSION=compat TRITON_SERVER_CPU_ONLY=1 BACKENDS="onnx libtorch" \
       TEST_SYSTEM_SHARED_MEMORY=0 TEST_CUDA_SHARED_MEMORY=0 TEST_VALGRIND=0 TEST_JETSON=0 \
       SERVER_TIMEOUT=${SERVER_TIMEOUT:-120} TRITONSERVER_IPADDR=localhost SERVER_IPADDR=localhost \
       CUDA_VISIBLE_DEVICES=""
# Triton's tests compare the reported version with $TRITON_SERVER_VERSION
if [ -z "${TRITON_SERVER_VERSION:-}" ]; then
  mkdir -p "$COMPAT_DIR/empty_repo"
  "$NEREID" --model-repository="$COMPAT_DIR/empty_repo" --http-address=127.0.0.1 >"$OUT/probe.log" 2>&1 &
  ppid=$!
  for _ in $(seq 1 30); do
    TRITON_SERVER_VERSION=$(curl -s localhost:8000/v2 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])' 2>/dev/null) && break
    sleep 1
  done
  kill "$ppid" 2>/dev/null; wait "$ppid" 2>/dev/null
fi
export TRITON_SERVER_VERSION

stop_leftovers() {  # servers of this run still alive after a step: by pid
  local p
  for p in $(pgrep -f "^$NEREID" 2>/dev/null); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "COMPAT_SUITE=$COMPAT_SUITE" && kill -9 "$p" 2>/dev/null
  done
}

# What a step's set-up needs that this machine lacks: "reason: model[, model]"
step_needs() {
  /usr/bin/python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
needs = []
def add(why, models):
    for m in models:
        if (why, m) not in needs:
            needs.append((why, m))
add("needs OpenVINO", re.findall(r"qa_model_repository/(openvino_\w+?)(?:/|\b)", t.replace("${i}", "openvino") if re.search(r"for i in [^;\n]*openvino", t) else t))
add("needs TensorRT", re.findall(r"qa_model_repository/(plan_\w+?)(?:/|\b)", t.replace("${i}", "plan") if re.search(r"for i in [^;\n]*plan", t) else t))
for m in re.findall(r"for i in ([^;\n]*)", t):
    for b in m.split():
        if b == "openvino": add("needs OpenVINO", ["openvino_float32_float32_float32"])
        if b == "plan": add("needs TensorRT", ["plan_float32_float32_float32"])
# Python-backend models (../python_models, retry_model) are not here: the
# server has a Python backend of its own (build/backends/python)
if "custom_sequence_int32" in t:
    add("needs Triton's C++ sequence test backend", ["custom_sequence_int32"])
if "KIND_GPU" in t or "gpu-limit" in t:
    add("needs a GPU", ["KIND_GPU / --model-load-gpu-limit"])
out = {}
for why, m in needs:
    out.setdefault(why, []).append(m)
print("; ".join("%s: %s" % (w, ", ".join(ms)) for w, ms in out.items()))
PY
}

# Failing python tests of a step whose errors name no model outside the
# needs set -> prints "ok" when the failures are all attributable.
failures_attributable() {  # results.jsonl needs-string
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, re, sys
res, needs = sys.argv[1], sys.argv[2]
env = set(re.findall(r"[\w]+", needs))
bad, gpu, n = [], 0, 0
try:
    for line in open(res):
        r = json.loads(line)
        if r.get("kind") != "test" or r.get("outcome") in ("passed", "skipped"):
            continue
        d = r.get("detail") or ""
        n += 1
        # a subtest of a KIND_GPU instance group (test id or its error)
        if "KIND_GPU" in (r.get("test") or "") + d:
            gpu += 1
            continue
        named = set(re.findall(r"'(\w+_(?:float32|int32)\w*|identity_fp32|retry_model|custom_\w+)'", d))
        # an error that names only models outside the needs set is the server's
        if named and not any(m in env or m.startswith(("plan_", "openvino_", "simple_plan", "simple_openvino"))
                             for m in named):
            bad.append(r.get("test"))
except FileNotFoundError:
    pass
if n and gpu == n:
    print("gpu")
else:
    print("ok" if not bad else "no: " + ", ".join(map(str, bad)))
PY
}

first_failure() {  # the first line that says why a step failed
  local dir=$1
  /usr/bin/python3 - "$dir" <<'PY'
import json, os, re, sys
d = sys.argv[1]
try:
    for line in open(os.path.join(d, "results.jsonl")):
        r = json.loads(line)
        if r.get("kind") == "test" and r.get("outcome") not in ("passed", "skipped"):
            det = [l for l in (r.get("detail") or "").splitlines() if l.strip()]
            print("%s: %s" % (r.get("test"), det[-1][:200] if det else r.get("outcome")))
            sys.exit()
except FileNotFoundError:
    pass
lines = open(os.path.join(d, "step.out"), errors="replace").read().splitlines()
for i, l in enumerate(lines):
    if l.startswith("*** ") and "Test Passed" not in l and l.strip() != "***":
        print(l[4:][:200])
        sys.exit()
print("exit status %s" % open(os.path.join(d, "rc")).read().strip())
PY
}

echo "[lifecycle_steps] $NEREID, version '${TRITON_SERVER_VERSION}', logs $OUT"
cd "$LC" || exit 2
declare -A count=()
t_all=$(date +%s)
for num in "${sel[@]}"; do
  name=$(awk -v n="$num" '$1 == n { print $2 }' "$SPLIT/names")
  sdir="$OUT/${num}_$name"; mkdir -p "$sdir"
  script="$LC/lifecycle_step_$num.sh"
  {
    cat "$SPLIT/header.sh"
    prevn=$(printf %02d $((10#$num - 1)))
    # a step that re-uses the previous step's models: that step's set-up first
    if [ -f "$SPLIT/$prevn.sh" ] && ! awk '/^ *SERVER_ARGS=/ { exit } /^ *rm -(fr|rf) models/ { found = 1 } END { exit !found }' "$SPLIT/$num.sh"; then
      if awk '/^ *SERVER_ARGS=/ { exit } /^ *rm -(fr|rf) models/ { found = 1 } END { exit !found }' "$SPLIT/$prevn.sh"; then
        echo "# --- set-up of step $prevn (this step re-uses its models)"
        awk '/^SERVER_ARGS=/ { exit } { print }' "$SPLIT/$prevn.sh"
        echo "# --- step $num"
      fi
    fi
    cat "$SPLIT/$num.sh" "$SPLIT/footer.sh"
  } > "$script"
  cp "$script" "$sdir/step.sh"
  needs=$(step_needs "$script")
  lenient=${LENIENT:-1}
  # steps whose server is meant to fail to start (Triton's exit-on-error
  # default), and steps that give either flag themselves (the test reads the
  # readiness the other flag's default gives): Triton's flags as they are
  grep -q 'should fail to start\|unexpected start\|--exit-on-error\|--strict-readiness' "$SPLIT/$num.sh" && lenient=0
  export COMPAT_LENIENT=$lenient COMPAT_PHASE="step$num" COMPAT_RESULTS="$sdir/results.jsonl"
  rm -f ./*.log "$COMPAT_DIR/server-adaptations.log"
  t0=$(date +%s)
  timeout -k 30 "$STEP_TIMEOUT" bash "$script" compat > "$sdir/step.out" 2>&1
  rc=$?
  t1=$(date +%s)
  echo "$rc" > "$sdir/rc"
  stop_leftovers
  cp ./*.log ./*.txt "$COMPAT_DIR/server-adaptations.log" "$sdir/" 2>/dev/null
  rm -f "$script"
  if [ "$rc" = 0 ] && grep -q '^\*\*\* Test Passed$' "$sdir/step.out"; then
    verdict="passed"
  elif [ -n "$needs" ] && [ "$(failures_attributable "$sdir/results.jsonl" "$needs")" = ok ]; then
    verdict="skipped ($needs) -- first failure: $(first_failure "$sdir")"
  elif [ "$(failures_attributable "$sdir/results.jsonl" "${needs:-none}")" = gpu ]; then
    verdict="skipped (needs a GPU: every failing subtest is a KIND_GPU instance group) -- first failure: $(first_failure "$sdir")"
  else
    verdict="failed ($(first_failure "$sdir"))"
  fi
  count[${verdict%% *}]=$(( ${count[${verdict%% *}]:-0} + 1 ))
  printf '%s %-60s %s [%ss]\n' "$num" "$name" "$verdict" "$((t1 - t0))" | tee -a "$OUT/steps.txt"
done
stop_leftovers
summary="passed ${count[passed]:-0}, failed ${count[failed]:-0}, skipped ${count[skipped]:-0} of ${#sel[@]} steps in $(( $(date +%s) - t_all )) s"
echo "$summary" | tee -a "$OUT/steps.txt"
[ "${count[failed]:-0}" = 0 ]
