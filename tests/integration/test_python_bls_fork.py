"""BLS from processes a Python model forks (multiprocessing.Pool with the
fork start method, as Triton's L0_backend_python bls test_multiprocess),
and programs a model starts, through the real binary.

Every child has a copy of the worker and the same socket to the server.
Before the fix the children read each other's answers off that socket,
numbered their calls alike and offered the same regions, so a pool.map
of BLS calls waited forever now and then (every few requests here). Each
request below makes ten children call a model (small and 64 KiB inputs,
outputs past the 32 KiB in-place threshold, a decoupled model's stream)
and the parent call it afterwards; every answer is checked.

A worker also ignored SIGTERM (SIG_IGN) and had it blocked (the mask of
the server's threads, kept through posix_spawn), and a program it starts
inherits both through exec: Popen.terminate() did not end it. Triton's
stub skips SIGTERM with a handler, which exec resets to the default.
"""
import json
import urllib.request

import numpy as np
import pytest

from conftest import Server
from test_python_backend import write

IDENT = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)])
            for r in requests]
"""

IDENT_CONFIG = """
name: "ident"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

# decoupled: N responses, the i-th holding X + i
REP = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            s = r.get_response_sender()
            for i in range(3):
                s.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + i)]))
            s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

REP_CONFIG = """
name: "rep"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

FORKER = """
import os
from multiprocessing import Pool

import numpy as np
import triton_python_backend_utils as pb_utils


def call(k):
    # a small call, then one whose input and output leave the datagram
    # (64 KiB each), then a decoupled model's three responses
    good = 0
    for n in (4, 16384):
        x = np.arange(n, dtype=np.int32) + 1000 * k
        r = pb_utils.InferenceRequest(model_name="ident", inputs=[pb_utils.Tensor("X", x)],
                                      requested_output_names=["Y"]).exec()
        if not r.has_error() and np.array_equal(
                pb_utils.get_output_tensor_by_name(r, "Y").as_numpy(), x + 1):
            good += 1
    x = np.full(8, k, np.int32)
    got = [pb_utils.get_output_tensor_by_name(r, "Y").as_numpy()
           for r in pb_utils.InferenceRequest(
               model_name="rep", inputs=[pb_utils.Tensor("X", x)],
               requested_output_names=["Y"]).exec(decoupled=True)
           if not r.has_error() and r.output_tensors()]
    if len(got) == 3 and all(np.array_equal(g, x + i) for i, g in enumerate(got)):
        good += 1
    return good, os.getpid()


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for req in requests:
            n = int(pb_utils.get_input_tensor_by_name(req, "N").as_numpy()[0])
            pool = Pool(n)
            res = pool.map(call, range(n))
            pool.close()
            pool.join()
            good = sum(g for g, _ in res)
            pids = len({p for _, p in res} - {os.getpid()})
            mine, _ = call(n)  # the parent's own calls afterwards
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("GOOD", np.array([good, mine, pids], np.int32))]))
        return out
"""

FORKER_CONFIG = """
name: "forker"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "GOOD" data_type: TYPE_INT32 dims: [ 3 ] } ]
"""

# starts a program that waits 60 s, terminates it, reports how it ended
TERMINATOR = """
import subprocess
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        p = subprocess.Popen(["sleep", "60"])
        p.terminate()
        try:
            rc = p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = 0
        return [pb_utils.InferenceResponse([pb_utils.Tensor("RC", np.array([rc], np.int32))])
                for _ in requests]
"""

TERMINATOR_CONFIG = """
name: "terminator"
backend: "python"
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "RC" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("bls_fork") / "models")
    write(repo, "ident", IDENT_CONFIG, IDENT)
    write(repo, "rep", REP_CONFIG, REP)
    write(repo, "forker", FORKER_CONFIG, FORKER)
    write(repo, "terminator", TERMINATOR_CONFIG, TERMINATOR)
    s = Server(repo, ["--log-verbose=1"])
    yield s
    assert s.stop() == 0, s.output()


def infer(server, model, name, n, timeout=120):
    body = json.dumps({"inputs": [{"name": "N", "datatype": "INT32", "shape": [1],
                                   "data": [n]}]}).encode()
    req = urllib.request.Request(f"{server.http_url}/v2/models/{model}/infer", data=body,
                                 headers={"Content-Type": "application/json"})
    # the timeout only bounds a hang (the bug); nothing here is timed
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return [o for o in out["outputs"] if o["name"] == name][0]["data"]


def test_bls_from_a_pool_of_forked_processes(server):
    for _ in range(8):
        good, mine, children = infer(server, "forker", "GOOD", 10)
        assert (good, mine) == (30, 3), server.output()[-3000:]
        assert children >= 1


def test_a_program_the_model_starts_can_be_terminated(server):
    assert infer(server, "terminator", "RC", 1) == [-15]
