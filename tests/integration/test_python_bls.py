"""BLS and response senders beyond execute, through the real binary:
BLS from a decoupled model's own threads after execute returned and from
an `async def execute` (several calls in flight with asyncio.gather),
decoupled BLS whose ResponseIterator yields each response as it arrives
and whose cancel() cancels the request in the called model, BLS outside
initialize..finalize refused with Triton's exception, and a decoupled
response sender's is_cancelled() after the client cancelled its gRPC
stream (Triton's L0_backend_python decoupled / async_execute cases); and
a model that is not decoupled answering through its response sender
(Triton's rules: one response plus the final flag, before or after execute
returned; L0_backend_python response_sender).
"""
import json
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import Server
from grpc_util import stubs
from test_python_backend import write

pb, pbg, _, _ = stubs()

# Decoupled: sends X+1 for each response, up to N responses, DELAY_MS apart,
# until its request is cancelled (then one CANCELLED error, final).
UNTIL_CANCELLED = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        r = requests[0]
        x = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
        n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
        delay = int(pb_utils.get_input_tensor_by_name(r, "DELAY_MS").as_numpy()[0])
        s = r.get_response_sender()
        for i in range(n):
            if r.is_cancelled():
                s.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "request has been cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            s.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", np.array([x + 1], np.int32))]))
            time.sleep(delay / 1000)
        s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

UNTIL_CANCELLED_CONFIG = """
name: "until_cancelled"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

IDENT = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests]
"""

IDENT_CONFIG = """
name: "ident"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

HELPERS = """
import asyncio
import json
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

def ident(x):
    return pb_utils.InferenceRequest(model_name="ident", requested_output_names=["Y"],
                                     inputs=[pb_utils.Tensor("X", np.array(x, np.int32))])

def until_cancelled(x, n, delay_ms):
    return pb_utils.InferenceRequest(
        model_name="until_cancelled", requested_output_names=["Y"],
        inputs=[pb_utils.Tensor("X", np.array([x], np.int32)),
                pb_utils.Tensor("N", np.array([n], np.int32)),
                pb_utils.Tensor("DELAY_MS", np.array([delay_ms], np.int32))])

def y(resp):
    if resp.has_error():
        return "error: " + resp.error().message()
    t = pb_utils.get_output_tensor_by_name(resp, "Y")
    return t.as_numpy().tolist() if t is not None else None

def out(obj):
    return pb_utils.InferenceResponse([pb_utils.Tensor(
        "OUT", np.array([json.dumps(obj).encode()], dtype=np.object_))])
"""

# Decoupled; execute returns at once, a thread makes the BLS calls later
# (sync, and decoupled through the iterator) and sends what it got.
DEC_THREAD = HELPERS + """
class TritonPythonModel:
    def initialize(self, args):
        try:
            ident([1]).exec()
            self.init_bls = None
        except pb_utils.TritonModelException as e:
            self.init_bls = str(e)

    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy().tolist()
            threading.Thread(target=self.work, args=(r.get_response_sender(), x)).start()
        return None

    def work(self, sender, x):
        res = {"init_bls": self.init_bls}
        res["sync"] = y(ident(x).exec())
        res["stream"] = [y(o) for o in until_cancelled(x[0], 3, 0).exec(decoupled=True)]
        it = until_cancelled(x[0], 2, 0).exec(decoupled=True)
        res["twice"] = [[y(o) for o in it], [y(o) for o in it]]
        # Triton's iteration rules: a loop after next() resumes; one after
        # the last response starts again; a loop left early resumes
        it = until_cancelled(x[0], 3, 0).exec(decoupled=True)
        first = [y(next(it))]
        rest = [y(o) for o in it]
        again = [y(o) for o in it]
        part = []
        for o in it:
            part.append(y(o))
            if len(part) == 2:
                break
        res["resume"] = [first, rest, again, part, [y(next(it))], [y(o) for o in it]]
        sender.send(out(res), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

DEC_CONFIG = """
name: "{name}"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

# Decoupled with an async execute: several BLS calls in flight at once.
DEC_ASYNC = HELPERS + """
class TritonPythonModel:
    async def execute(self, requests):
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            got = await asyncio.gather(*[ident([x + i]).async_exec() for i in range(4)])
            it = await until_cancelled(x, 2, 0).async_exec(decoupled=True)
            r.get_response_sender().send(
                out({"gather": [y(g) for g in got], "stream": [y(o) for o in it]}),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Not decoupled: sums the responses of until_cancelled and cancels the
# stream once the sum reaches LIMIT; then cancels again (a no-op).
CANCELLER = HELPERS + """
class TritonPythonModel:
    def execute(self, requests):
        res = []
        for r in requests:
            limit = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            it = until_cancelled(0, 1000, 10).exec(decoupled=True)
            total, n, cancelled, errors = 0, 0, False, []
            for o in it:
                if o.has_error():
                    cancelled = o.error().code() == pb_utils.TritonError.CANCELLED
                    errors.append(o.error().message())
                    break
                t = pb_utils.get_output_tensor_by_name(o, "Y")
                if t is None:
                    continue
                total += int(t.as_numpy()[0])
                n += 1
                if total >= limit:
                    it.cancel()
            it.cancel()
            res.append(out({"total": total, "n": n, "cancelled": cancelled,
                            "errors": errors}))
        return res
"""

CANCELLER_CONFIG = """
name: "canceller"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# Decoupled: a thread polls the sender's is_cancelled() and logs when the
# client's cancellation shows.
WATCH = """
import threading
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self.watch, args=(r.get_response_sender(),)).start()
        return None

    def watch(self, sender):
        pb_utils.Logger.log_info("watch: started")
        for _ in range(300):
            if sender.is_cancelled():
                pb_utils.Logger.log_info("watch: sender cancelled")
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            time.sleep(0.1)
        pb_utils.Logger.log_info("watch: never cancelled")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

WATCH_CONFIG = """
name: "watch"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


# Not decoupled: MODE says how request is answered (sender before/after
# return, returned, both, misuse); the response carries X*10 + how.
SINGLE = """
import asyncio
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

def resp(x, how):
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([[x * 10 + how]], np.int32))])

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().flat[0].decode()
            x = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().flat[0])
            ret = None
            if mode == "returned":
                ret = resp(x, 0)
            elif mode == "pre":
                r.get_response_sender().send(resp(x, 1),
                                             flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "pre_then_final":
                s = r.get_response_sender()
                s.send(resp(x, 2))
                s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "post":
                s = r.get_response_sender()
                def later(s=s, x=x):
                    time.sleep(0.05)
                    s.send(resp(x, 3))
                    time.sleep(0.05)
                    s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                threading.Thread(target=later).start()
            elif mode == "pre_and_returned":
                r.get_response_sender().send(resp(x, 4),
                                             flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                ret = resp(x, 5)
            elif mode == "two_pre":
                s = r.get_response_sender()
                s.send(resp(x, 6))
                s.send(resp(x, 7))
            elif mode == "final_only":
                r.get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "returned_then_send":
                ret = resp(x, 8)
                s = r.get_response_sender()
                def after(s=s, x=x):
                    time.sleep(0.05)
                    try:
                        s.send(resp(x, 9))
                    except pb_utils.TritonModelException as e:
                        pb_utils.Logger.log_info(f"single: {e}")
                threading.Thread(target=after).start()
            out.append(ret)
        return out
"""

SINGLE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
input [ {{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }},
        {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# The same with an async execute whose task answers after it returned.
SINGLE_ASYNC = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for r in requests:
            x = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().flat[0])
            s = r.get_response_sender()
            async def later(s=s, x=x):
                await asyncio.sleep(0.05)
                s.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", np.array([[x * 10 + 3]], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            t = asyncio.create_task(later())
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        return None
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("bls") / "models")
    write(repo, "until_cancelled", UNTIL_CANCELLED_CONFIG, UNTIL_CANCELLED)
    write(repo, "ident", IDENT_CONFIG, IDENT)
    write(repo, "dec_thread", DEC_CONFIG.format(name="dec_thread"), DEC_THREAD)
    write(repo, "dec_async", DEC_CONFIG.format(name="dec_async"), DEC_ASYNC)
    write(repo, "canceller", CANCELLER_CONFIG, CANCELLER)
    write(repo, "watch", WATCH_CONFIG, WATCH)
    write(repo, "single", SINGLE_CONFIG.format(name="single", delay=0), SINGLE)
    write(repo, "single_batched", SINGLE_CONFIG.format(name="single_batched", delay=300000),
          SINGLE)
    write(repo, "single_async", SINGLE_CONFIG.format(name="single_async", delay=0),
          SINGLE_ASYNC)
    s = Server(repo, ["--log-verbose=1"], wait_port="grpc")
    yield s
    assert s.stop() == 0, s.output()


def request(model, x):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add()
    t.name, t.datatype = "X", "INT32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([x], np.int32).tobytes())
    return req


def stream(server, model, x):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        return list(pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(
            iter([request(model, x)]), timeout=60))


def result(resp):
    assert resp.error_message == "", resp.error_message
    raw = resp.infer_response.raw_output_contents[0]
    return json.loads(raw[4:])


def test_bls_from_a_decoupled_models_thread_after_execute(server):
    (r,) = stream(server, "dec_thread", 5)
    res = result(r)
    # BLS in initialize raises Triton's exception
    assert res["init_bls"] == "BLS is only supported during the 'execute' function."
    assert res["sync"] == [5]
    # three responses, then the flags-only final as an empty response
    assert res["stream"] == [[6], [6], [6], None]
    # the iterator can be walked again from the start
    assert res["twice"] == [[[6], [6], None], [[6], [6], None]]
    # 3 responses and the empty final one, read as Triton's ResponseIterator
    assert res["resume"] == [[[6]], [[6], [6], None], [[6], [6], [6], None],
                             [[6], [6]], [[6]], [None]]


def test_async_bls_gather_from_async_decoupled_execute(server):
    (r,) = stream(server, "dec_async", 10)
    res = result(r)
    assert res["gather"] == [[10], [11], [12], [13]]
    assert res["stream"] == [[11], [11], None]


def test_response_iterator_cancel_cancels_the_called_model(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        r = pbg.GRPCInferenceServiceStub(ch).ModelInfer(request("canceller", 5), timeout=60)
    res = json.loads(r.raw_output_contents[0][4:])
    # the called model saw is_cancelled() and ended with CANCELLED long
    # before its 1000 responses (so the iterator got them as they came)
    assert res["cancelled"], res
    assert res["errors"] == ["request has been cancelled"]
    assert 5 <= res["total"] < 1000 and res["n"] == res["total"]


def test_sender_is_cancelled_after_the_stream_is_cancelled(server):
    started = threading.Event()

    def requests_then_wait():
        yield request("watch", 1)
        started.wait(30)

    with grpc.insecure_channel(server.grpc_addr) as ch:
        call = pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(requests_then_wait(),
                                                                 timeout=60)
        deadline = time.time() + 30
        while "watch: started" not in server.output() and time.time() < deadline:
            time.sleep(0.05)
        assert "watch: started" in server.output()
        call.cancel()
        started.set()
        with pytest.raises(grpc.RpcError) as e:
            list(call)
        assert e.value.code() == grpc.StatusCode.CANCELLED
    deadline = time.time() + 30
    while "watch: sender" not in server.output() and time.time() < deadline:
        time.sleep(0.05)
    assert "watch: sender cancelled" in server.output()
    assert "watch: never cancelled" not in server.output()


def single(server, model, mode, x):
    req = pb.ModelInferRequest(model_name=model)
    for name, dt, raw in (("MODE", "BYTES", len(mode).to_bytes(4, "little") + mode.encode()),
                          ("X", "INT32", np.array([x], np.int32).tobytes())):
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend([1, 1])
        req.raw_input_contents.append(raw)
    with grpc.insecure_channel(server.grpc_addr) as ch:
        try:
            r = pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=60)
        except grpc.RpcError as e:
            return "error: " + e.details()
    return int(np.frombuffer(r.raw_output_contents[0], np.int32)[0])


@pytest.mark.parametrize("mode,how", [
    ("returned", 0), ("pre", 1), ("pre_then_final", 2), ("post", 3),
    # the sent response wins; returning another fails execute, but that
    # request was answered already (Triton drops the error)
    ("pre_and_returned", 4),
    # the second send raises in execute; the first response was the answer
    ("two_pre", 6),
    ("returned_then_send", 8)])
def test_non_decoupled_response_sender(server, mode, how):
    assert single(server, "single", mode, 7) == 70 + how


def test_non_decoupled_response_sender_misuse(server):
    got = single(server, "single", "final_only", 1)
    assert got.startswith("error: Failed to process the request(s) for model 'single_0', "
                          "message: TritonModelException: Unable to send response. "
                          "Non-decoupled model cannot send complete final before sending a "
                          "response."), got
    single(server, "single", "returned_then_send", 2)
    deadline = time.time() + 30
    text = "single: Unable to send response. Non-decoupled model cannot send more than one"
    while text not in server.output() and time.time() < deadline:
        time.sleep(0.05)
    assert text in server.output()


def test_non_decoupled_response_sender_in_a_batch(server):
    # one dynamic batch: each request answered its own way
    modes = ["returned", "pre", "post", "pre_then_final"]
    results = [None] * len(modes)

    def run(i):
        results[i] = single(server, "single_batched", modes[i], i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(modes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [0, 11, 23, 32]


def test_non_decoupled_async_execute_answers_from_a_task(server):
    assert single(server, "single_async", "", 4) == 43


# The model's is_ready() answers model-ready checks (Triton's user-defined
# readiness): WHAT in its config parameters says what it returns.
READY = """
import asyncio
import json
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.what = cfg["parameters"]["WHAT"]["string_value"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests]

    def is_ready(self):
        if self.what == "exception":
            raise RuntimeError("not today")
        if self.what == "non_bool":
            return "yes"
        if self.what == "coroutine":
            async def ok():
                return True
            return ok()
        return self.what == "true"
"""

READY_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }} ]
parameters {{ key: "WHAT" value: {{ string_value: "{what}" }} }}
"""


@pytest.fixture(scope="module")
def ready_server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("ready") / "models")
    for what in ("true", "false", "exception", "non_bool", "coroutine"):
        write(repo, f"ready_{what}", READY_CONFIG.format(name=f"ready_{what}", what=what), READY)
    write(repo, "ident", IDENT_CONFIG, IDENT)
    s = Server(repo, ["--log-verbose=1", "--strict-readiness=false",
                      "--backend-config=python,restart-worker=eager"], wait_port="grpc")
    yield s
    assert s.stop() == 0, s.output()


def http_ready(server, model):
    import requests
    return requests.get(f"{server.http_url}/v2/models/{model}/ready", timeout=30).status_code == 200


def grpc_ready(server, model):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        return pbg.GRPCInferenceServiceStub(ch).ModelReady(
            pb.ModelReadyRequest(name=model), timeout=30).ready


@pytest.mark.parametrize("what,ready,reason", [
    ("true", True, None), ("coroutine", True, None),
    ("false", False, "Model 'ready_false_0' is not ready (user-defined check failed)."),
    ("exception", False, "RuntimeError: not today"),
    ("non_bool", False, "is_ready() must return a boolean value")])
def test_user_defined_is_ready(ready_server, what, ready, reason):
    model = f"ready_{what}"
    assert http_ready(ready_server, model) is ready
    assert grpc_ready(ready_server, model) is ready
    if reason:
        assert (f"Model '{model}' version 1 is not ready: {reason}"
                in ready_server.output())
    # inference is not affected
    with grpc.insecure_channel(ready_server.grpc_addr) as ch:
        req = pb.ModelInferRequest(model_name=model)
        t = req.inputs.add()
        t.name, t.datatype = "X", "INT32"
        t.shape.extend([1])
        req.raw_input_contents.append(np.array([3], np.int32).tobytes())
        r = pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert np.frombuffer(r.raw_output_contents[0], np.int32).tolist() == [3]


def test_killed_worker_is_restarted_and_ready_again(ready_server):
    """With restart-worker=eager, a killed worker is restarted as soon as its
    death is seen, with no request; the model is not ready until then (that window is held open and
    checked in test_python_worker_restart.py), then ready and serving."""
    import os
    import signal
    import subprocess
    assert http_ready(ready_server, "ident")
    def under_server(pid):  # other servers on the machine may run an ident_0 too
        for _ in range(4):
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
            if pid == ready_server.proc.pid:
                return True
        return False

    def workers():
        out = subprocess.run(["pgrep", "-f", "triton_python_backend_stub ident_0"],
                             capture_output=True, text=True).stdout.split()
        return [int(p) for p in out if under_server(int(p))]

    mine = workers()
    assert len(mine) == 1, mine
    os.kill(mine[0], signal.SIGKILL)
    deadline = time.time() + 30
    while ("restarted the worker of 'ident_0'" not in ready_server.output()
           and time.time() < deadline):
        time.sleep(0.05)
    out = ready_server.output()
    assert "the worker of 'ident_0' ended; restarting it (not ready until then)" in out
    assert "restarted the worker of 'ident_0'" in out
    assert http_ready(ready_server, "ident")
    assert grpc_ready(ready_server, "ident")
    again = workers()
    assert len(again) == 1 and again != mine, (mine, again)
