#!/usr/bin/python3
"""spin-wait-us settings side by side, at 1 and at 4 connections, in one run.

    bench/bench_python_spin.py [BUILD_DIR] [--rounds N] [--window-ms MS] [US]...

Starts one BUILD_DIR/nereid (default build) per setting US (default: 0 100
200; "default" starts it without --backend-config), each serving a Python
identity model and the C identity backend, and alternates nereid-perf
windows between them (FP32[1], HTTP binary tensors): per round the C
identity at 1 connection (in the first server), then for each setting the
Python identity at 1 and at 4 connections. Prints per setting the median
p50 at 1 connection and its difference from the C identity, the median
throughput at 4 connections, and the CPU the server and its workers spent
per request at each (from /proc), with every round's figure: on a shared
machine the rounds show how much of a difference is noise.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_python as bp  # noqa: E402


def main(argv):
    build, rounds, window_ms, settings = "build", 4, 700, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--rounds":
            rounds = int(args.pop(0))
        elif a == "--window-ms":
            window_ms = int(args.pop(0))
        elif a == "default" or a.isdigit():
            settings.append(a)
        else:
            build = a
    settings = settings or ["0", "100", "200"]
    build = os.path.join(bp.ROOT, build)
    tmp = tempfile.mkdtemp(prefix="nereid-bench-spin-")
    servers = []
    try:
        for us in settings:
            repo = os.path.join(tmp, f"spin-{us}", "models")
            bp.write_model(repo, "identity_py", bp.config("identity_py", "python"), bp.IDENTITY_PY)
            bp.write_model(repo, "identity_c", bp.config("identity_c", "identity"))
            flags = [] if us == "default" else [f"--backend-config=python,spin-wait-us={us}"]
            servers.append((us, bp.Server(build, repo, flags)))
        for _, s in servers:  # first requests: worker start, allocations
            s.perf("identity_py", 1, 1, 300)
            s.perf("identity_c", 1, 1, 300)
        with open("/proc/loadavg") as f:
            print(f"load average {f.read().split()[0]}, {rounds} rounds of {window_ms} ms",
                  flush=True)
        c, one, four = [], {us: [] for us in settings}, {us: [] for us in settings}
        for _ in range(rounds):
            c.append(servers[0][1].perf("identity_c", 1, 1, window_ms))
            for us, s in servers:
                one[us].append(s.perf("identity_py", 1, 1, window_ms))
                four[us].append(s.perf("identity_py", 1, 4, window_ms))
        c50 = bp.med(x[0] for x in c)
        print(f"C identity, 1 connection: p50 {c50:.0f} us (rounds {[x[0] for x in c]})")
        for us in settings:
            p50 = bp.med(x[0] for x in one[us])
            print(f"spin-wait-us={us}: 1 connection p50 {p50:.0f} us (+{p50 - c50:.0f} over C), "
                  f"CPU/request {bp.med(x[2] for x in one[us]):.0f} us | 4 connections "
                  f"{bp.med(x[1] for x in four[us]):.0f} infer/s, CPU/request "
                  f"{bp.med(x[2] for x in four[us]):.0f} us | rounds p50 "
                  f"{[x[0] for x in one[us]]}, infer/s {[round(x[1]) for x in four[us]]}",
                  flush=True)
    finally:
        for _, s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
