#!/usr/bin/python3
"""Where a Python model's request spends its time, phase by phase, beside
the C identity's.

    bench/bench_python_phases.py [BUILD_DIR] [--sizes 1,65536] [--window-ms N]
                                 [--backend-directory DIR] [--server-arg FLAG]...

Starts BUILD_DIR/nereid (default build) with Triton's request tracing on
(--trace-config level=TIMESTAMPS, rate=1) and two models, the C identity
backend and a model.py identity, and runs one nereid-perf window (1
connection, binary tensors) per model and size. The worker is the build's
nereid_stub package (or DIR's, with --backend-directory), copied to a
scratch backend directory with timestamps added where it receives a message
and where it sends one (CLOCK_MONOTONIC, the clock of the server's trace),
so one request's timeline joins the server's and the worker's:

  cycle                  HTTP_RECV_START to the next request's
  client                 HTTP_SEND_END to the next HTTP_RECV_START (the
                         client's turn: reply read, next request written)
  http recv              HTTP_RECV_START to HTTP_RECV_END (the body)
  recv end -> compute    HTTP_RECV_END to COMPUTE_START
  compute input          COMPUTE_START to COMPUTE_INPUT_END (Python: the
                         EXECUTE built and sent)
  input end -> output    COMPUTE_INPUT_END to COMPUTE_OUTPUT_START (Python:
                         waiting for DONE)
  http send              HTTP_SEND_START to HTTP_SEND_END
  worker: compute start -> EXECUTE received
  worker: EXECUTE received -> DONE sent     (its turn)
  worker: DONE sent -> it blocks again      (the rest of its loop)
  worker: DONE sent -> server has it        (COMPUTE_OUTPUT_START)

Medians, 10th and 90th percentiles over the window (its first tenth
dropped). Tracing costs a few µs per request itself: compare phases, not
totals with untraced runs.
"""
import bisect
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_python as bp  # noqa: E402

K_RECV, K_SEND, K_BLOCK = 1, 2, 3

def patch_stub(pkg, out_dir):
    """Adds the timestamps to the stub's package at pkg (a copy): the list
    in nereid_stub/__init__.py, the sends and receives in channel.py, the
    dump at finalize in host.py."""
    files = {}

    def once(name, anchor, new):
        path = os.path.join(pkg, name)
        s = files.get(path)
        if s is None:
            with open(path) as f:
                s = f.read()
        if s.count(anchor) != 1:
            raise SystemExit(f"{path}: cannot place a timestamp at {anchor.strip()!r}")
        files[path] = s.replace(anchor, new)

    ph = "nereid_stub._PHASES.append"
    once("channel.py", "    def sendmsg(self, *args):\n",
         f"    def sendmsg(self, *args):\n        {ph}(({K_SEND}, time.monotonic_ns()))\n")
    once("channel.py", "                data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE, "
         "socket.MSG_DONTWAIT)\n",
         "                data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE, "
         "socket.MSG_DONTWAIT)\n"
         f"                {ph}(({K_RECV}, time.monotonic_ns()))\n")
    once("channel.py",
         "        data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)\n        self.last_wait",
         f"        {ph}(({K_BLOCK}, time.monotonic_ns()))\n"
         "        data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)\n"
         f"        {ph}(({K_RECV}, time.monotonic_ns()))\n        self.last_wait")
    once("channel.py", "            data, anc, _, _ = self.sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)\n",
         f"            {ph}(({K_BLOCK}, time.monotonic_ns()))\n"
         "            data, anc, _, _ = self.sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)\n"
         f"            {ph}(({K_RECV}, time.monotonic_ns()))\n")
    once("host.py", "    def handle_finalize(self):\n",
         "    def handle_finalize(self):\n"
         f"        with open(os.path.join({out_dir!r}, f'w-{{os.getpid()}}.txt'), 'w') as f:\n"
         "            f.write('\\n'.join(f'{k} {t}' for k, t in nereid_stub._PHASES))\n")
    once("__init__.py", "\nFAST_PATH = True\n", "\nFAST_PATH = True\n_PHASES = []\n")
    for path, s in files.items():
        with open(path, "w") as f:
            f.write(s)


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q))]


def main(argv):
    build, sizes, window, bdir, extra = "build", (1, 65536), 1000, None, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--sizes":
            sizes = tuple(int(x) for x in args.pop(0).split(","))
        elif a == "--window-ms":
            window = int(args.pop(0))
        elif a == "--backend-directory":
            bdir = args.pop(0)
        elif a == "--server-arg":
            extra.append(args.pop(0))
        else:
            build = a
    build = os.path.abspath(build)
    tmp = tempfile.mkdtemp(prefix="bench-phases-")
    try:
        backends = os.path.join(tmp, "backends")
        shutil.copytree(bdir or os.path.join(build, "backends"), backends, symlinks=True)
        patch_stub(os.path.join(backends, "python", "nereid_stub"), tmp)
        repo = os.path.join(tmp, "models")
        bp.write_model(repo, "identity_py", bp.config("identity_py", "python"), bp.IDENTITY_PY)
        bp.write_model(repo, "identity_c", bp.config("identity_c", "identity"))
        trace = os.path.join(tmp, "trace.json")
        s = bp.Server(build, repo, [f"--backend-directory={backends}",
                                    "--trace-config", f"triton,file={trace}",
                                    "--trace-config", "level=TIMESTAMPS",
                                    "--trace-config", "rate=1", *extra])
        print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
        windows = []
        try:
            for n in sizes:
                for m in ("identity_c", "identity_py"):
                    p50 = s.perf(m, n, window_ms=window)[0]
                    windows.append((m, n, p50))
        finally:
            s.stop()
        report(trace, glob.glob(os.path.join(tmp, "w-*.txt")), windows)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(trace, worker_files, windows):
    ents = {}
    with open(trace) as f:
        for e in json.load(f):
            d = ents.setdefault(e["id"], {})
            if "model_name" in e:
                d["model"] = e["model_name"]
            for t in e.get("timestamps", []):
                d[t["name"]] = t["ns"]
    w = []
    for path in worker_files:
        with open(path) as f:
            w += [tuple(map(int, line.split())) for line in f if line.strip()]
    w.sort(key=lambda x: x[1])
    wt = [x[1] for x in w]
    reqs = sorted((d for d in ents.values() if "HTTP_SEND_END" in d and "COMPUTE_START" in d),
                  key=lambda d: d["HTTP_RECV_START"])
    for model, n, p50 in windows:
        # the traces of this window: this model's, in the window's order
        mine = [d for d in reqs if d.get("model") == model]
        groups, cur = [], []
        for d in mine:
            if cur and d["HTTP_RECV_START"] - cur[-1]["HTTP_RECV_START"] > 200e6:
                groups.append(cur)
                cur = []
            cur.append(d)
        if cur:
            groups.append(cur)
        g = groups[[x[1] for x in windows if x[0] == model].index(n)]
        g = g[len(g) // 10:]
        seg = {}

        def add(k, ns):
            seg.setdefault(k, []).append(ns / 1000)

        for a, b in zip(g, g[1:]):
            add("cycle", b["HTTP_RECV_START"] - a["HTTP_RECV_START"])
            add("client", b["HTTP_RECV_START"] - a["HTTP_SEND_END"])
        for d in g:
            add("http recv", d["HTTP_RECV_END"] - d["HTTP_RECV_START"])
            add("recv end -> compute", d["COMPUTE_START"] - d["HTTP_RECV_END"])
            add("compute input", d["COMPUTE_INPUT_END"] - d["COMPUTE_START"])
            add("input end -> output", d["COMPUTE_OUTPUT_START"] - d["COMPUTE_INPUT_END"])
            add("http send", d["HTTP_SEND_END"] - d["HTTP_SEND_START"])
            if model != "identity_py":
                continue
            # the worker's last DONE sent before the server had it, and the
            # receive before that
            k = bisect.bisect_left(wt, d["COMPUTE_OUTPUT_START"]) - 1
            while k >= 0 and w[k][0] != K_SEND:
                k -= 1
            i = k - 1
            while i >= 0 and w[i][0] != K_RECV:
                i -= 1
            if k < 0 or i < 0 or w[i][1] < d["COMPUTE_START"] - 50000:
                continue
            add("worker: compute start -> EXECUTE received", w[i][1] - d["COMPUTE_START"])
            add("worker: EXECUTE received -> DONE sent", w[k][1] - w[i][1])
            add("worker: DONE sent -> server has it", d["COMPUTE_OUTPUT_START"] - w[k][1])
            if k + 1 < len(w) and w[k + 1][0] == K_BLOCK:
                add("worker: DONE sent -> blocks again", w[k + 1][1] - w[k][1])
        print(f"{model} FP32[{n}]: nereid-perf p50 {p50:.0f} us, {len(g)} traces; per request (us):")
        for k, v in seg.items():
            print(f"  {k:42s} p50 {statistics.median(v):7.1f}  p10 {pct(v, 0.1):7.1f}  "
                  f"p90 {pct(v, 0.9):7.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
