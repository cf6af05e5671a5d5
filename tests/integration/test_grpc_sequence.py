"""Sequences over gRPC: interleaved sequences on one ModelStreamInfer stream
and over unary ModelInfer reach the sequence batcher with their correlation
ids and flags, and every running sum is exact."""
import grpc
import numpy as np
import pytest

from conftest import EXAMPLES
from grpc_util import infer_request, stubs

pb, pbg, _, _ = stubs()


@pytest.fixture
def stub(nereid_server):
    s = nereid_server(EXAMPLES, wait_port="grpc")
    with grpc.insecure_channel(s.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def step(corrid, value, start, end, id, string_id=False):
    req = infer_request(pb, "accumulator_direct",
                        [("INPUT", "INT32", [1, 1], np.array([value], np.int32))], id=id)
    if string_id:
        req.parameters["sequence_id"].string_param = corrid
    else:
        req.parameters["sequence_id"].int64_param = corrid
    req.parameters["sequence_start"].bool_param = start
    req.parameters["sequence_end"].bool_param = end
    return req


def test_interleaved_sequences_on_one_stream(stub):
    n_seq, n_steps = 6, 5
    reqs, expect, total = [], {}, {}
    for k in range(n_steps):
        for s in range(n_seq):
            v = 10 * s + k + 1
            total[s] = total.get(s, 0) + v
            rid = f"s{s}k{k}"
            expect[rid] = total[s]
            reqs.append(step(1000 + s, v, k == 0, k == n_steps - 1, rid))
    got = {}
    for r in stub.ModelStreamInfer(iter(reqs), timeout=60):
        assert r.error_message == "", r.error_message
        got[r.infer_response.id] = int(np.frombuffer(r.infer_response.raw_output_contents[0],
                                                     np.int32)[0])
    assert got == expect


def test_unary_sequence_and_errors(stub):
    total = 0
    for k, v in enumerate([5, 7, 11]):
        total += v
        r = stub.ModelInfer(step(42, v, k == 0, k == 2, f"u{k}"), timeout=30)
        assert np.frombuffer(r.raw_output_contents[0], np.int32)[0] == total
    # A continuing request for a sequence that was never started.
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(step(4242, 1, False, False, "orphan"), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must specify the START flag on the first request of the sequence" in e.value.details()
    # Correlation id 0 is refused.
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(step(0, 1, True, True, "zero"), timeout=30)
    assert "must specify a non-zero or non-empty correlation ID" in e.value.details()
