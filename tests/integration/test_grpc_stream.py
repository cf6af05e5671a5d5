"""gRPC ModelStreamInfer: many requests in flight, errors as stream messages,
triton_grpc_error, half-close with work in flight, cancellation, churn."""
import os
import queue
import threading
import time

import grpc
import numpy as np
import pytest

from grpc_util import identity_repo, infer_request, stubs

pb, pbg, _, _ = stubs()


@pytest.fixture
def server(nereid_server, tmp_path):
    return nereid_server(identity_repo(str(tmp_path / "models")), wait_port="grpc")


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def fp32(model, i, id, n=3):
    return infer_request(pb, model, [("INPUT0", "FP32", [n], np.full(n, i, np.float32))], id=id)


def slow(ms, id, fail=False):
    req = fp32("slow", 1, id, n=1)
    req.parameters["delay_ms"].int64_param = ms
    if fail:
        req.parameters["fail"].string_param = "true"
    return req


def final_flag(resp):
    p = resp.infer_response.parameters.get("triton_final_response")
    return p is not None and p.bool_param


def test_100_interleaved_requests(stub):
    reqs = []
    for i in range(100):
        if i % 3 == 0:
            reqs.append(slow(30 - i % 7 * 4, f"r{i}"))
        elif i % 3 == 1:
            reqs.append(fp32("id_fp32", i, f"r{i}"))
        else:
            reqs.append(infer_request(pb, "id_int32", [("INPUT0", "INT32", [2],
                                                        np.full(2, i, np.int32))], id=f"r{i}"))
    responses = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
    assert len(responses) == 100
    by_id = {}
    for r in responses:
        assert r.error_message == ""
        assert final_flag(r)
        by_id[r.infer_response.id] = r.infer_response
    assert set(by_id) == {f"r{i}" for i in range(100)}
    for i in range(100):
        ir = by_id[f"r{i}"]
        if i % 3 == 1:
            assert ir.model_name == "id_fp32"
            assert np.all(np.frombuffer(ir.raw_output_contents[0], np.float32) == i)
        elif i % 3 == 2:
            assert ir.outputs[0].datatype == "INT32"
            assert np.all(np.frombuffer(ir.raw_output_contents[0], np.int32) == i)
        else:
            assert ir.model_name == "slow" and ir.model_version == "1"


def test_sequence_parameters_over_stream(stub):
    reqs = []
    for step in range(5):
        r = fp32("id_fp32", step, f"seq{step}")
        r.parameters["sequence_id"].int64_param = 77
        r.parameters["sequence_start"].bool_param = step == 0
        r.parameters["sequence_end"].bool_param = step == 4
        reqs.append(r)
    responses = list(stub.ModelStreamInfer(iter(reqs), timeout=30))
    assert sorted(r.infer_response.id for r in responses) == [f"seq{i}" for i in range(5)]
    assert all(r.error_message == "" for r in responses)


def test_errors_keep_stream_open(stub):
    bad_param = fp32("id_fp32", 1, "bad-param")
    bad_param.parameters["priority"].int64_param = -1
    reqs = [
        fp32("id_fp32", 1, "ok1"),
        fp32("nope", 1, "unknown-model"),
        bad_param,
        fp32("id_fp32", 1, "bad-shape", n=0),
        slow(5, "runtime-fail", fail=True),
        fp32("id_fp32", 2, "ok2"),
    ]
    reqs[3].raw_input_contents[0] = b"\x00" * 5
    responses = {r.infer_response.id: r for r in stub.ModelStreamInfer(iter(reqs), timeout=30)}
    assert set(responses) == {r.id for r in reqs}
    assert responses["ok1"].error_message == "" and responses["ok2"].error_message == ""
    assert responses["unknown-model"].error_message == (
        "Request for unknown model: 'nope' is not found")
    assert responses["bad-param"].error_message == (
        "invalid value for 'priority', expected value >= 0.")
    assert "byte size" in responses["bad-shape"].error_message
    fail = responses["runtime-fail"]
    assert fail.error_message == "testing backend: request failed"
    assert not fail.infer_response.outputs and not fail.infer_response.raw_output_contents
    assert fail.infer_response.model_name == "slow" and final_flag(fail)
    assert not final_flag(responses["unknown-model"])  # request-setup errors carry no flag


def test_malformed_message_on_stream(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        good = fp32("id_fp32", 4, "good").SerializeToString()
        out = list(call(iter([b"\xff\xff", good, b"\x0a\x09x"]), timeout=30))
        parsed = [pb.ModelStreamInferResponse.FromString(b) for b in out]
        assert len(parsed) == 3
        assert sum(1 for p in parsed if p.error_message) == 2
        assert [p.infer_response.id for p in parsed if not p.error_message] == ["good"]


def test_triton_grpc_error_closes_stream(stub):
    reqs = [fp32("id_fp32", 1, "ok"), fp32("nope", 1, "bad")]
    with pytest.raises(grpc.RpcError) as e:
        list(stub.ModelStreamInfer(iter(reqs), timeout=30,
                                   metadata=(("triton_grpc_error", "true"),)))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "Request for unknown model: 'nope' is not found"


def test_half_close_waits_for_inflight(stub):
    reqs = [slow(100, f"s{i}") for i in range(10)]
    t0 = time.time()
    responses = list(stub.ModelStreamInfer(iter(reqs), timeout=30))
    assert sorted(r.infer_response.id for r in responses) == sorted(f"s{i}" for i in range(10))
    assert time.time() - t0 >= 0.1


def test_cancel_mid_stream(server, stub):
    q = queue.Queue()

    def requests():
        for i in range(6):
            yield slow(200, f"c{i}")
        q.get()  # keep the stream open until cancelled

    call = stub.ModelStreamInfer(requests(), timeout=30)
    time.sleep(0.1)
    call.cancel()
    q.put(None)
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.CANCELLED
    time.sleep(0.3)  # in-flight requests complete on the backend after the cancel
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    out = list(stub.ModelStreamInfer(iter([fp32("id_fp32", 9, "after")]), timeout=10))
    assert [r.infer_response.id for r in out] == ["after"]
    assert server.proc.poll() is None


def test_deadline_on_stream(stub):
    def requests():
        yield slow(500, "late")
        time.sleep(1)

    with pytest.raises(grpc.RpcError) as e:
        list(stub.ModelStreamInfer(requests(), timeout=0.2))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


def test_churn_streams_opened_and_cancelled(server, stub):
    n = 1000
    body = fp32("id_fp32", 1, "x")
    busy = slow(2, "busy")  # still running on the backend when its stream is cancelled
    hold = threading.Event()

    def requests(first):
        yield first
        hold.wait()

    calls = []
    for i in range(n):
        call = stub.ModelStreamInfer(requests(busy if i % 4 == 1 else body), timeout=60)
        if i % 2 == 0:
            next(call)  # half of them cancelled after a response, half possibly before
        calls.append(call)
        if len(calls) >= 50:
            for c in calls:
                c.cancel()
            calls.clear()
    for c in calls:
        c.cancel()
    hold.set()
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    out = list(stub.ModelStreamInfer(iter([body]), timeout=10))
    assert len(out) == 1 and out[0].error_message == ""
    assert server.proc.poll() is None


def test_shutdown_with_calls_in_flight(nereid_server, tmp_path):
    s = nereid_server(identity_repo(str(tmp_path / "models")), wait_port="grpc")
    hold = threading.Event()

    def requests():
        for i in range(4):
            yield slow(400, f"f{i}")
        hold.wait()

    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        stream = stub.ModelStreamInfer(requests(), timeout=30)
        unary = [stub.ModelInfer.future(slow(400, f"u{i}"), timeout=30) for i in range(4)]
        time.sleep(0.15)
        t0 = time.time()
        assert s.stop() == 0  # SIGINT with work in flight: clean exit
        assert time.time() - t0 < 20
        hold.set()
        # The graceful exit answers the stream's open requests, then ends
        # it with OK although the client never half-closed it.
        got = list(stream)
        assert sorted(r.infer_response.id for r in got) == [f"f{i}" for i in range(4)]
        assert all(r.error_message == "" for r in got)
        for f in unary:
            assert f.result(timeout=10).id.startswith("u")


def test_non_decoupled_replies_in_request_order(stub, tmp_path):
    """Triton answers a stream's requests to non-decoupled models in the
    order it read them, whatever order they complete in: here the first
    request is held on the backend until the later ones have run (4
    instances), and errors found before the backend (an unknown model) keep
    their place too."""
    gate, started = str(tmp_path / "gate"), str(tmp_path / "started")
    first = slow(0, "first")
    first.parameters["wait_for_file"].string_param = gate
    later = slow(0, "later")
    later.parameters["started_file"].string_param = started
    reqs = [first, fp32("nope", 1, "unknown"), fp32("id_fp32", 1, "fast"), later,
            fp32("id_int32", 1, "bad-type")]

    def gen():
        for r in reqs:
            yield r
        # Every later request has run before the first is let go.
        deadline = time.time() + 30
        while not os.path.exists(started) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        open(gate, "w").close()

    ids = [r.infer_response.id for r in stub.ModelStreamInfer(gen(), timeout=60)]
    assert ids == ["first", "unknown", "fast", "later", "bad-type"]
