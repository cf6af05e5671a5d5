"""A BLS call's response is not stored in the response cache when the
worker can write what it was computed from or written into (server.h,
nereid_request_set_foreign_memory): its inputs in the worker's shared memory
(a BLS message over 60 KB travels in the worker's region), or outputs the
called model wrote into the worker's reply region (32 KiB or more). What
the cache would keep under the inputs' key might then not be what those
inputs give, and every other client of the cached model would be served it.
A small call (inputs in the datagram, outputs copied) is cached as before,
and a response cached by a direct request is served to BLS calls.
Through the real binary, counted by the cached model's statistics.
"""
import json

import numpy as np
import requests

from http_helpers import build_infer, infer, split_response
from test_python_backend import post, write

CACHED = """
name: "cached"
backend: "identity"
response_cache { enable: true }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

CALLER_CONFIG = """
name: "caller"
backend: "python"
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# {"n": elements, "v": value, "calls": k}: k BLS calls of cached with
# n FP32 of value v; ok per call when the output equals the input.
CALLER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            m = json.loads(r.inputs()[0].as_numpy()[0])
            x = np.full(m["n"], m["v"], np.float32)
            ok = []
            for _ in range(m["calls"]):
                q = pb_utils.InferenceRequest(
                    model_name="cached", inputs=[pb_utils.Tensor("INPUT0", x)],
                    requested_output_names=["OUTPUT0"]).exec()
                if q.has_error():
                    raise pb_utils.TritonModelException(q.error().message())
                ok.append(bool(np.array_equal(q.output_tensors()[0].as_numpy(), x)))
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([json.dumps(ok).encode()], np.object_))]))
        return out
"""


def repo(tmp_path):
    root = str(tmp_path / "models")
    write(root, "cached", CACHED, None)
    write(root, "caller", CALLER_CONFIG, CALLER)
    return root


def bls(s, n, v, calls):
    r = post(s, "caller", [{"name": "MODE", "datatype": "BYTES",
                            "data": [json.dumps({"n": n, "v": v, "calls": calls})]}])
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["outputs"][0]["data"][0]) == [True] * calls


def direct(s, n, v):
    x = np.full(n, v, np.float32)
    body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": x,
                                  "binary": True}],
                                outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    r = infer(s, "cached", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert np.array_equal(np.frombuffer(raw["OUTPUT0"], np.float32), x)


def counts(s):
    st = requests.get(s.http_url + "/v2/models/cached/stats").json()["model_stats"][0]
    inf = st["inference_stats"]
    return inf["cache_hit"]["count"], inf["cache_miss"]["count"], st["execution_count"]


def test_bls_calls_the_worker_can_write_are_not_cached(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path), "--cache-config=local,size=67108864")
    # small: inputs in the datagram, the output copied: cached as before
    bls(s, 4, 1.5, 2)
    assert counts(s) == (1, 1, 1)

    # 256 KiB: the call travels in the worker's region (foreign inputs)
    # and the output is written in its reply region: two misses, run twice
    bls(s, 65536, 2.5, 2)
    assert counts(s) == (1, 3, 3)
    # nothing was stored: a direct request misses, then is cached ...
    direct(s, 65536, 2.5)
    assert counts(s) == (1, 4, 4)
    direct(s, 65536, 2.5)
    assert counts(s) == (2, 4, 4)
    # ... and that entry is served to the BLS call
    bls(s, 65536, 2.5, 1)
    assert counts(s) == (3, 4, 4)

    # 48 KiB: the call fits the datagram (its inputs are the server's copy)
    # but the output is written in the worker's reply region: not stored
    bls(s, 12288, 3.5, 2)
    assert counts(s) == (3, 6, 6)
    direct(s, 12288, 3.5)
    assert counts(s) == (3, 7, 7)
