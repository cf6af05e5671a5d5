"""A gRPC stream opened with `triton_grpc_error: true` ends with the error's
status as soon as a response fails, also when the failed response of a
decoupled model carries no final flag and the final flag comes much later
(Triton's L0_backend_python lifecycle
`test_triton_grpc_error_decoupled_delayed_final`); the late final flag
then finds the stream closed and the server keeps serving. Without the
header the error is a message and the stream goes on.

No timing is asserted: the `hold` model sends its error only when a request
on another stream says so (after the client has its first response, so
no write of the stream is in progress), and keeps its final flag until a
second such request: a status that waited for the final flag would not
come before that.
"""
import queue

import grpc
import numpy as np
import pytest

from conftest import Server
from grpc_util import stubs
from test_python_backend import write

pb, pbg, _, _ = stubs()

# X=0: a response; once stepped, an error response without the final flag;
# once stepped again, the final flag alone (each step 60 s at most).
# X=1: one step, answered.
HOLD = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.step = threading.Semaphore(0)

    def execute(self, requests):
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            sender = r.get_response_sender()
            if x == 1:
                self.step.release()
                sender.send(self.y(1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                threading.Thread(target=self.answer, args=(sender,)).start()
        return None

    def y(self, v):
        return pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([v], np.int32))])

    def answer(self, sender):
        sender.send(self.y(0))
        self.step.acquire(timeout=60)
        sender.send(pb_utils.InferenceResponse(
            error=pb_utils.TritonError("An error occurred during execution")))
        self.step.acquire(timeout=60)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

CONFIG = """
name: "hold"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("grpcerr") / "models")
    write(repo, "hold", CONFIG, HOLD)
    s = Server(repo, [], wait_port="grpc")
    yield s
    assert s.stop() == 0, s.output()


def request(x):
    req = pb.ModelInferRequest(model_name="hold")
    t = req.inputs.add()
    t.name, t.datatype = "X", "INT32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([x], np.int32).tobytes())
    return req


def open_stream(stub, metadata=()):
    q = queue.Queue()

    def requests():
        while True:
            r = q.get()
            if r is None:
                return
            yield r

    return q, stub.ModelStreamInfer(requests(), metadata=metadata, timeout=30)


def y(resp):
    assert resp.error_message == "", resp.error_message
    return int(np.frombuffer(resp.infer_response.raw_output_contents[0], np.int32)[0])


def step(stub):
    q, call = open_stream(stub)
    q.put(request(1))
    assert y(next(call)) == 1
    q.put(None)
    assert list(call) == []


def error_closes_the_stream(stub):
    q, call = open_stream(stub, (("triton_grpc_error", "true"),))
    q.put(request(0))
    assert y(next(call)) == 0
    step(stub)
    # the status comes while the model still holds its final flag
    with pytest.raises(grpc.RpcError) as e:
        next(call)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert e.value.details() == "An error occurred during execution"
    q.put(None)
    step(stub)  # the late final flag finds the stream closed


def test_error_without_final_flag_closes_a_triton_grpc_error_stream(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        error_closes_the_stream(stub)
        # the server still serves, the same model included
        error_closes_the_stream(stub)


def test_error_without_final_flag_is_a_message_without_the_header(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        q, call = open_stream(stub)
        q.put(request(0))
        assert y(next(call)) == 0
        step(stub)
        err = next(call)
        assert err.error_message == "An error occurred during execution"
        step(stub)
        q.put(None)
        # the final flag alone sends nothing (no empty final asked): the
        # stream ends normally once the client half-closed
        assert list(call) == []
