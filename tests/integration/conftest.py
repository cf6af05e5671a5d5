"""Shared fixtures: start the real build/nereid binary on free loopback ports.

`nereid_server(repo, *args)` starts a server on the given model repository and
returns a handle with .http_url, .grpc_addr, .metrics_url and .proc; every
server is stopped (SIGINT) at the end of the test and must exit cleanly.
"""
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("NEREID_BUILD", "build"))
NEREID = os.path.join(BUILD, "nereid")
EXAMPLES = os.path.join(ROOT, "examples", "models")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    def __init__(self, repo, args, wait_port="http"):
        # A port free_port() found may be taken by someone else's connection
        # before the server binds it: then start again on other ports.
        for attempt in range(3):
            try:
                self._start(repo, args, wait_port)
                return
            except RuntimeError:
                if attempt == 2 or "Address already in use" not in self.output():
                    raise
                self.log.close()

    def _start(self, repo, args, wait_port):
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_addr = f"127.0.0.1:{self.grpc_port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}"
        repos = repo if isinstance(repo, (list, tuple)) else [repo]
        cmd = [NEREID] + [f"--model-repository={r}" for r in repos] + [
            f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}", "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1"] + list(args)
        self.log_path = os.path.join(BUILD, f"server-{self.http_port}.log")
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        port = {"http": self.http_port, "grpc": self.grpc_port}.get(wait_port)
        deadline = time.time() + 60
        # "nereid ready" follows the start of every frontend: an open port
        # alone may be someone else's listener.
        while port is not None and not ("nereid ready" in self.output() and _port_open(port)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nereid exited with {self.proc.returncode}:\n{self.output()}")
            if time.time() > deadline:
                raise RuntimeError(f"nereid did not start:\n{self.output()}")
            time.sleep(0.02)

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("nereid did not stop on SIGINT")
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def nereid_server():
    servers = []

    def start(repo=EXAMPLES, *args, wait_port="http"):
        s = Server(repo, args, wait_port)
        servers.append(s)
        return s

    yield start
    for s in servers:
        rc = s.stop()
        assert rc == 0, f"nereid exited with {rc}:\n{s.output()}"


@pytest.fixture
def model_repo(tmp_path):
    """A scratch repository; copy example models into it with .add(name)."""
    class Repo:
        path = str(tmp_path / "models")

        def add(self, name, config=None, src=EXAMPLES):
            dst = os.path.join(self.path, name)
            shutil.copytree(os.path.join(src, name), dst)
            if config is not None:
                with open(os.path.join(dst, "config.pbtxt"), "w") as f:
                    f.write(config)
            return dst

    os.makedirs(Repo.path)
    return Repo()
