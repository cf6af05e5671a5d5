"""Helpers for the gRPC integration tests.

Python stubs are generated once per test process from the project's own
proto/*.proto with Debian's protoc and grpc_python_plugin, into a temporary
directory. `identity_repo(path)` writes a repository with one identity model
per datatype plus a few special models.
"""
import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTO = os.path.join(ROOT, "proto")

_modules = None


def stubs():
    """Returns (pb, pb_grpc, health_pb, health_grpc) generated from proto/."""
    global _modules
    if _modules is None:
        out = tempfile.mkdtemp(prefix="nereid-grpc-stubs-")
        atexit.register(shutil.rmtree, out, True)
        protos = [os.path.join(PROTO, f) for f in sorted(os.listdir(PROTO)) if f.endswith(".proto")]
        subprocess.run(["protoc", "-I", PROTO, f"--python_out={out}", f"--grpc_out={out}",
                        "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin"] + protos,
                       check=True)
        sys.path.insert(0, out)
        _modules = tuple(importlib.import_module(m) for m in (
            "grpc_service_pb2", "grpc_service_pb2_grpc", "health_pb2", "health_pb2_grpc"))
    return _modules


# protocol datatype -> (config type, numpy dtype, typed contents field or None)
DATATYPES = {
    "BOOL": ("TYPE_BOOL", np.bool_, "bool_contents"),
    "UINT8": ("TYPE_UINT8", np.uint8, "uint_contents"),
    "UINT16": ("TYPE_UINT16", np.uint16, "uint_contents"),
    "UINT32": ("TYPE_UINT32", np.uint32, "uint_contents"),
    "UINT64": ("TYPE_UINT64", np.uint64, "uint64_contents"),
    "INT8": ("TYPE_INT8", np.int8, "int_contents"),
    "INT16": ("TYPE_INT16", np.int16, "int_contents"),
    "INT32": ("TYPE_INT32", np.int32, "int_contents"),
    "INT64": ("TYPE_INT64", np.int64, "int64_contents"),
    "FP16": ("TYPE_FP16", np.float16, None),
    "FP32": ("TYPE_FP32", np.float32, "fp32_contents"),
    "FP64": ("TYPE_FP64", np.float64, "fp64_contents"),
    "BYTES": ("TYPE_STRING", np.object_, "bytes_contents"),
    "BF16": ("TYPE_BF16", np.uint16, None),
}


def model_name(dt):
    return "id_" + dt.lower()


def _write(repo, name, text):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(text)


def identity_repo(repo):
    """One identity model per datatype (id_<dt>, dims [-1], no batching), a
    batching FP32 identity `id_batch`, and `slow` on the testing backend."""
    for dt, (cfg, _, _) in DATATYPES.items():
        _write(repo, model_name(dt), f"""
name: "{model_name(dt)}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {cfg} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {cfg} dims: [ -1 ] }} ]
""")
    _write(repo, "id_batch", """
name: "id_batch"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
""")
    _write(repo, "slow", """
name: "slow"
backend: "testing"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 4 kind: KIND_CPU } ]
""")
    return repo


def serialize_bytes(items):
    """Triton's raw BYTES form: 4-byte little-endian length + bytes, per item."""
    out = b""
    for it in items:
        out += len(it).to_bytes(4, "little") + it
    return out


def sample(dt, n):
    """n deterministic elements of datatype dt (numpy array, or list of bytes)."""
    _, npdt, _ = DATATYPES[dt]
    if dt == "BYTES":
        return [f"s{i}\x00\xff".encode("latin-1") * (i % 3) for i in range(n)]
    if dt == "BOOL":
        return np.array([i % 3 == 0 for i in range(n)], dtype=np.bool_)
    if dt in ("FP16", "FP32", "FP64"):
        return (np.arange(n) * 0.5 - 3).astype(npdt)
    if dt == "BF16":
        return (np.arange(n) + 0x3f80).astype(np.uint16)
    info = np.iinfo(npdt)
    return np.array([info.min, info.max, 0, 1, 7][:n] + list(range(max(0, n - 5))), dtype=npdt)


def raw_bytes(dt, values):
    return serialize_bytes(values) if dt == "BYTES" else np.asarray(values).tobytes()


def infer_request(pb, model, inputs, raw=True, id="", outputs=None, version=""):
    """inputs: list of (name, dt, shape, values)."""
    req = pb.ModelInferRequest(model_name=model, model_version=version, id=id)
    for name, dt, shape, values in inputs:
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend(shape)
        if raw:
            req.raw_input_contents.append(raw_bytes(dt, values))
        else:
            field = DATATYPES[dt][2]
            getattr(t.contents, field).extend(
                list(values) if dt == "BYTES" else np.asarray(values).tolist())
    for o in outputs or []:
        req.outputs.add().name = o
    return req
