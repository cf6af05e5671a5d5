"""pb_utils' request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
through the real binary: a rescheduled request runs again in a later batch
of its iterative sequence (non-decoupled: its response is None until the
last run; decoupled: one response per run), and a model without
iterative_sequence fails the request with Triton's text. Shares the core's
mechanism with Triton backends (nereid_batch_request_reschedule)."""
import numpy as np
import pytest
import requests

from conftest import Server
from grpc_util import stubs
from test_python_backend import write

pb, pbg, _, _ = stubs()

# Counts its runs per request (keyed by the sequence id the batcher gives
# it); reschedules until it has run IN times, then answers the count.
ITER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            k = r.correlation_id()
            self.runs[k] = self.runs.get(k, 0) + 1
            if self.runs[k] < n:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", np.array([self.runs.pop(k)], np.int32))]))
        return out
"""

# Decoupled: each run sends the number of runs still to come; the last one
# closes the stream.
ITER_DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for r in requests:
            k = r.correlation_id()
            if k not in self.left:
                self.left[k] = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            self.left[k] -= 1
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([self.left[k]], np.int32))]))
            if self.left[k] > 0:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.left[k]
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Reschedules and still returns a response (Triton: an error for the whole
# execute, nothing rescheduled).
WRONG = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])
                for r in requests]
"""


def config(name, sched, decoupled=False):
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
{policy}
{sched}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("resched"))
    write(repo, "py_iter", config("py_iter", "sequence_batching { iterative_sequence: true }"),
          ITER)
    write(repo, "py_iter_dyn", config("py_iter_dyn", "dynamic_batching { }"), ITER)
    write(repo, "py_iter_dec",
          config("py_iter_dec", "sequence_batching { iterative_sequence: true }", True),
          ITER_DECOUPLED)
    write(repo, "py_wrong", config("py_wrong", "sequence_batching { iterative_sequence: true }"),
          WRONG)
    s = Server(repo, [])
    yield s
    assert s.stop() == 0, s.output()


def infer_http(server, model, n):
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [n]}]}
    return requests.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def test_rescheduled_request_answers_after_its_last_run(server):
    for n in (1, 3):
        r = infer_http(server, "py_iter", n)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [n]


def test_reschedule_refused_without_iterative_sequence(server):
    r = infer_http(server, "py_iter_dyn", 2)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is "
        "not configured to handle such a flag.")
    # the model keeps serving
    assert infer_http(server, "py_iter_dyn", 1).status_code == 200


def test_rescheduled_request_with_a_response_fails(server):
    r = infer_http(server, "py_wrong", 1)
    assert r.status_code >= 400, r.text
    assert r.json()["error"].startswith(
        "Expected a None object in the execute function return list for reschduled request, "
        "found type '<class 'triton_python_backend_utils.InferenceResponse'>'."), r.text


def test_decoupled_rescheduled_request_streams_one_response_per_run(server):
    import grpc
    req = pb.ModelInferRequest(model_name="py_iter_dec", id="r")
    t = req.inputs.add()
    t.name, t.datatype = "IN", "INT32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([3], np.int32).tobytes())
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        out = list(stub.ModelStreamInfer(iter([req]), timeout=60))
    assert [o.error_message for o in out] == ["", "", ""]
    vals = [int(np.frombuffer(o.infer_response.raw_output_contents[0], np.int32)[0])
            for o in out if o.infer_response.raw_output_contents]
    assert vals == [2, 1, 0]
