"""Request cancellation from the frontends (Triton's): an HTTP client that
closes its connection, a gRPC client that cancels its call or its stream.
A request queued when its client goes is completed as CANCELLED without
executing (the model's execution count says so); one executing on a backend
that asks (the testing backend's stop_on_cancel) stops and counts as a
cancelled response. Every wait is on a file or a statistic, with a deadline
only against hangs."""
import json
import os
import queue
import socket
import time

import grpc
import numpy as np
import pytest
import requests

from grpc_util import infer_request, stubs
from http_helpers import pending_requests

pb, pbg, _, _ = stubs()

SLOW = """backend: "testing" max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture
def server(nereid_server, tmp_path):
    repo = tmp_path / "models"
    os.makedirs(repo / "slow" / "1")
    (repo / "slow" / "config.pbtxt").write_text(SLOW)
    return nereid_server(str(repo))


def wait_for(cond, what):
    deadline = time.time() + 60
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.01)


def stats(s):
    r = requests.get(f"{s.http_url}/v2/models/slow/stats", timeout=10)
    return r.json()["model_stats"][0]


def executions(s):
    return stats(s)["execution_count"]


def cancelled_responses(s):
    return stats(s)["response_stats"].get("0", {}).get("cancel", {}).get("count", 0)


def canceled_failures(s):
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    key = 'nv_inference_request_failure{model="slow",reason="CANCELED",version="1"}'
    for line in text.splitlines():
        if line.startswith(key):
            return int(float(line.split()[-1]))
    return None


def params(tmp_path, tag):
    """Execution waits for a file nobody creates, marks its start, and stops
    when cancelled."""
    return {"wait_for_file": str(tmp_path / "never"), "started_file": str(tmp_path / tag),
            "stop_on_cancel": "true"}


def http_infer_socket(s, parameters=None):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    if parameters:
        body["parameters"] = parameters
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", s.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_http_close_cancels(server, tmp_path):
    s = server
    # A executes (waits, stop_on_cancel); B queues behind it.
    a = http_infer_socket(s, params(tmp_path, "a"))
    wait_for(lambda: os.path.exists(tmp_path / "a"), "A did not start")
    b = http_infer_socket(s)
    wait_for(lambda: pending_requests(s, "slow") == 1, "B was not queued")
    # Both clients go, B first: the close watcher sees them in that order.
    b.close()
    a.close()
    wait_for(lambda: cancelled_responses(s) == 1, "A was not stopped by its cancellation")
    # Failures with reason CANCELED: A (its backend answered CANCELLED) and B.
    wait_for(lambda: canceled_failures(s) == 2, "B was not cancelled")
    assert pending_requests(s, "slow") == 0
    assert executions(s) == 1  # B never executed
    r = requests.post(f"{s.http_url}/v2/models/slow/infer", timeout=30, json={
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]})
    assert r.status_code == 200, r.text
    assert executions(s) == 2


def slow_request(i, parameters=None):
    req = infer_request(pb, "slow", [("INPUT0", "FP32", [2], np.full(2, i, np.float32))],
                        id=f"r{i}")
    for k, v in (parameters or {}).items():
        req.parameters[k].string_param = v
    return req


def test_grpc_cancel_stops_executing_call(server, tmp_path):
    s = server
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(slow_request(1, params(tmp_path, "u")), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "u"), "the call did not start")
        fut.cancel()
        with pytest.raises(grpc.FutureCancelledError):
            fut.result()
        wait_for(lambda: cancelled_responses(s) == 1, "the call's inference was not cancelled")
        assert executions(s) == 1
        out = stub.ModelInfer(slow_request(2), timeout=30)
        assert out.id == "r2"


def test_grpc_stream_cancel_cancels_queued(server, tmp_path):
    s = server
    q = queue.Queue()

    def reqs():
        yield slow_request(1, params(tmp_path, "s"))
        yield slow_request(2)
        q.get()  # keep the stream open until cancelled

    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        call = stub.ModelStreamInfer(reqs(), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "s"), "the first request did not start")
        wait_for(lambda: pending_requests(s, "slow") == 1, "the second was not queued")
        call.cancel()
        q.put(None)
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
        wait_for(lambda: cancelled_responses(s) == 1, "the executing request was not stopped")
        wait_for(lambda: canceled_failures(s) == 2, "the queued request was not cancelled")
        assert executions(s) == 1
        out = stub.ModelInfer(slow_request(3), timeout=30)
        assert out.id == "r3"
