"""Measures what the nginx recipe costs, with build/nereid-perf: one Nereid
replica directly, then nginx (deploy/nginx/nereid.conf, one worker, as
tests/integration/test_scale_nginx.py runs it) in front of the same single
replica, then nginx in front of three replicas. Prints nereid-perf's output
and writes its CSVs next to the log.

    NEREID_BUILD=build /usr/bin/python3 deploy/nginx/measure.py [OUTDIR] [nereid-perf args...]

Default load: identity_fp32 (16 floats), HTTP binary, concurrency 1:8:... ."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "integration"))

from conftest import BUILD, EXAMPLES, Server  # noqa: E402
from test_scale_nginx import Nginx, _open  # noqa: E402

PERF = os.path.join(BUILD, "nereid-perf")
DEFAULT = ["-m", "identity_fp32", "--shape", "INPUT0:16", "--concurrency-range", "1:8:3",
           "-p", "4000"]


def wait_grpc(replica):
    while not _open(replica.grpc_port):
        pass


def run(label, url, stats, out, args, protocol):
    csv = os.path.join(out, label + ".csv")
    cmd = [PERF, "-i", protocol, "-u", url, "-f", csv, *args]
    for s in stats:
        cmd += ["--stats-url", s.http_url if protocol == "http" else s.grpc_addr]
    print(f"### {label}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="nereid-measure-")
    args = sys.argv[2:] or DEFAULT
    protocol = args[args.index("-i") + 1] if "-i" in args else "http"
    if "-i" in args:
        i = args.index("-i")
        args = args[:i] + args[i + 2:]
    os.makedirs(out, exist_ok=True)
    replicas = [Server(EXAMPLES, ()) for _ in range(3)]
    try:
        for r in replicas:
            wait_grpc(r)
        one = replicas[0]
        front = lambda p: p.http_url if protocol == "http" else p.grpc_addr  # noqa: E731
        run("direct-1", front(one), [one], out, args, protocol)
        proxy = Nginx(os.path.join(out, "nginx-1"), [one, one, one])
        try:
            run("nginx-1", front(proxy), [one], out, args, protocol)
        finally:
            proxy.stop()
        proxy = Nginx(os.path.join(out, "nginx-3"), replicas)
        try:
            run("nginx-3", front(proxy), replicas, out, args, protocol)
        finally:
            proxy.stop()
    finally:
        for r in replicas:
            r.stop()
    print(f"CSVs in {out}")


if __name__ == "__main__":
    main()
