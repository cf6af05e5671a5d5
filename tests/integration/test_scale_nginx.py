"""deploy/nginx/nereid.conf for real: three Nereid replicas on loopback behind
Debian's nginx (started unprivileged in a temporary prefix). Every request of
a sequence that carries the Nereid-Sequence-Id header (gRPC metadata
nereid-sequence-id) reaches one replica, so every running sum is exact and
each sequence shows up in exactly one replica's statistics; stateless
traffic spreads over all replicas; a killed replica's new sequences move to
the others and its broken sequences fail with a clear error."""
import concurrent.futures
import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import BUILD, EXAMPLES, ROOT, Server, free_port
from grpc_util import infer_request, stubs

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = pytest.mark.skipif(
    NGINX is None, reason="nginx is not installed (scripts/setup.sh installs Debian's nginx)")

pb, pbg, _, _ = stubs()
CONF = os.path.join(ROOT, "deploy", "nginx", "nereid.conf")
SEQ_MODEL = "accumulator_direct"


def render(replicas, http_port, grpc_port):
    """deploy/nginx/nereid.conf with the replicas' and the proxy's ports."""
    with open(CONF) as f:
        text = f.read()
    for i, r in enumerate(replicas):
        text = text.replace(f"server 10.0.0.1{i + 1}:8000", f"server 127.0.0.1:{r.http_port}")
        text = text.replace(f"server 10.0.0.1{i + 1}:8001", f"server 127.0.0.1:{r.grpc_port}")
    assert "10.0.0." not in text, "the recipe lists more replicas than the test starts"
    text = text.replace("listen 8000;", f"listen 127.0.0.1:{http_port};")
    text = text.replace("listen 8001 http2;", f"listen 127.0.0.1:{grpc_port} http2;")
    return text


class Nginx:
    def __init__(self, prefix, replicas, edit=lambda text: text):
        self.http_port, self.grpc_port = free_port(), free_port()
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.grpc_addr = f"127.0.0.1:{self.grpc_port}"
        os.makedirs(os.path.join(prefix, "logs"), exist_ok=True)
        with open(os.path.join(prefix, "nereid.conf"), "w") as f:
            f.write(edit(render(replicas, self.http_port, self.grpc_port)))
        temp = "\n".join(f"  {k}_temp_path {prefix}/{k}_temp;"
                         for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        main = (("user root;\n" if os.geteuid() == 0 else "")
                + f"worker_processes 1;\nerror_log {prefix}/logs/error.log warn;\n"
                + f"pid {prefix}/nginx.pid;\nevents {{ worker_connections 1024; }}\n"
                + f"http {{\n  access_log {prefix}/logs/access.log;\n{temp}\n"
                + f"  include {prefix}/nereid.conf;\n}}\n")
        self.conf = os.path.join(prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(main)
        self.prefix = prefix
        check = subprocess.run([NGINX, "-t", "-p", prefix, "-c", self.conf],
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen([NGINX, "-p", prefix, "-c", self.conf, "-g", "daemon off;"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        while not all(_open(p) for p in (self.http_port, self.grpc_port)):
            assert self.proc.poll() is None, self.proc.stderr.read().decode()
            assert time.time() < deadline, "nginx did not start"
            time.sleep(0.02)

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _open(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def cluster(tmp_path):
    # The examples, with the accumulator's sequences kept for a minute when
    # idle (the default is 1 s): on a loaded machine (a sanitizer run) the
    # first of test_replica_killed_mid_run's sequences waited longer than
    # that for its END, was released and answered "must specify the START
    # flag" on the replica that still held it.
    repo = str(tmp_path / "models")
    shutil.copytree(EXAMPLES, repo)
    cfg = os.path.join(repo, SEQ_MODEL, "config.pbtxt")
    with open(cfg) as f:
        text = f.read()
    assert "sequence_batching {" in text and "max_sequence_idle" not in text
    with open(cfg, "w") as f:
        f.write(text.replace("sequence_batching {",
                             "sequence_batching {\n  max_sequence_idle_microseconds: 60000000", 1))
    replicas = [Server(repo, ()) for _ in range(3)]
    for r in replicas:  # the gRPC port opens a moment after the HTTP one
        deadline = time.time() + 30
        while not _open(r.grpc_port):
            assert time.time() < deadline, r.output()
            time.sleep(0.02)
    proxy = Nginx(str(tmp_path / "nginx"), replicas)
    yield replicas, proxy
    proxy.stop()
    for r in replicas:
        killed = r.proc.poll() is not None  # test_replica_killed_mid_run's victim
        rc = r.stop()
        assert killed or rc == 0, f"nereid exited with {rc}:\n{r.output()}"


def success_count(replica, model):
    r = requests.get(f"{replica.http_url}/v2/models/{model}/stats", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["model_stats"][0]["inference_stats"]["success"]["count"]


def counts(replicas, model):
    return [success_count(r, model) for r in replicas]


def http_step(proxy, seq_id, value, start, end):
    h = {"Nereid-Sequence-Id": str(seq_id)}
    if start:
        h["Nereid-Sequence-Start"] = "true"
    if end:
        h["Nereid-Sequence-End"] = "true"
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
    r = requests.post(f"{proxy.http_url}/v2/models/{SEQ_MODEL}/infer", json=body, headers=h,
                      timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["Nereid-Sequence-Id"] == str(seq_id)
    return r.json()["outputs"][0]["data"][0]


def grpc_step(stub, seq_id, value, start, end):
    md = [("nereid-sequence-id", str(seq_id))]
    if start:
        md.append(("nereid-sequence-start", "true"))
    if end:
        md.append(("nereid-sequence-end", "true"))
    req = infer_request(pb, SEQ_MODEL, [("INPUT", "INT32", [1, 1], np.array([value], np.int32))])
    resp, call = stub.ModelInfer.with_call(req, metadata=md, timeout=60)
    assert dict(call.initial_metadata())["nereid-sequence-id"] == str(seq_id)
    return int(np.frombuffer(resp.raw_output_contents[0], np.int32)[0])


def run_sequence(step, seq_id, n_steps=4):
    total, sums = 0, []
    for k in range(n_steps):
        v = seq_id % 1000 + k
        total += v
        sums.append((step(seq_id, v, k == 0, k == n_steps - 1), total))
    return sums


def test_each_sequence_stays_on_one_replica(cluster):
    replicas, proxy = cluster
    with grpc.insecure_channel(proxy.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        steps = {"http": lambda *a: http_step(proxy, *a), "grpc": lambda *a: grpc_step(stub, *a)}
        used = set()
        for proto, base in (("http", 5000), ("grpc", 6000)):
            for s in range(8):
                before = counts(replicas, SEQ_MODEL)
                for got, want in run_sequence(steps[proto], base + s):
                    assert got == want, (proto, base + s)
                delta = [a - b for a, b in zip(counts(replicas, SEQ_MODEL), before)]
                # all 4 requests of the sequence on exactly one replica
                assert sorted(delta) == [0, 0, 4], (proto, base + s, delta)
                used.add(delta.index(4))
        assert len(used) >= 2, "16 sequence ids all hashed to one replica"


def test_concurrent_sequences_exact(cluster):
    replicas, proxy = cluster
    with grpc.insecure_channel(proxy.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        jobs = [(lambda *a: http_step(proxy, *a), 7000 + s) for s in range(25)]
        jobs += [(lambda *a: grpc_step(stub, *a), 8000 + s) for s in range(25)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda j: (j[1], run_sequence(j[0], j[1], 5)), jobs))
    for seq_id, sums in results:
        assert [g for g, _ in sums] == [w for _, w in sums], seq_id
    assert sum(counts(replicas, SEQ_MODEL)) == 50 * 5


def add_sub_http(proxy):
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16}]}
    r = requests.post(f"{proxy.http_url}/v2/models/add_sub/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert "Nereid-Sequence-Id" not in r.headers
    return r.json()


def test_stateless_traffic_spreads(cluster):
    replicas, proxy = cluster
    for _ in range(30):
        add_sub_http(proxy)
    with grpc.insecure_channel(proxy.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        x = np.ones((1, 16), np.float32)
        for _ in range(30):
            req = infer_request(pb, "add_sub", [("INPUT0", "FP32", [1, 16], x),
                                                ("INPUT1", "FP32", [1, 16], x)])
            stub.ModelInfer(req, timeout=60)
    got = counts(replicas, "add_sub")
    assert sum(got) == 60
    assert all(c > 0 for c in got), got
    # health through the proxy
    assert requests.get(f"{proxy.http_url}/v2/health/ready", timeout=10).status_code == 200


def test_replica_killed_mid_run(cluster):
    replicas, proxy = cluster
    # open 12 sequences (2 steps each) and note where each one lives
    where = {}
    for s in range(12):
        before = counts(replicas, SEQ_MODEL)
        assert http_step(proxy, 9000 + s, 1, True, False) == 1
        assert http_step(proxy, 9000 + s, 2, False, False) == 3
        delta = [a - b for a, b in zip(counts(replicas, SEQ_MODEL), before)]
        where[9000 + s] = delta.index(2)
    victim = max(set(where.values()), key=list(where.values()).count)
    replicas[victim].proc.kill()
    replicas[victim].proc.wait()
    for seq_id, rep in where.items():
        h = {"Nereid-Sequence-Id": str(seq_id), "Nereid-Sequence-End": "true"}
        body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1],
                            "data": [4]}]}
        r = requests.post(f"{proxy.http_url}/v2/models/{SEQ_MODEL}/infer", json=body,
                          headers=h, timeout=60)
        if rep == victim:
            # moved to another replica that never saw its START: a clear error
            assert r.status_code == 400, r.text
            assert re.search(r"must specify the START flag", r.json()["error"]), r.text
        else:
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"][0] == 7
    # new sequences all complete on the survivors, over HTTP and gRPC
    with grpc.insecure_channel(proxy.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        steps = (lambda *a: http_step(proxy, *a), lambda *a: grpc_step(stub, *a))
        for s in range(24):
            for got, want in run_sequence(steps[s % 2], 9500 + s, 3):
                assert got == want, 9500 + s
        # and stateless requests too (retried past the dead replica)
        for _ in range(12):
            add_sub_http(proxy)



def restart(replica):
    """A rolling restart's step: SIGTERM (in-flight requests drain, new ones
    get 503, then the connections close), then the same command line again
    on the same ports."""
    replica.proc.send_signal(signal.SIGTERM)
    assert replica.proc.wait(timeout=60) == 0, replica.output()
    replica.proc = subprocess.Popen(replica.proc.args, stdout=replica.log,
                                    stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while not (_open(replica.http_port) and _open(replica.grpc_port)):
        assert replica.proc.poll() is None, replica.output()
        assert time.time() < deadline, "the restarted replica did not open its ports"
        time.sleep(0.02)


def test_rolling_restart_fails_no_stateless_request(cluster, tmp_path):
    """Plain HTTP traffic keeps flowing while every replica restarts in turn,
    each stopped while it is serving: a request that meets the stopping
    replica (503 while it drains, a refused connection, or a keep-alive
    connection closed under it) is replayed on another replica by
    proxy_next_upstream, so the clients see no error. fail_timeout is cut
    to 1 s so a restarted replica is back in rotation quickly."""
    replicas, _ = cluster
    proxy = Nginx(str(tmp_path / "nginx-restart"), replicas,
                  lambda text: text.replace("fail_timeout=10s", "fail_timeout=1s"))
    stop = False
    ok, errors = [0], []
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16}]}

    def client():
        with requests.Session() as s:
            while not stop:
                r = s.post(f"{proxy.http_url}/v2/models/add_sub/infer", json=body, timeout=60)
                if r.status_code == 200 and r.json()["outputs"][0]["data"] == [3.0] * 16:
                    ok[0] += 1
                else:
                    errors.append(f"HTTP {r.status_code}: {r.text}")

    def served(replica):
        try:
            return success_count(replica, "add_sub")
        except (requests.ConnectionError, AssertionError):
            return 0

    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            clients = [pool.submit(client) for _ in range(4)]
            try:
                def wait_serving(replica):  # in rotation (its count restarts at 0)
                    deadline = time.time() + 60
                    while served(replica) < 20 and not errors:
                        assert time.time() < deadline, "a replica got no traffic"
                        time.sleep(0.01)

                for r in replicas:
                    wait_serving(r)
                for victim in replicas:  # the next one only once this one is back
                    restart(victim)
                    wait_serving(victim)
            finally:
                stop = True
                for c in clients:
                    c.result()
    finally:
        proxy.stop()
    assert errors == [], errors[:5]
    assert ok[0] >= 80


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_tool_sequences_through_nginx(cluster, tmp_path, protocol):
    """build/nereid-perf drives the accumulator through nginx with the
    sequence in headers: every request of its sequences is accepted (each
    sequence stays on the replica holding it), and the three replicas'
    statistics together count exactly the requests sent."""
    replicas, proxy = cluster
    out = tmp_path / "perf.csv"
    front = proxy.http_url if protocol == "http" else proxy.grpc_addr
    stats = [r.http_url if protocol == "http" else r.grpc_addr for r in replicas]
    cmd = [os.path.join(BUILD, "nereid-perf"), "-i", protocol, "-u", front, "-m", SEQ_MODEL,
           "--sequence-header", "--sequence-length", "5", "--concurrency-range", "4",
           "--measurement-mode", "count_windows", "--measurement-request-count", "40",
           "-f", str(out)]
    for s in stats:
        cmd += ["--stats-url", s]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        row = next(csv.DictReader(f))
    n = int(row["Client Requests"])
    assert row["Client Failures"] == "0" and n >= 40 and n % 5 == 0, row
    assert row["Server Requests"] == row["Client Requests"]
