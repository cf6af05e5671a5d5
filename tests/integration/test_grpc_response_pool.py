"""--grpc-max-response-pool-size (Triton server #7879): the number of a
gRPC stream's decoupled responses queued for writing at once; a model that
sends more waits until the client has taken some. Values <= 0 fail start-up
with Triton's text; L0_decoupled runs its streams with the size 1."""
import os
import shutil
import subprocess
import textwrap
import threading
import time

import grpc
import numpy as np

from conftest import EXAMPLES, NEREID
from grpc_util import stubs

pb, pbg, _, _ = stubs()

N_RESPONSES = 48
FLOOD = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.progress = os.path.join(args["model_repository"], "progress")

    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            for i in range(n):
                out = np.full([1 << 18], i, np.int32)  # 1 MiB
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
                with open(self.progress, "a") as f:
                    f.write("x")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
FLOOD_CONFIG = """
name: "flood"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


def flood_repo(tmp_path):
    repo = tmp_path / "models"
    d = repo / "flood"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(FLOOD_CONFIG))
    (d / "1" / "model.py").write_text(textwrap.dedent(FLOOD))
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), str(repo / "repeat_int32"))
    return str(repo), str(d / "progress")


def flood_request(n):
    req = pb.ModelInferRequest(model_name="flood")
    t = req.inputs.add()
    t.name, t.datatype = "N", "INT32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([n], np.int32).tobytes())
    return req


def sent(progress):
    try:
        with open(progress) as f:
            return len(f.read())
    except FileNotFoundError:
        return 0


def settled(progress, quiet=1.0, limit=30.0):
    """The model's count of sent responses once it has not moved for quiet
    seconds (a model held back stops; one that is not runs to its end)."""
    end = time.time() + limit
    last, since = sent(progress), time.time()
    while time.time() < end:
        time.sleep(0.1)
        now = sent(progress)
        if now != last:
            last, since = now, time.time()
        elif now > 0 and time.time() - since >= quiet:
            break
    return last


def test_non_positive_sizes_fail_start_up():
    for bad in ("0", "-1"):
        r = subprocess.run([NEREID, "--model-repository", EXAMPLES,
                            f"--grpc-max-response-pool-size={bad}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (bad, r.stderr)
        assert "Error: --grpc-max-response-pool-size must be greater than 0." in r.stderr


def rss_mib(s):
    with open(f"/proc/{s.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_flood(s, n):
    """A stream with one flood request whose responses the client does not
    read yet. Without BDP probing the client's window stays small: what it
    has not read stays in the server."""
    go = threading.Event()

    def requests_then_wait():
        yield flood_request(n)
        go.wait(60)

    ch = grpc.insecure_channel(s.grpc_addr, options=[("grpc.http2.bdp_probe", 0)])
    stub = pbg.GRPCInferenceServiceStub(ch)
    return ch, go, stub.ModelStreamInfer(requests_then_wait(), timeout=120)


def read_all(ch, go, replies, n):
    got = []
    for r in replies:
        assert r.error_message == ""
        out = np.frombuffer(r.infer_response.raw_output_contents[0], np.int32)
        got.append(int(out[0]))
        if len(got) == n:
            break
    go.set()
    ch.close()
    return got


def test_responses_wait_for_the_client(nereid_server, tmp_path):
    """48 responses of 1 MiB that the client does not read: with a pool of
    1 the server holds about one (the model's next send waits), not all."""
    repo, progress = flood_repo(tmp_path)
    s = nereid_server(repo, "--grpc-max-response-pool-size=1")
    base = rss_mib(s)
    ch, go, replies = open_flood(s, N_RESPONSES)
    assert settled(progress) == N_RESPONSES  # the Python stub sends ahead
    time.sleep(1)  # time for the server to take in what it would
    grown = rss_mib(s) - base
    assert grown < N_RESPONSES / 2, grown
    assert read_all(ch, go, replies, N_RESPONSES) == list(range(N_RESPONSES))


def test_default_queues_every_response(nereid_server, tmp_path):
    """Triton's default (INT_MAX): every response queues at once (the
    contrast that shows the test above measures the queue)."""
    repo, progress = flood_repo(tmp_path)
    s = nereid_server(repo)
    base = rss_mib(s)
    ch, go, replies = open_flood(s, N_RESPONSES)
    end = time.time() + 60
    while rss_mib(s) - base < N_RESPONSES * 3 / 4 and time.time() < end:
        time.sleep(0.1)
    assert rss_mib(s) - base >= N_RESPONSES * 3 / 4
    assert read_all(ch, go, replies, N_RESPONSES) == list(range(N_RESPONSES))


def test_size_one_keeps_every_stream_answer(nereid_server, tmp_path):
    """L0_decoupled's trial with --grpc-max-response-pool-size=1: one to
    many, interleaved requests on one stream, all in order."""
    repo, _ = flood_repo(tmp_path)
    s = nereid_server(repo, "--grpc-max-response-pool-size=1")
    reqs = []
    for rid, values in (("a", [1, 2, 3, 4]), ("b", [7, 8]), ("c", [])):
        req = pb.ModelInferRequest(model_name="repeat_int32", id=rid)
        for name, dt, arr in (("IN", "INT32", np.array(values, np.int32)),
                              ("DELAY", "UINT32", np.zeros(len(values), np.uint32)),
                              ("WAIT", "UINT32", np.array([0], np.uint32))):
            t = req.inputs.add()
            t.name, t.datatype = name, dt
            t.shape.extend([len(arr)])
            req.raw_input_contents.append(arr.tobytes())
        reqs.append(req)
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        replies = list(stub.ModelStreamInfer(iter(reqs), timeout=60))
    got = {}
    for r in replies:
        assert r.error_message == ""
        ir = r.infer_response
        outs = {o.name: ir.raw_output_contents[i] for i, o in enumerate(ir.outputs)}
        got.setdefault(ir.id, []).append(int(np.frombuffer(outs["OUT"], np.int32)[0]))
    assert got == {"a": [1, 2, 3, 4], "b": [7, 8]}
