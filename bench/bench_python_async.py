#!/usr/bin/python3
"""Concurrent `async def execute` of a decoupled Python model, one instance.

    bench/bench_python_async.py [BUILD_DIR] [--wait SECONDS] [--requests N]

Triton's L0_backend_python async_execute case with its two models written
again here: `sleeper` (decoupled, `async def execute` that awaits
`asyncio.sleep(WAIT_SECONDS)` and answers) and `sleeper_bls` (decoupled,
`async def execute` that awaits `async_exec(decoupled=True)` of sleeper
and forwards its responses). Sends N requests back to back on one gRPC
stream to each and prints when each response came: with the executes
overlapping, all come after about WAIT seconds; one after another they
would come WAIT apart.
"""
import os
import queue
import sys
import tempfile
import time

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
import conftest  # noqa: E402
from grpc_util import stubs  # noqa: E402
from test_python_backend import write  # noqa: E402

SLEEPER = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        waits = [float(pb_utils.get_input_tensor_by_name(r, "WAIT_SECONDS").as_numpy()[0])
                 for r in requests]
        await asyncio.gather(*[asyncio.sleep(w) for w in waits])
        for r in requests:
            r.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SLEEPER_BLS = """
import asyncio
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def one(self, r):
        call = pb_utils.InferenceRequest(
            model_name="sleeper", requested_output_names=["OUT"],
            inputs=[pb_utils.get_input_tensor_by_name(r, "WAIT_SECONDS")])
        sender = r.get_response_sender()
        for resp in await call.async_exec(decoupled=True):
            out = pb_utils.get_output_tensor_by_name(resp, "OUT")
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
input [ {{ name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def run(stub, pb, model, wait_s, n):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add()
    t.name, t.datatype = "WAIT_SECONDS", "FP32"
    t.shape.extend([1])
    req.raw_input_contents.append(np.array([wait_s], np.float32).tobytes())
    done = queue.Queue()

    def requests():
        for _ in range(n):
            yield req
        done.get()

    t0 = time.monotonic()
    times = []
    call = stub.ModelStreamInfer(requests(), timeout=n * wait_s + 60)
    for resp in call:
        assert resp.error_message == "", resp.error_message
        if resp.infer_response.raw_output_contents:
            times.append(time.monotonic() - t0)
        if len(times) == n:
            break
    done.put(None)
    call.cancel()
    print(f"{model:12s} {n} x {wait_s:g} s requests on one stream, one instance: responses at "
          + " ".join(f"{x:.2f}" for x in times) + f" s (one after another: {n * wait_s:g} s)")


def main():
    args = sys.argv[1:]
    opts = {"--wait": 1.0, "--requests": 4}
    build = None
    while args:
        a = args.pop(0)
        if a in opts:
            opts[a] = type(opts[a])(args.pop(0))
        else:
            build = a
    if build:
        conftest.BUILD = os.path.abspath(build)
        conftest.NEREID = os.path.join(conftest.BUILD, "nereid")
    pb, pbg, _, _ = stubs()
    with tempfile.TemporaryDirectory() as tmp:
        repo = os.path.join(tmp, "models")
        write(repo, "sleeper", CONFIG.format(name="sleeper"), SLEEPER)
        write(repo, "sleeper_bls", CONFIG.format(name="sleeper_bls"), SLEEPER_BLS)
        server = conftest.Server(repo, [], wait_port="grpc")
        try:
            with grpc.insecure_channel(server.grpc_addr) as ch:
                stub = pbg.GRPCInferenceServiceStub(ch)
                for model in ("sleeper", "sleeper_bls"):
                    run(stub, pb, model, opts["--wait"], opts["--requests"])
        finally:
            server.stop()


if __name__ == "__main__":
    main()
