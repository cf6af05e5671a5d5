"""Writes the dynamic-batching benchmark's models into DIR, X [-1,256] FP32:
  small: Y = X @ W + B, W [256,256]                       (the issue's MatMul+Add)
  large: Y = (X @ W1 + B1) @ W2 + B2, W1 [256,4096], W2 [4096,256] (8 MB of weights)
DIR/<size>.onnx for the raw runs, and DIR/repo/<size>_nobatch (default
scheduler) and DIR/repo/<size>_dynamic (dynamic_batching), each one instance
with one intra-op thread.

    /usr/bin/python3 bench/matmul_model.py DIR
"""
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

N = 256


def model(hidden):
    rng = np.random.default_rng(7)
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", N])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", N])
    dims = [N, hidden, N] if hidden else [N, N]
    nodes, inits, prev = [], [], "INPUT0"
    for i in range(len(dims) - 1):
        w = rng.standard_normal((dims[i], dims[i + 1])).astype(np.float32) / np.sqrt(dims[i])
        b = rng.standard_normal((dims[i + 1],)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        out = "OUTPUT0" if i == len(dims) - 2 else f"H{i}"
        nodes += [helper.make_node("MatMul", [prev, f"W{i}"], [f"XW{i}"]),
                  helper.make_node("Add", [f"XW{i}", f"B{i}"], [out])]
        prev = out
    graph = helper.make_graph(nodes, "matmul_add", [x], [y], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                          producer_name="nereid bench/matmul_model.py")
    m.ir_version = 7
    return m


CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
{extra}
"""


def main():
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    for size, hidden in (("small", 0), ("large", 4096)):
        m = model(hidden)
        save(m, os.path.join(root, f"{size}.onnx"))
        for kind, extra in (("nobatch", ""),
                            ("dynamic", "dynamic_batching { preferred_batch_size: [ 16 ] }")):
            d = os.path.join(root, "repo", f"{size}_{kind}")
            os.makedirs(os.path.join(d, "1"), exist_ok=True)
            save(m, os.path.join(d, "1", "model.onnx"))
            with open(os.path.join(d, "config.pbtxt"), "w") as f:
                f.write(CONFIG.format(name=f"{size}_{kind}", n=N, extra=extra))


if __name__ == "__main__":
    main()
