#!/usr/bin/python3
"""Identity FP32[1] over HTTP against libmicrohttpd's echo floor, for one or
more Nereid builds, interleaved (an A/B on a shared machine).

    bench/bench_http_ab.py ROUNDS SECONDS NAME=BUILD_DIR [NAME=BUILD_DIR ...]

Each round starts, one after another, the echo floor (`bench_http --echo`
from the first build: a libmicrohttpd daemon with the HTTP frontend's flags
and 2 threads that sends a POST body back) and `nereid` from each build
(--http-thread-count=2, the bench_identity model of bench_http), and runs
wrk on each with bench_http's binary identity request: 1 connection (p50)
and 32 connections (req/s). The server's CPU per request at 32 connections
(user + system, from /proc/PID/stat; wrk is not counted) is the figure
least moved by other load. Ports 26100 and up. Needs wrk.
"""
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

PORT0 = 26100
TCK = os.sysconf("SC_CLK_TCK")
MODEL = ('name: "bench_identity"\nbackend: "identity"\nmax_batch_size: 8\n'
         'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
         'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
HEADER = ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,1],'
          '"parameters":{"binary_data_size":4}}],"parameters":{"binary_data_output":true}}')


def setup(tmp):
    os.makedirs(os.path.join(tmp, "models", "bench_identity", "1"))
    with open(os.path.join(tmp, "models", "bench_identity", "config.pbtxt"), "w") as f:
        f.write(MODEL)
    body = os.path.join(tmp, "identity.bin")
    with open(body, "wb") as f:
        f.write(HEADER.encode() + struct.pack("<f", 0.0))
    lua = os.path.join(tmp, "identity.lua")
    with open(lua, "w") as f:
        f.write(f'local f = assert(io.open("{body}", "rb"))\nwrk.method = "POST"\n'
                'wrk.body = f:read("*a")\nf:close()\n'
                f'wrk.headers["Inference-Header-Content-Length"] = "{len(HEADER)}"\n'
                'wrk.headers["Content-Type"] = "application/octet-stream"\n')
    return os.path.join(tmp, "models"), lua


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


def wrk(port, lua, conns, seconds, pid):
    c0 = cpu_seconds(pid)
    out = subprocess.run(["wrk", f"-t{2 if conns > 1 else 1}", f"-c{conns}", f"-d{seconds}s",
                          "--latency", "-s", lua,
                          f"http://127.0.0.1:{port}/v2/models/bench_identity/infer"],
                         capture_output=True, text=True, check=True).stdout
    c1 = cpu_seconds(pid)
    if "Non-2xx" in out or "Socket errors" in out:
        sys.exit(f"wrk saw errors on port {port}:\n{out}")
    m = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\b", out, re.M)
    p50 = float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    n = int(re.search(r"(\d+) requests in", out).group(1))
    return p50, rps, (c1 - c0) * 1e6 / n


def start(cmd, port, ready_path):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{ready_path}", timeout=1)
            return p
        except urllib.error.HTTPError:
            return p  # the echo answers every path
        except OSError:
            time.sleep(0.1)
    p.kill()
    sys.exit(f"{cmd[0]} did not start")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, seconds = int(sys.argv[1]), int(sys.argv[2])
    builds = [a.split("=", 1) for a in sys.argv[3:]]
    echo_bin = os.path.join(builds[0][1], "bench", "bench_http")
    with tempfile.TemporaryDirectory() as tmp:
        repo, lua = setup(tmp)
        runs = {"echo": []} | {name: [] for name, _ in builds}
        for r in range(rounds):
            for i, (name, build) in enumerate([("echo", None)] + builds):
                port = PORT0 + 10 * i
                if build is None:
                    p = start([echo_bin, "--echo", str(port)], port, "/")
                else:
                    p = start([os.path.join(build, "nereid"), f"--model-repository={repo}",
                               f"--backend-directory={os.path.join(build, 'backends')}",
                               f"--http-port={port}", f"--grpc-port={port + 1}",
                               f"--metrics-port={port + 2}", "--http-thread-count=2"],
                              port, "/v2/models/bench_identity/ready")
                try:
                    wrk(port, lua, 32, 1, p.pid)  # warm-up
                    p50, _, _ = wrk(port, lua, 1, seconds, p.pid)
                    _, rps, cpu = wrk(port, lua, 32, seconds, p.pid)
                finally:
                    p.terminate()
                    p.wait()
                runs[name].append((p50, rps, cpu))
                print(f"round {r + 1} {name:8} p50 c=1 {p50:6.1f} us  c=32 {rps:8.0f} req/s  "
                      f"CPU/req {cpu:5.1f} us  (load {os.getloadavg()[0]:.1f})", flush=True)
        print("\nmedians over rounds (ratios per round, against that round's echo):")
        echo = runs["echo"]
        for name, rs in runs.items():
            line = (f"{name:8} p50 c=1 {statistics.median(x[0] for x in rs):6.1f} us  "
                    f"CPU/req {statistics.median(x[2] for x in rs):5.1f} us")
            if name != "echo":
                line += (f"  p50 - echo {statistics.median(x[0] - e[0] for x, e in zip(rs, echo)):+5.1f}"
                         f" us  req/s / echo {statistics.median(x[1] / e[1] for x, e in zip(rs, echo)):.2f}"
                         f"  CPU / echo {statistics.median(x[2] / e[2] for x, e in zip(rs, echo)):.2f}")
            print(line)


main()
