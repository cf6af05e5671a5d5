"""HTTP connection limits: many idle keep-alive connections do not stop new
ones from being served, --http-max-connections closes the longest-idle
connection for a new one (or refuses the new one when every connection is
busy), and --http-idle-timeout-secs closes idle connections but never one
whose inference is still running. Raw sockets over loopback."""
import resource
import socket
import time

import requests

from conftest import EXAMPLES
from http_helpers import read_head

SLOW = """name: "slow"
backend: "testing"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters [ { key: "execute_delay_ms" value: { string_value: "2500" } } ]
"""

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def connect(srv, timeout=30):
    s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=timeout)
    return s


def closed_by_peer(s):
    """True when the server closes s (reads end-of-stream or a reset)."""
    try:
        while True:
            if not s.recv(4096):
                return True
    except ConnectionResetError:
        return True


def test_many_idle_connections_do_not_block_new_ones(nereid_server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    srv = nereid_server(EXAMPLES)
    idle = []
    try:
        for _ in range(1100):
            idle.append(connect(srv))
        # Every idle connection is really accepted: a request on the first
        # and on the last one opened is answered.
        for s in (idle[0], idle[-1]):
            s.sendall(LIVE)
            assert read_head(s).startswith(b"HTTP/1.1 200")
        s = connect(srv)
        s.sendall(LIVE)
        assert read_head(s).startswith(b"HTTP/1.1 200")
        s.close()
        assert requests.get(f"{srv.http_url}/v2/health/ready", timeout=30).status_code == 200
    finally:
        for s in idle:
            s.close()


def test_at_the_limit_the_longest_idle_connection_is_closed(nereid_server):
    srv = nereid_server(EXAMPLES, "--http-max-connections=3")
    old = [connect(srv) for _ in range(3)]
    # The second and third have served a request since: the first is the
    # longest idle.
    for s in old[1:]:
        s.sendall(LIVE)
        assert read_head(s).startswith(b"HTTP/1.1 200")
    new = connect(srv)
    new.sendall(LIVE)
    assert read_head(new).startswith(b"HTTP/1.1 200")
    assert closed_by_peer(old[0])
    for s in old[1:]:  # still open and served
        s.sendall(LIVE)
        assert read_head(s).startswith(b"HTTP/1.1 200")
    for s in old + [new]:
        s.close()


def test_at_the_limit_with_every_connection_busy_the_new_one_is_refused(nereid_server):
    srv = nereid_server(EXAMPLES, "--http-max-connections=2")
    busy = []
    for _ in range(2):
        # A request in progress: MHD answers "100 Continue" only once the
        # handler has taken the headers, so both are busy after this. The
        # fixture's readiness probe may still hold a slot until the server
        # has seen it close (a loaded machine): a connection refused for it
        # is set up again; only `new` below must be refused.
        for _ in range(100):
            s = connect(srv)
            try:
                s.sendall(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\n"
                          b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
                head = read_head(s)
            except (BrokenPipeError, ConnectionResetError):
                head = b""
            if head:
                break
            s.close()
            time.sleep(0.05)
        assert head.startswith(b"HTTP/1.1 100")
        busy.append(s)
    new = connect(srv)
    assert closed_by_peer(new)
    new.close()
    for s in busy:  # finishing the requests works
        s.sendall(b"{}")
        assert read_head(s).startswith(b"HTTP/1.1 200")
        s.close()
    # Once the server has seen those requests end (or the sockets close), a
    # new connection is served again.
    for _ in range(200):
        s = connect(srv)
        try:
            s.sendall(LIVE)
            reply = read_head(s)
        except (BrokenPipeError, ConnectionResetError):
            reply = b""
        s.close()
        if reply:
            break
        time.sleep(0.05)
    assert reply.startswith(b"HTTP/1.1 200")


def test_idle_connection_closed_after_timeout(nereid_server):
    srv = nereid_server(EXAMPLES, "--http-idle-timeout-secs=1")
    fresh = connect(srv)  # never sends anything
    used = connect(srv)  # keep-alive after one request
    used.sendall(LIVE)
    assert read_head(used).startswith(b"HTTP/1.1 200")
    assert closed_by_peer(fresh)
    assert closed_by_peer(used)


def test_idle_timeout_spares_running_inference(nereid_server, model_repo):
    import os
    d = os.path.join(model_repo.path, "slow")
    os.makedirs(os.path.join(d, "1"))
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(SLOW)
    srv = nereid_server(model_repo.path, "--http-idle-timeout-secs=1")
    r = requests.post(f"{srv.http_url}/v2/models/slow/infer", timeout=60, json={
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [3]}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [3]


def test_connection_flags_in_help_and_validated(nereid_server):
    import subprocess
    from conftest import NEREID
    out = subprocess.run([NEREID, "--help"], capture_output=True, text=True).stdout
    assert "--http-max-connections" in out and "--http-idle-timeout-secs" in out
    r = subprocess.run([NEREID, f"--model-repository={EXAMPLES}", "--http-max-connections=0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--http-max-connections" in r.stderr
