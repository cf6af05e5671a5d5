#!/usr/bin/python3
"""Time to ready for N models from S3 (s3rver on loopback) against the same
N models from disk.

    bench/bench_storage.py [BUILD_DIR] [--models N] [--rounds R] [--pad-kib K]

Writes N copies of examples/models/add_sub_onnx (an ONNX Runtime model; with
--pad-kib each copy also carries a K KiB file in its version directory, as a
stand-in for weights), uploads them to a fresh s3rver bucket with the AWS
SDK (tools/storage-emulators), then starts BUILD_DIR/nereid (default build)
R times on each repository and prints the median wall time from the start
of the process to "nereid ready" (every model loaded), and for S3 the time
the mirror's download took (its verbose log line). Needs `make models` and
scripts/setup.sh's tools/storage-emulators.
"""
import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMU = os.path.join(ROOT, "tools", "storage-emulators")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc):
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("s3rver exited")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    sys.exit("s3rver did not start")


def time_to_ready(nereid, repo, env):
    ports = [free_port() for _ in range(3)]
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    t0 = time.monotonic()
    p = subprocess.Popen([nereid, f"--model-repository={repo}", f"--http-port={ports[0]}",
                          f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}",
                          "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          "--log-verbose=1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    while True:
        text = open(log.name).read()
        if "nereid ready" in text:
            ready = time.monotonic() - t0
            break
        if p.poll() is not None:
            sys.exit(f"nereid exited:\n{text[-3000:]}")
        time.sleep(0.005)
    p.terminate()
    p.wait()
    m = re.search(r"model\(s\) downloaded \((\d+) objects[^)]*\) in ([0-9.]+) ms", text)
    os.unlink(log.name)
    return ready, (float(m.group(2)) / 1000 if m else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pad-kib", type=int, default=0)
    a = ap.parse_args()
    nereid = os.path.join(a.build, "nereid")
    src = os.path.join(ROOT, "examples", "models", "add_sub_onnx")
    if not os.path.exists(os.path.join(src, "1", "model.onnx")):
        sys.exit("run `make models` first")
    work = tempfile.mkdtemp(prefix="bench-storage-")
    try:
        repo = os.path.join(work, "repo")
        config = open(os.path.join(src, "config.pbtxt")).read()
        pad = os.urandom(a.pad_kib * 1024) if a.pad_kib else None
        for i in range(a.models):
            d = os.path.join(repo, f"m{i:03d}")
            os.makedirs(os.path.join(d, "1"))
            shutil.copy(os.path.join(src, "1", "model.onnx"), os.path.join(d, "1"))
            with open(os.path.join(d, "config.pbtxt"), "w") as f:
                f.write(config.replace('name: "add_sub_onnx"', f'name: "m{i:03d}"'))
            if pad:
                with open(os.path.join(d, "1", "weights.bin"), "wb") as f:
                    f.write(pad)
        port = free_port()
        data = os.path.join(work, "s3")
        os.makedirs(data)
        s3 = subprocess.Popen([os.path.join(EMU, "node_modules", ".bin", "s3rver"), "--directory",
                               data, "--address", "127.0.0.1", "--port", str(port), "--silent"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, s3)
            client = ["node", os.path.join(EMU, "client.mjs"), "s3", f"http://127.0.0.1:{port}",
                      "S3RVER", "S3RVER"]
            cenv = dict(os.environ, NODE_NO_WARNINGS="1")
            subprocess.run(client + ["mkbucket", "models"], check=True, env=cenv)
            subprocess.run(client + ["put-dir", "models", "repo/", repo], check=True, env=cenv)
            env = dict(os.environ, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER")
            disk, remote, download = [], [], []
            for _ in range(a.rounds):  # alternate, so load drifts hit both alike
                disk.append(time_to_ready(nereid, repo, env)[0])
                r, d = time_to_ready(nereid, f"s3://127.0.0.1:{port}/models/repo", env)
                remote.append(r)
                download.append(d)
        finally:
            s3.terminate()
            s3.wait()
        files = 3 if pad else 2
        print(f"{a.models} models ({files} files each"
              f"{f', {a.pad_kib} KiB padding' if pad else ''}), median of {a.rounds} rounds:")
        print(f"  from disk: {statistics.median(disk) * 1000:8.0f} ms to ready")
        print(f"  from S3:   {statistics.median(remote) * 1000:8.0f} ms to ready "
              f"(download {statistics.median(download) * 1000:.0f} ms)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
