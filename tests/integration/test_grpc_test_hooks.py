"""Triton's gRPC-frontend test hooks and the handler log lines its QA counts
(qa/L0_request_cancellation): TRITONSERVER_DELAY_GRPC_* and
TRITONSERVER_DELAY_RESPONSE_* each log Triton's INFO text where Triton's
ModelInferHandler sleeps; at --log-verbose=2 the server writes "New request
handler for ModelInferHandler" (one per completion queue at start, one per
arrival), exactly one "Cancellation notification received for ..." per
cancelled call or stream and one "StateRelease" per released call (per
stream: the state that waited for the next request). Every wait is on the
log or a file, with a deadline only against hangs."""
import os
import queue
import time

import grpc
import numpy as np
import pytest

from grpc_util import infer_request, stubs

pb, pbg, _, _ = stubs()

SLOW = """backend: "testing" max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

HOOKS = ["TRITONSERVER_DELAY_GRPC_PROCESS", "TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY",
         "TRITONSERVER_DELAY_GRPC_NOTIFICATION", "TRITONSERVER_DELAY_GRPC_ENQUEUE",
         "TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC", "TRITONSERVER_DELAY_RESPONSE_COMPLETION"]

NEW_HANDLER = "New request handler for ModelInferHandler"
CANCEL_LINE = "Cancellation notification received for "


@pytest.fixture
def start(nereid_server, tmp_path, monkeypatch):
    repo = tmp_path / "models"
    os.makedirs(repo / "slow" / "1")
    (repo / "slow" / "config.pbtxt").write_text(SLOW)
    for k in HOOKS:
        monkeypatch.delenv(k, raising=False)

    def run(env=None, verbose=2):
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        return nereid_server(str(repo), f"--log-verbose={verbose}", "--grpc-infer-thread-count=2")
    return run


def wait_for(cond, what):
    deadline = time.time() + 60
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.02)


def request(i, tmp_path=None, tag=None):
    req = infer_request(pb, "slow", [("INPUT0", "FP32", [2], np.full(2, i, np.float32))],
                        id=f"r{i}")
    if tag:  # execution waits for a file nobody creates and stops when cancelled
        for k, v in {"wait_for_file": str(tmp_path / "never"),
                     "started_file": str(tmp_path / tag), "stop_on_cancel": "true"}.items():
            req.parameters[k].string_param = v
    return req


def test_handler_lines_count_one_cancellation(start, tmp_path):
    s = start()
    assert s.output().count(NEW_HANDLER) == 2  # one per completion queue, as Triton's 2 handlers
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(request(1, tmp_path, "u"), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "u"), "the call did not start")
        assert s.output().count(NEW_HANDLER) == 3  # the arrival posted its replacement
        fut.cancel()
        wait_for(lambda: "StateRelease" in s.output(), "the cancelled call was not released")
        out = s.output()
        assert out.count(CANCEL_LINE + "ModelInferHandler") == 1, out
        assert out.count("StateRelease") == 1, out
        assert "Step CANCELLED" in out
        assert stub.ModelInfer(request(2), timeout=30).id == "r2"
        wait_for(lambda: s.output().count("StateRelease") == 2, "the second call was not released")
        assert s.output().count(CANCEL_LINE) == 1


def test_stream_cancellation_line(start, tmp_path):
    s = start()
    q = queue.Queue()

    def reqs():
        yield request(1, tmp_path, "s")
        q.get()  # keep the stream open until cancelled

    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        call = stub.ModelStreamInfer(reqs(), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "s"), "the request did not start")
        call.cancel()
        q.put(None)
        wait_for(lambda: CANCEL_LINE in s.output() and "StateRelease" in s.output(),
                 "the stream's cancellation was not handled")
        out = s.output()
        assert out.count(CANCEL_LINE + "ModelStreamInferHandler") == 1, out
        assert out.count("StateRelease") == 1, out


def test_lines_need_their_verbose_level(start, tmp_path):
    s = start(verbose=1)
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(request(1, tmp_path, "u"), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "u"), "the call did not start")
        fut.cancel()
        wait_for(lambda: CANCEL_LINE in s.output(), "no cancellation line at level 1")
        assert stub.ModelInfer(request(2), timeout=30).id == "r2"
    assert "StateRelease" not in s.output()  # level 2 only


def test_delays_log_triton_texts(start):
    s = start({"TRITONSERVER_DELAY_GRPC_PROCESS": "50",
               "TRITONSERVER_DELAY_GRPC_PROCESS_ENTRY": "40",
               "TRITONSERVER_DELAY_RESPONSE_COMPLETE_EXEC": "30",
               "TRITONSERVER_DELAY_RESPONSE_COMPLETION": "20",
               "TRITONSERVER_DELAY_GRPC_ENQUEUE": "10"})
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ModelInfer(request(1), timeout=30).id == "r1"
    wait_for(lambda: "StateRelease" in s.output(), "the call was not released")
    out = s.output()
    assert "Delaying the Process execution by 50 ms..." in out
    assert "Delaying the entry to Process thread by 40 ms..." in out
    assert "Delaying InferResponseComplete execution by 30 ms..." in out
    assert "Delaying InferResponseComplete by 20 ms..." in out
    assert "Delaying PutTaskBackToQueue" not in out  # the call was not cancelled


def test_cancelled_call_takes_the_enqueue_delay(start, tmp_path):
    s = start({"TRITONSERVER_DELAY_GRPC_ENQUEUE": "10",
               "TRITONSERVER_DELAY_GRPC_NOTIFICATION": "20",
               "TRITONSERVER_DELAY_RESPONSE_COMPLETION": "30"})
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        fut = stub.ModelInfer.future(request(1, tmp_path, "u"), timeout=60)
        wait_for(lambda: os.path.exists(tmp_path / "u"), "the call did not start")
        fut.cancel()
        wait_for(lambda: "StateRelease" in s.output(), "the cancelled call was not released")
    out = s.output()
    assert "Delaying the entry to Process for notification thread by 20 ms..." in out
    assert "Delaying PutTaskBackToQueue by 10 ms..." in out
    assert "Delaying InferResponseComplete by 30 ms..." not in out


def test_unparsable_delay_is_an_error_and_zero(start):
    s = start({"TRITONSERVER_DELAY_GRPC_PROCESS": "soon"})
    assert ("Unable to parse the debug variable TRITONSERVER_DELAY_GRPC_PROCESS. Value "
            "provided: 'soon' is not a valid integer.") in s.output()
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ModelInfer(request(1), timeout=30).id == "r1"
    assert "Delaying the Process execution" not in s.output()
