#!/usr/bin/python3
"""CPU per request of a Python model against the C identity, for one or
more builds side by side (A/B interleaved in one run).

    bench/bench_python_cpu.py [BUILD_DIR]... [--rounds N] [--window-ms MS]
                              [--sizes 1,65536] [--server-arg FLAG]... [--floor] [--default]
                              [--bls]

Starts one BUILD_DIR/nereid (default build) per build dir, each serving the
C identity backend and a Python identity (model.py), with
--backend-config=python,spin-wait-us=0 unless a --server-arg names
spin-wait-us or --default is given (each build's own default then). Each
round runs a nereid-perf window (1 connection, HTTP binary tensors) on every build's C
identity, then on every build's Python identity, for each size. Per window
it reads from /proc the CPU time (user + system) of the server process and
of its workers, and their voluntary context switches, and divides by the
requests the model counted. Printed per build and size: medians over the
rounds of CPU per request (server, worker, total) for C and Python, the
ratio Python / C, context switches per request and p50, with every round's
total. CPU per request is steadier than latency on a shared machine.
--floor adds a server of the first build whose Python model runs on
bench/python_floor_worker.c (no Python at all: bench_python_floor.py), the
process boundary's own cost.
--bls compares, instead, a model.py that calls an ONNX identity by BLS
(bench_python.py's bls_py) with the ensemble of a Python identity step and
the same ONNX identity (ens_py_onnx), in place of the C and Python
identities; each line then also gives the median over the rounds of the
per-round p50 difference BLS - ensemble (issue 42's goal: <= +20 us).
Every line gives the median of the per-round p50 ratios second / first.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_python as bp  # noqa: E402


def proc_tree(root):
    """pids of root's descendants (root excluded)."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(p))
    out, todo = [], list(kids.get(root, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def task_sums(pid):
    """(CPU ns, voluntary + involuntary context switches) over pid's
    threads: schedstat's on-CPU time per thread (exact) and status's
    switch counts."""
    ns = switches = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0, 0
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                ns += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return ns, switches


def snapshot(server):
    """(server ns, server switches, workers ns, workers switches); the
    zygote counts as neither (it is idle while requests run)."""
    s_ns, s_sw = task_sums(server.proc.pid)
    w_ns = w_sw = 0
    for p in proc_tree(server.proc.pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"nereid_python_zygote" in f.read():
                    continue
        except OSError:
            continue
        ns, sw = task_sums(p)
        w_ns += ns
        w_sw += sw
    return s_ns, s_sw, w_ns, w_sw


def window(server, model, n, window_ms):
    """One nereid-perf window: (p50 us, server us/request, worker
    us/request, switches/request)."""
    c0, a = server.count(model), snapshot(server)
    p50, _, _ = server.perf(model, n, 1, window_ms)
    b, reqs = snapshot(server), max(server.count(model) - c0, 1)
    return (p50, (b[0] - a[0]) / 1e3 / reqs, (b[2] - a[2]) / 1e3 / reqs,
            (b[1] - a[1] + b[3] - a[3]) / reqs)


def main(argv):
    builds, rounds, window_ms, sizes, extra, floor, default = [], 5, 1000, (1,), [], False, False
    bls = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--window-ms":
            window_ms = int(args.pop(0))
        elif a == "--sizes":
            sizes = tuple(int(x) for x in args.pop(0).split(","))
        elif a == "--server-arg":
            extra.append(args.pop(0))
        elif a == "--floor":
            floor = True
        elif a == "--default":
            default = True
        elif a == "--bls":
            bls = True
        else:
            builds.append(a)
    builds = builds or ["build"]
    if not default and not any("spin-wait-us" in x for x in extra):
        extra.append("--backend-config=python,spin-wait-us=0")
    first, second = ("ens_py_onnx", "bls_py") if bls else ("identity_c", "identity_py")
    tmp = tempfile.mkdtemp(prefix="nereid-bench-cpu-")
    servers = []
    try:
        for i, b in enumerate(builds):
            repo = os.path.join(tmp, f"b{i}", "models")
            bp.write_model(repo, "identity_py", bp.config("identity_py", "python"), bp.IDENTITY_PY)
            bp.write_model(repo, "identity_c", bp.config("identity_c", "identity"))
            if bls:
                sys.path.insert(0, os.path.join(bp.ROOT, "scripts"))
                import make_models
                bp.write_model(repo, "ident_onnx", bp.config("ident_onnx", "onnxruntime_onnx"),
                               onnx=make_models.identity("FP32", (-1,)).SerializeToString())
                bp.write_model(repo, "bls_py", bp.config("bls_py", "python"), bp.BLS_PY)
                bp.write_model(repo, "ens_py_onnx", bp.ENSEMBLE)
            d = os.path.join(bp.ROOT, b)  # its own backends (and their worker scripts)
            servers.append((b, bp.Server(d, repo, extra + [
                f"--backend-directory={os.path.join(d, 'backends')}"])))
        if floor and not bls:
            import bench_python_floor
            repo = os.path.join(tmp, "floor", "models")
            bp.write_model(repo, "identity_py", bp.config("identity_py", "python"), bp.IDENTITY_PY)
            bp.write_model(repo, "identity_c", bp.config("identity_c", "identity"))
            os.environ["NEREID_PYTHON"] = bench_python_floor.build_worker(tmp)
            try:
                servers.append(("floor", bp.Server(os.path.join(bp.ROOT, builds[0]), repo,
                                                   extra + ["--backend-config=python,zygote=false"])))
            finally:
                del os.environ["NEREID_PYTHON"]
        for _, s in servers:  # first requests: worker start, allocations
            for n in sizes:
                s.perf(second, n, 1, 300)
                s.perf(first, n, 1, 300)
        with open("/proc/loadavg") as f:
            print(f"load average {f.read().split()[0]}, {rounds} rounds of {window_ms} ms, "
                  f"server flags {extra}", flush=True)
        res = {(b, m, n): [] for b, _ in servers for m in (first, second) for n in sizes}
        for _ in range(rounds):
            for n in sizes:
                for m in (first, second):
                    for b, s in servers:
                        res[(b, m, n)].append(window(s, m, n, window_ms))
        with open("/proc/loadavg") as f:
            print(f"load average after {f.read().split()[0]}")
        for n in sizes:
            for b, _ in servers:
                c, p = res[(b, first, n)], res[(b, second, n)]
                ratio = bp.med(y[0] / x[0] for x, y in zip(c, p))
                diff = bp.med(y[0] - x[0] for x, y in zip(c, p))
                what = (f"BLS - ensemble p50 {diff:+.0f} us (median of rounds), x{ratio:.2f}"
                        if bls else f"p50 Python / C x{ratio:.2f}, {diff:+.0f} us (medians of rounds)")
                print(f"{b} FP32[{n}]: {what}; p50 rounds {first} {[x[0] for x in c]}, "
                      f"{second} {[x[0] for x in p]}", flush=True)
                ct = bp.med(x[1] + x[2] for x in c)
                pt = bp.med(x[1] + x[2] for x in p)
                la, lb = ("ensemble", "BLS") if bls else ("C", "Python")
                print(f"{b} FP32[{n}]: CPU/request {la} {ct:.1f} us (server "
                      f"{bp.med(x[1] for x in c):.1f}), {lb} {pt:.1f} us (server "
                      f"{bp.med(x[1] for x in p):.1f}, worker {bp.med(x[2] for x in p):.1f}): "
                      f"x{pt / ct:.2f} | switches/request {la} {bp.med(x[3] for x in c):.2f}, "
                      f"{lb} {bp.med(x[3] for x in p):.2f} | p50 {la} {bp.med(x[0] for x in c):.0f}"
                      f", {lb} {bp.med(x[0] for x in p):.0f} us | rounds {la} "
                      f"{[round(x[1] + x[2], 1) for x in c]}, {lb} "
                      f"{[round(x[1] + x[2], 1) for x in p]}", flush=True)
    finally:
        for _, s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
