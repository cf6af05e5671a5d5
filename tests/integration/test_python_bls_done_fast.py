"""A BLS result returned as a model's output, on the worker's fast path
(nereid_stub/host.py simple_done, result_record): the DONE names the
result where the server wrote it (a where 2 + slot record) without the
general path (send_responses). The model counts the DONEs the general path
builds (it wraps the worker's send_responses) and answers the count on
request. Values stay right across many calls (each result dropped after its
reply, so the server's result regions are reused: at most two made), mixed
with the request's own input returned beside it, and a result the fast path
cannot name (a strided view, a copy) still goes the general way, right.
The request's own input given on to the call as it is, is named where the
worker knows it lies, without looking up the regions' addresses (a slice
of it still looks them up); both travel by reference.
A forged record past a result region is test_python_bls_regions.py's
test_a_forged_reference_past_a_result_region_fails_the_request: the server
checks every record the same whichever path wrote it.
"""
import os
import re
import sys

import numpy as np

from conftest import ROOT, Server
from http_helpers import output_array, split_response
from test_python_backend import post, write
from test_python_bls_in_place import io_config

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_models  # noqa: E402

N = 65536  # FP32[65536]: 256 KiB, the body in a request body region, results in regions

RELAY_CONFIG = """
name: "relay"
backend: "python"
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "SAME" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "GENERAL" data_type: TYPE_INT64 dims: [ 2 ] } ]
"""

RELAY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.general = 0
        w = pb_utils._worker
        send_responses = w.send_responses

        def counted(reqs, res):
            self.general += 1
            return send_responses(reqs, res)
        w.send_responses = counted
        self.spans = 0
        exec_bodies = w.exec_bodies

        def spans():
            self.spans += 1
            return exec_bodies()
        w.exec_bodies = spans

    def execute(self, requests):
        out = []
        for r in requests:
            mode = pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0].decode()
            x = pb_utils.get_input_tensor_by_name(r, "X")
            if mode == "count":
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("GENERAL", np.array([self.general, self.spans], np.int64))]))
                continue
            kind = mode.split(":")[0]
            given = x.as_numpy()[:len(x.as_numpy()) // 2] if kind == "half" else x.as_numpy()
            res = pb_utils.InferenceRequest(
                model_name=mode.split(":")[1], inputs=[pb_utils.Tensor("INPUT0", given)],
                requested_output_names=["OUTPUT0"]).exec()
            if res.has_error():
                raise pb_utils.TritonModelException(res.error().message())
            a = res.output_tensors()[0].as_numpy()
            if kind in ("result", "half"):  # the result itself: the fast path names it
                ts = [pb_utils.Tensor("OUT", a)]
            elif kind == "mixed":  # the result and the request's own input
                ts = [pb_utils.Tensor("OUT", a), pb_utils.Tensor("SAME", x.as_numpy())]
            elif kind == "strided":  # not contiguous: copied by the general path
                ts = [pb_utils.Tensor("OUT", a[::2])]
            else:  # a new array
                ts = [pb_utils.Tensor("OUT", a + np.float32(1))]
            out.append(pb_utils.InferenceResponse(ts))
        return out
"""


def make_repo(tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "relay", RELAY_CONFIG, RELAY)
    write(repo, "ident_c", io_config("ident_c", "identity"), None)
    write(repo, "ident_onnx", io_config("ident_onnx", "onnxruntime_onnx"), None)
    with open(os.path.join(repo, "ident_onnx", "1", "model.onnx"), "wb") as f:
        f.write(make_models.identity("FP32", (-1,)).SerializeToString())
    return repo


def relay(s, mode, x, outputs=("OUT",)):
    r = post(s, "relay", [{"name": "MODE", "datatype": "BYTES", "data": [mode]},
                          {"name": "X", "datatype": "FP32", "data": x, "binary": True}],
             [{"name": o, "binary": True} for o in outputs])
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    return {o: output_array(doc, raw, o) for o in outputs}


def general_count(s, what=0):
    """DONEs the general path built so far (the first "count" answer itself
    takes it once: its record is remembered from then on); what=1: the
    times a BLS call looked up the request body regions' addresses."""
    return int(relay(s, "count", np.zeros(4, np.float32), ("GENERAL",))["GENERAL"][what])


def regions_made(s):
    rc = s.stop()
    with open(s.log_path) as f:
        log = f.read()
    assert rc == 0, log[-3000:]
    found = re.findall(r"'relay_0' BLS result outputs: (\d+) written in place .*; (\d+) result "
                       r"regions made", log)
    assert len(found) == 1, log[-3000:]
    return int(found[0][0]), int(found[0][1])


def test_a_returned_result_takes_the_fast_path_and_regions_are_reused(tmp_path):
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        general_count(s)
        before = general_count(s)
        for i in range(30):
            callee = "ident_c" if i % 2 else "ident_onnx"
            x = np.arange(N, dtype=np.float32) * np.float32(i + 1)
            np.testing.assert_array_equal(relay(s, f"result:{callee}", x)["OUT"], x)
        assert general_count(s) == before  # every DONE above was the fast path's
        for i in range(5):
            x = np.arange(N, dtype=np.float32) - np.float32(i)
            got = relay(s, "mixed:ident_c", x, ("OUT", "SAME"))
            np.testing.assert_array_equal(got["OUT"], x)
            np.testing.assert_array_equal(got["SAME"], x)
        assert general_count(s) == before
    finally:
        placed, made = regions_made(s)
    assert placed == 35  # each result written by the called model where the reply read it
    assert made <= 2, made  # results dropped after each reply: the regions are reused


def test_results_the_fast_path_cannot_name_go_the_general_way(tmp_path):
    s = Server(make_repo(tmp_path), [], "http")
    try:
        general_count(s)
        before = general_count(s)
        x = np.arange(N, dtype=np.float32) + np.float32(7)
        np.testing.assert_array_equal(relay(s, "strided:ident_c", x)["OUT"], x[::2])
        np.testing.assert_array_equal(relay(s, "copy:ident_onnx", x)["OUT"], x + 1)
        assert general_count(s) == before + 2
        small = np.arange(100, dtype=np.float32)  # a result in the datagram, no region
        np.testing.assert_array_equal(relay(s, "result:ident_c", small)["OUT"], small)
        # and the fast path again after those
        after = general_count(s)
        np.testing.assert_array_equal(relay(s, "result:ident_onnx", x)["OUT"], x)
        assert general_count(s) == after
        # a new 8 KiB array after a small (inline) EXECUTE, with result
        # regions mapped: the general path, as before (only records of
        # outputs under ALIAS_MIN are remembered)
        mid = np.arange(2048, dtype=np.float32)
        for _ in range(3):
            np.testing.assert_array_equal(relay(s, "copy:ident_c", mid)["OUT"], mid + 1)
        assert general_count(s) == after + 3
    finally:
        s.stop()


def test_own_inputs_given_on_are_referenced_without_looking_up_addresses(tmp_path):
    # The request's own input given on as it is (the same array) is named
    # where the worker knows it lies (nereid_stub/bls.py bls_now, "known");
    # a slice of it still needs the regions' addresses (exec_bodies). Both
    # travel by reference: the server counts inputs it read in a body region.
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        general_count(s)  # the general path, which looks them up, once
        looked = general_count(s, 1)
        for i in range(10):
            x = np.arange(N, dtype=np.float32) + np.float32(i)
            np.testing.assert_array_equal(relay(s, "result:ident_onnx", x)["OUT"], x)
        assert general_count(s, 1) == looked
        for i in range(3):
            x = np.arange(N, dtype=np.float32) - np.float32(i)
            np.testing.assert_array_equal(relay(s, "half:ident_c", x)["OUT"], x[:N // 2])
        assert general_count(s, 1) == looked + 3
    finally:
        rc = s.stop()
        with open(s.log_path) as f:
            log = f.read()
    assert rc == 0, log[-3000:]
    refs = re.findall(r"'relay_0' request body regions: (\d+) inputs referenced", log)
    assert refs == ["13"], log[-3000:]
