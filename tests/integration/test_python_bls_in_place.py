"""BLS results written in place (python_bls.c, "BLS results in place"), through
the real binary: a model.py calls ONNX (outputs bound and unbound), C
identity, Python and ensemble models whose large outputs the called model
writes straight into the caller's reply region. Values are right, kept and
returned results keep them, and the caller's count of BLS result outputs
(logged at --log-verbose=1 when its instance goes) says which were written
in place and which were copied: outputs too large for a region, BYTES, a
decoupled callee's responses, a second output the region has no room for.
A call that fails after its outputs were placed, and a worker killed while
the called model still has to write, leave the server serving.
"""
import json
import os
import re
import signal
import sys
import threading
import time

import numpy as np

from conftest import ROOT, Server
from http_helpers import split_response
from test_python_backend import post, write
from test_python_bls_regions import CALLER_CONFIG, GEN, GEN_CONFIG

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import make_models  # noqa: E402

KIB256 = 65536  # FP32 elements: 256 KiB
MIB4 = 1 << 20  # FP32 elements: 4 MiB
TWO = 150000  # FP32 elements: 600 KB, two of them more than a 1 MiB region holds

CALLER = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

def req(model, ins, outs):
    return pb_utils.InferenceRequest(model_name=model, inputs=ins, requested_output_names=outs)

def call(model, x, n_out=1, decoupled=False):
    ins = [pb_utils.Tensor("INPUT0", x)]
    if n_out == 2:
        ins.append(pb_utils.Tensor("INPUT1", x + np.float32(1)))
    outs = ["OUTPUT0", "OUTPUT1"][:n_out]
    if decoupled:
        rs = list(req(model, ins, outs).exec(decoupled=True))
        r = [q for q in rs if q.output_tensors() or q.has_error()][0]
    else:
        r = req(model, ins, outs).exec()
    if r.has_error():
        raise pb_utils.TritonModelException(r.error().message())
    return [pb_utils.get_output_tensor_by_name(r, o).as_numpy() for o in outs]

def vec(n, i):
    return np.arange(n, dtype=np.float32) + np.float32(i)

class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        out = []
        for r in requests:
            m = json.loads(r.inputs()[0].as_numpy()[0])
            res = {"pid": os.getpid()}
            ts = []
            kind, model, n = m["kind"], m.get("model"), m.get("n", 0)
            if kind == "loop":  # each result checked, then dropped
                res["ok"] = [bool(np.array_equal(call(model, vec(n, i))[0], vec(n, i)))
                             for i in range(m["calls"])]
            elif kind == "keep":  # all kept, checked after the last call and next execute
                got = [call(model, vec(n, i))[0] for i in range(m["calls"])]
                self.kept = got
                res["ok"] = [bool(np.array_equal(a, vec(n, i))) for i, a in enumerate(got)]
                ts.append(pb_utils.Tensor("OUT_F", got[-1]))  # returned: a reference
            elif kind == "kept":
                res["ok"] = [bool(np.array_equal(a, vec(len(a), i)))
                             for i, a in enumerate(self.kept)]
                self.kept = []
            elif kind == "chain":  # a result as the next call's input
                a = call(model, vec(n, 3))[0]
                b = call(model, a)[0]
                res["ok"] = [bool(np.array_equal(a, vec(n, 3))), bool(np.array_equal(b, vec(n, 3)))]
            elif kind == "two":  # two outputs of one call
                a, b = call(model, vec(n, 0), n_out=2)
                res["ok"] = [bool(np.array_equal(a, vec(n, 0))), bool(np.array_equal(b, vec(n, 1)))]
            elif kind == "decoupled_exec":  # exec(decoupled=True) of a model that is not
                a = call(model, vec(n, 5), decoupled=True)[0]
                res["ok"] = [bool(np.array_equal(a, vec(n, 5)))]
            elif kind == "gen":  # a decoupled callee: N responses of X + i
                rs = list(req("gen", [pb_utils.Tensor("X", vec(n, 0)),
                                      pb_utils.Tensor("N", np.array([m["count"]], np.int32))],
                              ["OUT"]).exec(decoupled=True))
                got = [q.output_tensors()[0].as_numpy() for q in rs if q.output_tensors()]
                res["ok"] = [len(got) == m["count"]] + [bool(np.array_equal(a, vec(n, i)))
                                                        for i, a in enumerate(got)]
            elif kind == "bytes":
                x = np.array([("s%07d" % i).encode() for i in range(n)], np.object_)
                q = req(model, [pb_utils.Tensor("INPUT0", x)], ["OUTPUT0"]).exec()
                a = q.output_tensors()[0].as_numpy()
                res["ok"] = [a.shape == x.shape and all(a[i] == x[i] for i in (0, n // 2, n - 1))]
            elif kind == "ens":  # an ensemble: OUT0 (identity) and OUT1 = OUT0 + 1 (Python)
                x = vec(n, m["first"]) if m["first"] >= 0 else -vec(n, 1)
                q = req("ens", [pb_utils.Tensor("IN", x)], ["OUT0", "OUT1"]).exec()
                if q.has_error():
                    res["error"] = q.error().message()
                else:
                    a = pb_utils.get_output_tensor_by_name(q, "OUT0").as_numpy()
                    b = pb_utils.get_output_tensor_by_name(q, "OUT1").as_numpy()
                    res["ok"] = [bool(np.array_equal(a, x)), bool(np.array_equal(b, x + 1))]
            elif kind == "cancel":  # cancelled while the callee runs: an error or the result
                it = req(model, [pb_utils.Tensor("INPUT0", vec(n, 2))], ["OUTPUT0"]).exec(
                    decoupled=True)
                it.cancel()
                rs = [q for q in it if q.output_tensors() or q.has_error()]
                res["ok"] = [len(rs) == 1 and (rs[0].has_error() or bool(np.array_equal(
                    rs[0].output_tensors()[0].as_numpy(), vec(n, 2))))]
            elif kind == "slow":  # the test kills this worker while the call waits
                with open(os.path.join(m["dir"], "started.tmp"), "w") as f:
                    f.write(str(os.getpid()))
                os.rename(os.path.join(m["dir"], "started.tmp"), os.path.join(m["dir"], "started"))
                call(model, vec(n, 0))
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([json.dumps(res).encode()], np.object_))] + ts))
        return out
"""

# OUTPUT0 = INPUT0 + 1; an error for a negative first element.
PLUS1 = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            if x[0] < 0:
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            else:
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x + np.float32(1))]))
        return out
"""

ENSEMBLE_CONFIG = """
name: "ens"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "ident_c" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT0" } },
  { model_name: "plus1" model_version: -1
    input_map { key: "INPUT0" value: "OUT0" } output_map { key: "OUTPUT0" value: "OUT1" } } ] }
"""


def io_config(name, backend, dt="TYPE_FP32", dims="[ -1 ]", n=1, extra=""):
    ins = ", ".join(f'{{ name: "INPUT{i}" data_type: {dt} dims: {dims} }}' for i in range(n))
    outs = ", ".join(f'{{ name: "OUTPUT{i}" data_type: {dt} dims: {dims} }}' for i in range(n))
    kind = f'platform: "{backend}"' if backend == "onnxruntime_onnx" else f'backend: "{backend}"'
    return f'name: "{name}"\n{kind}\ninput [ {ins} ]\noutput [ {outs} ]\n{extra}'


def make_repo(root):
    repo = str(root / "models")
    write(repo, "caller", CALLER_CONFIG, CALLER)
    write(repo, "gen", GEN_CONFIG, GEN)
    write(repo, "plus1", io_config("plus1", "python"), PLUS1)
    write(repo, "ens", ENSEMBLE_CONFIG, None)
    for name, dims in (("ident_onnx", (-1,)), ("ident_onnx_fixed", (KIB256,))):
        write(repo, name, io_config(name, "onnxruntime_onnx",
                                    dims="[ -1 ]" if dims[0] < 0 else f"[ {dims[0]} ]"), None)
        with open(os.path.join(repo, name, "1", "model.onnx"), "wb") as f:
            f.write(make_models.identity("FP32", dims).SerializeToString())
    write(repo, "ident_c", io_config("ident_c", "identity"), None)
    write(repo, "ident_c2", io_config("ident_c2", "identity", n=2), None)
    write(repo, "ident_bytes", io_config("ident_bytes", "identity", dt="TYPE_STRING"), None)
    write(repo, "ident_slow", io_config(
        "ident_slow", "identity",
        extra='parameters { key: "execute_delay_ms" value: { string_value: "1500" } }'), None)
    return repo


def run(s, outputs=None, **mode):
    """The caller's JSON answer for mode, and the reply's binary outputs."""
    r = post(s, "caller", [{"name": "MODE", "datatype": "BYTES", "data": [json.dumps(mode)]}],
             outputs)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    out = next(o for o in doc["outputs"] if o["name"] == "OUT")
    return json.loads(out["data"][0]), raw


def run_ok(s, **mode):
    res, _ = run(s, **mode)
    assert res.get("ok") and all(res["ok"]), (mode, res)
    return res


def counts(s):
    """The caller instance's BLS result outputs once the server stopped:
    (written in place, their bytes, copied, their bytes, regions made)."""
    rc = s.stop()
    with open(s.log_path) as f:
        log = f.read()
    assert rc == 0, log[-3000:]
    found = re.findall(r"'caller_0' BLS result outputs: (\d+) written in place by the called "
                       r"model \((\d+) bytes\), (\d+) copied \((\d+) bytes\); (\d+) result "
                       r"regions made", log)
    assert len(found) == 1, log[-3000:]
    return tuple(int(v) for v in found[0])


def test_onnx_and_c_callees_write_their_outputs_in_place(tmp_path):
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    calls = 0
    placed_bytes = 0
    try:
        for model, n in (("ident_onnx", KIB256), ("ident_onnx", MIB4), ("ident_onnx_fixed", KIB256),
                         ("ident_c", KIB256), ("ident_c", MIB4)):
            run_ok(s, kind="loop", model=model, n=n, calls=4)
            run_ok(s, kind="chain", model=model, n=n)
            calls += 6
            placed_bytes += 6 * n * 4
        # kept across calls and executes (fewer results than region slots),
        # the last one returned as the model's own output
        for model, n in (("ident_onnx", MIB4), ("ident_c", KIB256)):
            res, raw = run(s, [{"name": "OUT"}, {"name": "OUT_F",
                                                 "parameters": {"binary_data": True}}],
                           kind="keep", model=model, n=n, calls=6)
            assert all(res["ok"]), res
            assert np.array_equal(np.frombuffer(raw["OUT_F"], np.float32),
                                  np.arange(n, dtype=np.float32) + 5)
            run_ok(s, kind="loop", model=model, n=n, calls=5)  # other slots' regions reused
            run_ok(s, kind="kept")
            calls += 11
            placed_bytes += 11 * n * 4
        run_ok(s, kind="two", model="ident_c2", n=KIB256)  # both in one region
        run_ok(s, kind="decoupled_exec", model="ident_c", n=KIB256)
        calls += 3
        placed_bytes += 3 * KIB256 * 4
    finally:
        got = counts(s)
    assert got[:4] == (calls, placed_bytes, 0, 0)


def test_one_region_serves_calls_one_after_another(tmp_path):
    # each result is dropped before the next call: the worker offers the
    # same slot, and the server finds its region free (the last call's
    # references went before its result was sent), every call
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        run_ok(s, kind="loop", model="ident_c", n=KIB256, calls=40)
        run_ok(s, kind="loop", model="ident_onnx", n=KIB256, calls=40)
    finally:
        got = counts(s)
    assert got == (80, 80 * KIB256 * 4, 0, 0, 1)


def test_results_a_region_cannot_hold_and_other_fallbacks_are_copied(tmp_path):
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        run_ok(s, kind="loop", model="ident_c", n=4 << 20, calls=1)  # 16 MiB: past a region
        run_ok(s, kind="loop", model="ident_c", n=KIB256, calls=1)  # in place: a 1 MiB region
        run_ok(s, kind="two", model="ident_c2", n=TWO)  # that region has no room for the second
        run_ok(s, kind="bytes", model="ident_bytes", n=40000)  # BYTES, 440 KB
        run_ok(s, kind="gen", n=KIB256, count=5)  # a decoupled callee's responses
        run_ok(s, kind="loop", model="ident_c", n=1000, calls=3)  # small: in the datagram
    finally:
        got = counts(s)
    assert got[:4] == (1, KIB256 * 4, 1 + 2 + 1 + 5 + 3,
                   ((4 << 20) + 2 * TWO + 5 * KIB256 + 3000) * 4 + 40000 * 12)


def test_ensemble_outputs_in_place_and_a_call_failing_after_placing(tmp_path):
    s = Server(make_repo(tmp_path), ["--log-verbose=1"], "http")
    try:
        for i in range(3):
            run_ok(s, kind="ens", n=MIB4, first=i)
            res, _ = run(s, kind="ens", n=MIB4, first=-1)  # OUT0 placed, then the step fails
            assert "negative input" in res["error"], res
        run_ok(s, kind="loop", model="ident_c", n=MIB4, calls=3)
    finally:
        got = counts(s)
    assert got[0] == 3 * 2 + 3 and got[1] == (3 * 2 + 3) * MIB4 * 4 and got[2] == 0, got


def test_a_worker_killed_before_its_callee_writes_and_a_cancelled_call(tmp_path):
    s = Server(make_repo(tmp_path), [], "http")
    try:
        d = str(tmp_path / "gate")
        os.makedirs(d)
        mode = json.dumps({"kind": "slow", "model": "ident_slow", "n": MIB4, "dir": d})
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", post(
            s, "caller", [{"name": "MODE", "datatype": "BYTES", "data": [mode]}])))
        t.start()
        started = os.path.join(d, "started")
        for _ in range(3000):
            if os.path.exists(started):
                break
            time.sleep(0.01)
        with open(started) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGKILL)  # the 1.5 s callee writes into its region after this
        t.join(60)
        assert not t.is_alive() and box["r"].status_code != 200
        for _ in range(3):  # a new worker; the server's fini waits for the late call
            res = run_ok(s, kind="loop", model="ident_c", n=MIB4, calls=3)
            assert res["pid"] != pid
        run_ok(s, kind="cancel", model="ident_slow", n=MIB4)
        run_ok(s, kind="loop", model="ident_c", n=MIB4, calls=3)
    finally:
        assert s.stop() == 0, s.output()[-3000:]
