"""Request timeouts in every queue, through the real binary (issue 39's
example): a request with `"parameters": {"timeout": 200000}` queued behind
an execution that does not end fails with Triton's timed-out error (HTTP
503 / gRPC UNAVAILABLE "Request timeout expired") while that execution
still runs, never executes, and counts in
nv_inference_request_failure{reason="REJECTED"}; on the default scheduler
and on a Python model. A gRPC unary call whose client deadline passes
while its request is queued (Triton #7532): the deadline is the request's
timeout, so the request fails at it (reason REJECTED); a call the client
cancels has its request cancelled: it never executes and counts with
reason CANCELED.

The blocking execution ends when the test creates a file; outcomes are
asserted, never durations (a deadline only guards against hangs)."""
import os
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from grpc_util import infer_request, stubs
from http_helpers import pending_requests
from test_python_backend import write

pb, pbg, _, _ = stubs()

SLOW = """backend: "testing" max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

PY_CONFIG = """
backend: "python"
max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters [ { key: "dir" value: { string_value: "%s" } } ]
"""

# IN 1 blocks: marks its start ("started"), waits for "release" (60 s at
# most); any other value answers at once.
PY_BLOCKING = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.dir = cfg["parameters"]["dir"]["string_value"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x[0] == 1:
                open(os.path.join(self.dir, "started"), "w").close()
                end = time.time() + 60
                while not os.path.exists(os.path.join(self.dir, "release")) and time.time() < end:
                    time.sleep(0.01)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
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


def executions(s, model):
    r = requests.get(f"{s.http_url}/v2/models/{model}/stats", timeout=10)
    return r.json()["model_stats"][0]["execution_count"]


def failures(s, model, reason):
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    key = f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}}'
    for line in text.splitlines():
        if line.startswith(key):
            return int(float(line.split()[-1]))
    return 0


def blocking_params(tmp_path):
    """The testing backend's execution waits for a file (10 s at most) and
    marks its start."""
    return {"wait_for_file": str(tmp_path / "release"), "started_file": str(tmp_path / "started")}


def http_body(values, parameters=None, name="INPUT0", shape=None):
    body = {"inputs": [{"name": name, "datatype": "FP32", "shape": shape or [len(values)],
                        "data": values}]}
    if parameters:
        body["parameters"] = parameters
    return body


class Background:
    """One request run on a thread; .result is its response."""

    def __init__(self, fn):
        self.result = None
        self.thread = threading.Thread(target=self._run, args=(fn,))
        self.thread.start()

    def _run(self, fn):
        self.result = fn()

    def running(self):
        return self.thread.is_alive()

    def join(self):
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result


def http_post(s, model, body):
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def test_http_timeout_in_default_queue(server, tmp_path):
    s = server
    a = Background(lambda: http_post(s, "slow", http_body([1, 2], blocking_params(tmp_path))))
    wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
    r = http_post(s, "slow", http_body([3, 4], {"timeout": 200000}))
    assert r.status_code == 503, r.text
    assert r.json() == {"error": "Request timeout expired"}
    assert a.running(), "the timed-out request answered only once A was done"
    (tmp_path / "release").write_text("")
    assert a.join().status_code == 200
    assert failures(s, "slow", "REJECTED") == 1
    assert executions(s, "slow") == 1  # the timed-out request never ran
    # A timeout with time left changes nothing.
    r = http_post(s, "slow", http_body([5, 6], {"timeout": 60000000}))
    assert r.status_code == 200, r.text


def slow_request(i, parameters=None, timeout_us=None):
    req = infer_request(pb, "slow", [("INPUT0", "FP32", [2], np.full(2, i, np.float32))],
                        id=f"r{i}")
    for k, v in (parameters or {}).items():
        req.parameters[k].string_param = v
    if timeout_us is not None:
        req.parameters["timeout"].int64_param = timeout_us
    return req


def test_grpc_timeout_in_default_queue(server, tmp_path):
    s = server
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(slow_request(1, blocking_params(tmp_path)), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(slow_request(2, timeout_us=200000), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == "Request timeout expired"
        assert not fut.done(), "the timed-out request answered only once A was done"
        (tmp_path / "release").write_text("")
        assert fut.result().id == "r1"
        assert failures(s, "slow", "REJECTED") == 1
        assert executions(s, "slow") == 1


def test_grpc_deadline_is_the_request_timeout(server, tmp_path):
    """Triton #7532: a sync client that gave up leaves its request queued.
    Here the call's deadline is the request's timeout, as the "timeout"
    parameter: the queued request fails at the deadline while A still
    executes (A is released only after that), never executes, and counts
    with reason REJECTED, not CANCELED."""
    s = server
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(slow_request(1, blocking_params(tmp_path)), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
        call = stub.ModelInfer.future(slow_request(2), timeout=1)
        with pytest.raises(grpc.RpcError) as e:
            call.result()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server's timer takes it out of the queue, A still running.
        wait_for(lambda: failures(s, "slow", "REJECTED") == 1, "the queued call did not time out")
        assert pending_requests(s, "slow") == 0
        assert not fut.done()
        (tmp_path / "release").write_text("")
        assert fut.result().id == "r1"
        assert failures(s, "slow", "CANCELED") == 0
        assert executions(s, "slow") == 1
        # A deadline with time left changes nothing; nor does a later one
        # with an earlier timeout parameter (that one wins).
        assert stub.ModelInfer(slow_request(3), timeout=30).id == "r3"


def test_grpc_deadline_with_earlier_timeout_parameter(server, tmp_path):
    s = server
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(slow_request(1, blocking_params(tmp_path)), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(slow_request(2, timeout_us=200000), timeout=60)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == "Request timeout expired"
        assert not fut.done()
        (tmp_path / "release").write_text("")
        assert fut.result().id == "r1"


def test_grpc_cancel_removes_queued_unary_call(server, tmp_path):
    """A unary call the client cancels while its request is queued: the
    request never executes and counts with reason CANCELED. It leaves the
    queue when the instance looks at it: A is not released but ends at the
    testing backend's 10 s bound, which leaves the cancellation (heard by
    the server a moment after the client cancels) seconds to arrive."""
    s = server
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        a_params = {"wait_for_file": str(tmp_path / "never"), "started_file": str(tmp_path / "started")}
        fut = stub.ModelInfer.future(slow_request(1, a_params), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
        call = stub.ModelInfer.future(slow_request(2), timeout=60)
        wait_for(lambda: pending_requests(s, "slow") == 1, "B was not queued")
        call.cancel()
        assert fut.result().id == "r1"
        wait_for(lambda: failures(s, "slow", "CANCELED") == 1, "the queued call was not cancelled")
        assert failures(s, "slow", "REJECTED") == 0
        assert executions(s, "slow") == 1
        assert stub.ModelInfer(slow_request(3), timeout=30).id == "r3"


def test_python_model_timeout(nereid_server, tmp_path):
    repo = tmp_path / "models"
    write(str(repo), "py", PY_CONFIG % tmp_path, PY_BLOCKING)
    s = nereid_server(str(repo))

    def body(v, parameters=None):
        return http_body([v], parameters, name="IN", shape=[1])

    a = Background(lambda: http_post(s, "py", body(1)))
    wait_for(lambda: os.path.exists(tmp_path / "started"), "A did not start")
    r = http_post(s, "py", body(2, {"timeout": 200000}))
    assert r.status_code == 503, r.text
    assert r.json() == {"error": "Request timeout expired"}
    assert a.running()
    (tmp_path / "release").write_text("")
    assert a.join().status_code == 200
    assert failures(s, "py", "REJECTED") == 1
    assert executions(s, "py") == 1
