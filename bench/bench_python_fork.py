#!/usr/bin/python3
"""One Python zygote fed directly, without the server: what a fork costs.

    bench/bench_python_fork.py [BUILD_DIR] [--forks N]

Starts BUILD_DIR/backends/python/nereid_python_stub.py as a zygote on a
socket pair, asks it for one warm-up worker and then N more, sends each
worker the INIT of an identity model.py and waits for its READY, and prints
the zygote's CPU and page faults per fork and the workers' CPU and faults
(median) from /proc once each is ready. Run it with
NEREID_PYTHON_PREFAULT=0 in the environment to compare without
pre-faulting.
"""
import array
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HDR = struct.Struct("<IIQ")
M_INIT, M_READY = 1, 101
MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
'''


def stat(pid):
    """(minor faults, CPU seconds) of pid; the CPU from schedstat (ns: the
    ticks of /proc/<pid>/stat come in 10 ms steps)."""
    with open(f"/proc/{pid}/stat") as f:
        faults = int(f.read().rsplit(")", 1)[1].split()[7])
    with open(f"/proc/{pid}/schedstat") as f:
        return faults, int(f.read().split()[0]) / 1e9


class Zygote:
    def __init__(self, stub):
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd = theirs.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", stub, "nereid_python_zygote", " " * 255], close_fds=False,
            preexec_fn=lambda: os.dup2(fd, 3))
        theirs.close()

    def fork(self, name):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctl.sendmsg([name.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array.array("i", [theirs.fileno()]))])
        theirs.close()
        data, anc, _, _ = self.ctl.recvmsg(4, socket.CMSG_SPACE(4))
        for _, _, d in anc:
            os.close(array.array("i", d)[0])  # the pidfd
        return struct.unpack("<i", data)[0], mine

    def stop(self):
        self.ctl.close()
        self.proc.wait()


def init(sock, model_dir, name):
    cfg = {"name": "m", "backend": "python"}
    msg = json.dumps({
        "model_file": os.path.join(model_dir, "1", "model.py"), "instance": name,
        "decoupled": False, "auto_complete": False, "config": cfg,
        "model_dir": os.path.join(model_dir, "1"),
        "args": {"model_config": json.dumps(cfg), "model_instance_kind": "CPU",
                 "model_instance_name": name, "model_instance_device_id": "0",
                 "model_repository": model_dir, "model_version": "1", "model_name": "m"},
    }).encode()
    sock.sendmsg([HDR.pack(M_INIT, len(msg), 0), msg])
    reply = sock.recv(65536)
    if HDR.unpack_from(reply)[0] != M_READY or b"error" in reply:
        raise SystemExit(f"worker {name} did not start: {reply!r}")


def main(argv):
    build, forks = "build", 20
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--forks":
            forks = int(args.pop(0))
        else:
            build = a
    stub = os.path.join(ROOT, build, "backends", "python", "nereid_python_stub.py")
    tmp = tempfile.mkdtemp(prefix="nereid-bench-fork-")
    os.makedirs(os.path.join(tmp, "m", "1"))
    with open(os.path.join(tmp, "m", "1", "model.py"), "w") as f:
        f.write(MODEL)
    t0 = time.monotonic()
    z = Zygote(stub)
    socks = []
    try:
        pid, sock = z.fork("warm_0")
        init(sock, os.path.join(tmp, "m"), "warm_0")
        socks.append(sock)
        f0, c0 = stat(z.proc.pid)
        print(f"load average {os.getloadavg()[0]:.1f}; zygote started and forked one worker in "
              f"{time.monotonic() - t0:.2f} s ({c0:.2f} CPU s, {f0} faults)", flush=True)
        workers = []
        for i in range(forks):
            pid, sock = z.fork(f"m_{i}")
            init(sock, os.path.join(tmp, "m"), f"m_{i}")
            workers.append(stat(pid))
            socks.append(sock)
        f1, c1 = stat(z.proc.pid)
        print(f"zygote per fork: {(c1 - c0) * 1000 / forks:.1f} ms CPU, {(f1 - f0) / forks:.0f} "
              f"faults | worker to READY (median of {forks}): "
              f"{statistics.median(w[1] for w in workers) * 1000:.0f} ms CPU, "
              f"{statistics.median(w[0] for w in workers):.0f} faults", flush=True)
    finally:
        for s in socks:
            s.close()
        z.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
