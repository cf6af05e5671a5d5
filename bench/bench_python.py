#!/usr/bin/python3
"""Python backend vs the C identity backend, over HTTP at 1 connection.

    bench/bench_python.py [BUILD_DIR]      (default build)

Writes a scratch repository with `identity_py` (a model.py that returns its
input) and `identity_c` (the C identity backend), starts BUILD_DIR/nereid on
free ports, and runs BUILD_DIR/nereid-perf against each model with FP32[1]
and FP32[65536] (binary tensors), printing nereid-perf's summary lines.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
'''


def config(name, backend):
    return (f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    build = os.path.join(ROOT, argv[0] if argv else "build")
    tmp = tempfile.mkdtemp(prefix="nereid-bench-python-")
    try:
        for name, backend in (("identity_py", "python"), ("identity_c", "identity")):
            os.makedirs(os.path.join(tmp, name, "1"))
            with open(os.path.join(tmp, name, "config.pbtxt"), "w") as f:
                f.write(config(name, backend))
        with open(os.path.join(tmp, "identity_py", "1", "model.py"), "w") as f:
            f.write(IDENTITY_PY)
        port = free_port()
        log = open(os.path.join(tmp, "server.log"), "w+")
        server = subprocess.Popen([os.path.join(build, "nereid"), f"--model-repository={tmp}",
                                   f"--http-port={port}", f"--grpc-port={free_port()}",
                                   f"--metrics-port={free_port()}"], stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while "nereid ready" not in open(log.name).read():
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("server did not start:\n" + open(log.name).read())
                time.sleep(0.05)
            for n in (1, 65536):
                for model in ("identity_c", "identity_py"):
                    out = subprocess.run(
                        [os.path.join(build, "nereid-perf"), "-m", model, "-u",
                         f"127.0.0.1:{port}", "--shape", f"INPUT0:{n}", "-p", "3000",
                         "--input-tensor-format", "binary", "--output-tensor-format", "binary"],
                        capture_output=True, text=True)
                    print(f"== {model} FP32[{n}]")
                    print("\n".join(l for l in out.stdout.splitlines()
                                    if "Throughput" in l or "latency" in l.lower()
                                    or "p50" in l or "Avg" in l))
                    if out.returncode:
                        print(out.stdout + out.stderr)
        finally:
            server.terminate()
            server.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
