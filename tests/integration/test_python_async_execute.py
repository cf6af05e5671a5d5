"""`async def execute` of a decoupled Python model runs concurrently, as in
Triton (its stub schedules the coroutine on its event loop and takes the
next execute at once): several executes of ONE instance are in flight
together, called directly and through decoupled BLS with `async_exec()`
(Triton's L0_backend_python async_execute sub-suite).

No timing is asserted: the `gate` model's executes each wait until all
the requests of their group have arrived in the instance (20 s at most)
and answer with how many they saw; executes that ran one after another
would see 1, 2, ... instead of the group's size.
"""
import json
import queue
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import Server
from grpc_util import stubs
from test_python_backend import write

pb, pbg, _, _ = stubs()

GATE = """
import asyncio
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.arrived = {}  # group -> executes that started

    async def execute(self, requests):
        for r in requests:
            want = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            group = int(pb_utils.get_input_tensor_by_name(r, "G").as_numpy()[0])
            self.arrived[group] = self.arrived.get(group, 0) + 1
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while self.arrived[group] < want and loop.time() < deadline:
                await asyncio.sleep(0.01)
            out = pb_utils.Tensor("OUT", np.array(
                [json.dumps({"seen": self.arrived[group]}).encode()], dtype=np.object_))
            r.get_response_sender().send(pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Calls gate through decoupled BLS from its own async execute (Triton's
# async_execute_decouple_bls): awaits async_exec(decoupled=True), then walks
# the iterator and forwards each response.
GATE_BLS = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def one(self, r):
        call = pb_utils.InferenceRequest(
            model_name="gate", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("N", pb_utils.get_input_tensor_by_name(r, "N").as_numpy()),
                    pb_utils.Tensor("G", pb_utils.get_input_tensor_by_name(r, "G").as_numpy())])
        sender = r.get_response_sender()
        for resp in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(resp, "OUT")
            if out is not None:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.as_numpy())]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    async def execute(self, requests):
        await asyncio.gather(*[self.one(r) for r in requests])
        return None
"""

CONFIG = """
name: "{name}"
backend: "python"
model_transaction_policy {{ decoupled: true }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }},
        {{ name: "G" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("async") / "models")
    write(repo, "gate", CONFIG.format(name="gate"), GATE)
    write(repo, "gate_bls", CONFIG.format(name="gate_bls"), GATE_BLS)
    s = Server(repo, [], wait_port="grpc")
    yield s
    assert s.stop() == 0, s.output()


def request(model, n, group):
    req = pb.ModelInferRequest(model_name=model)
    for name, v in (("N", n), ("G", group)):
        t = req.inputs.add()
        t.name, t.datatype = name, "INT32"
        t.shape.extend([1])
        req.raw_input_contents.append(np.array([v], np.int32).tobytes())
    return req


def seen_by_each(server, model, n, group):
    """Sends n requests of one group on one stream, a little apart (each
    execute has started, and with executes that ran one at a time, blocked
    the instance, before the next arrives), and returns what each saw."""
    q = queue.Queue()

    def requests():
        for _ in range(n):
            yield request(model, n, group)
            time.sleep(0.2)
        q.get()  # keep the stream open until the answers came

    seen = []
    with grpc.insecure_channel(server.grpc_addr) as ch:
        call = pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(requests(), timeout=120)
        for resp in call:
            assert resp.error_message == "", resp.error_message
            raw = resp.infer_response.raw_output_contents
            if raw:  # gate_bls's final flag comes without a response
                seen.append(json.loads(raw[0][4:])["seen"])
            if len(seen) == n:
                break
        q.put(None)
        call.cancel()
    return seen


def test_async_decoupled_executes_of_one_instance_overlap(server):
    assert seen_by_each(server, "gate", 4, 1) == [4, 4, 4, 4]


def test_async_decoupled_executes_overlap_through_decoupled_bls(server):
    # the caller's four executes each wait in async_exec() for gate's first
    # response; gate's four executes wait for each other
    assert seen_by_each(server, "gate_bls", 4, 2) == [4, 4, 4, 4]


def test_several_streams_at_once(server):
    got = {}

    def one(g):
        got[g] = seen_by_each(server, "gate_bls", 2, g)

    ts = [threading.Thread(target=one, args=(g,)) for g in (3, 4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == {3: [2, 2], 4: [2, 2]}
