#!/usr/bin/env python3
"""Checks a running Nereid (deploy/build-image.sh runs it on the image it
built): every model of examples/models is READY, and the ONNX, Python and
ensemble models answer over KServe v2 HTTP and gRPC.

    check_image.py HTTP_PORT GRPC_PORT     (the server listens on 127.0.0.1)

tritonclient is not packaged for Debian: HTTP goes through requests, gRPC
through stubs generated from the project's proto/ (tests/integration/grpc_util).
Exits non-zero with the first mismatch."""
import os
import sys

import grpc
import numpy as np
import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "integration"))
from grpc_util import infer_request, stubs  # noqa: E402

# model -> (shape, expected OUTPUT0(a, b), expected OUTPUT1(a, b))
MODELS = {
    "add_sub_onnx": ([1, 16], lambda a, b: a + b, lambda a, b: a - b),
    "add_sub_python": ([4], lambda a, b: a + b, lambda a, b: a - b),
    "ensemble_add_sub": ([1, 16], lambda a, b: 3 * a, lambda a, b: 2 * b),
}


def inputs(shape):
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float32).reshape(shape),
            np.full(shape, 2.5, dtype=np.float32))


def check_http(base):
    r = requests.get(f"{base}/v2/health/ready", timeout=10)
    assert r.status_code == 200, f"HTTP ready: {r.status_code} {r.text}"
    index = requests.post(f"{base}/v2/repository/index", json={}, timeout=10).json()
    expected = sorted(d for d in os.listdir(os.environ["NEREID_MODELS"])
                      if os.path.isfile(os.path.join(os.environ["NEREID_MODELS"], d, "config.pbtxt")))
    ready = sorted(m["name"] for m in index if m.get("state") == "READY")
    assert ready == expected, f"models READY {ready}, expected {expected}: {index}"
    for model, (shape, out0, out1) in MODELS.items():
        a, b = inputs(shape)
        body = {"inputs": [
            {"name": n, "datatype": "FP32", "shape": shape, "data": x.flatten().tolist()}
            for n, x in (("INPUT0", a), ("INPUT1", b))]}
        r = requests.post(f"{base}/v2/models/{model}/infer", json=body, timeout=60)
        assert r.status_code == 200, f"HTTP {model}: {r.status_code} {r.text}"
        got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}
        assert np.array_equal(got["OUTPUT0"], out0(a, b)), f"HTTP {model} OUTPUT0 {got['OUTPUT0']}"
        assert np.array_equal(got["OUTPUT1"], out1(a, b)), f"HTTP {model} OUTPUT1 {got['OUTPUT1']}"
        print(f"check_image: HTTP {model} ok")


def check_grpc(addr):
    pb, pbg, _, _ = stubs()
    with grpc.insecure_channel(addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready, "gRPC ServerReady false"
        for model, (shape, out0, out1) in MODELS.items():
            a, b = inputs(shape)
            req = infer_request(pb, model, [("INPUT0", "FP32", shape, a), ("INPUT1", "FP32", shape, b)])
            r = stub.ModelInfer(req, timeout=60)
            got = {o.name: np.frombuffer(raw, np.float32).reshape(list(o.shape))
                   for o, raw in zip(r.outputs, r.raw_output_contents)}
            assert np.array_equal(got["OUTPUT0"], out0(a, b)), f"gRPC {model} OUTPUT0 {got['OUTPUT0']}"
            assert np.array_equal(got["OUTPUT1"], out1(a, b)), f"gRPC {model} OUTPUT1 {got['OUTPUT1']}"
            print(f"check_image: gRPC {model} ok")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    os.environ.setdefault("NEREID_MODELS", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "..", "examples", "models"))
    check_http(f"http://127.0.0.1:{sys.argv[1]}")
    check_grpc(f"127.0.0.1:{sys.argv[2]}")


if __name__ == "__main__":
    main()
