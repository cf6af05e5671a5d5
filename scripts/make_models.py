#!/usr/bin/python3
"""Generates the ONNX models Nereid's examples and tests use.

    make_models.py [DIR]          example models into DIR (default examples/models)
    make_models.py --test DIR     a test repository (models and config.pbtxt) into DIR
    make_models.py --many N DIR   N add_sub models (add_sub_0000 ...) into DIR

Run with Debian's /usr/bin/python3 (python3-onnx). Example models are a list
of (path, generator) pairs: a generator returns an onnx.ModelProto. Their
config.pbtxt files are committed next to them; only the .onnx files are
generated. Idempotent: exits before importing onnx when every output exists
and is newer than this script.
"""
import os
import sys

# Element types by Triton datatype name (onnx.TensorProto values, so the list
# is usable before onnx is imported).
ONNX_TYPES = {
    "BOOL": 9, "UINT8": 2, "UINT16": 4, "UINT32": 12, "UINT64": 13,
    "INT8": 3, "INT16": 5, "INT32": 6, "INT64": 7,
    "FP16": 10, "FP32": 1, "FP64": 11, "BYTES": 8, "BF16": 16,
}
OPSET = 13


def _model(graph):
    from onnx import helper
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="nereid make_models.py")
    m.ir_version = 7  # readable by every ONNX Runtime since 1.8
    return m


def add_sub(dims=(-1, 16), elem="FP32"):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    from onnx import helper
    t = ONNX_TYPES[elem]
    shape = [None if d < 0 else d for d in dims]
    io = lambda n: helper.make_tensor_value_info(n, t, shape)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        "add_sub", [io("INPUT0"), io("INPUT1")], [io("OUTPUT0"), io("OUTPUT1")])
    return _model(graph)


def identity(elem, dims=(-1, 4)):
    """OUTPUT0 = INPUT0 for any element type."""
    from onnx import helper
    t = ONNX_TYPES[elem]
    shape = [None if d < 0 else d for d in dims]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", t, shape)],
        [helper.make_tensor_value_info("OUTPUT0", t, shape)])
    return _model(graph)


def accumulator():
    """Triton's implicit-state accumulator: OUTPUT = OUTPUT_STATE = INPUT when
    START, else INPUT + INPUT_STATE (INPUT_STATE / START are fed by the
    sequence batcher, not by clients)."""
    from onnx import helper
    t = ONNX_TYPES["INT32"]
    io = lambda n: helper.make_tensor_value_info(n, t, [None, None if "STATE" in n else 1])
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["SUM"]),
         helper.make_node("Cast", ["START"], ["IS_START"], to=ONNX_TYPES["BOOL"]),
         helper.make_node("Where", ["IS_START", "INPUT", "SUM"], ["OUTPUT_STATE"]),
         helper.make_node("Identity", ["OUTPUT_STATE"], ["OUTPUT"])],
        "accumulator", [io("INPUT"), io("START"), io("INPUT_STATE")],
        [io("OUTPUT"), io("OUTPUT_STATE")])
    return _model(graph)


# Example models: (path under the repository, generator).
EXAMPLES = [
    ("add_sub_onnx/1/model.onnx", lambda: add_sub((-1, 16))),
    ("accumulator_onnx/1/model.onnx", accumulator),
]

# Test repository: (model name, generator or None for no model file,
# config.pbtxt text or None for no config). Names are what the tests use.
IDENTITY_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                  "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"]


def _identity_config(name, elem, dims="[ 4 ]"):
    dt = "STRING" if elem == "BYTES" else elem
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_{dt} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_{dt} dims: {dims} }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
"""


ADD_SUB_IO = """input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def _add_sub_config(name, extra="", io=ADD_SUB_IO, mbs=8):
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {mbs}\n' + io +
            'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + extra)


def _params(**kv):
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                   for k, v in kv.items())


def test_models():
    models = []
    for elem in IDENTITY_TYPES:
        name = "identity_" + elem.lower()
        models.append((name, lambda e=elem: identity(e), _identity_config(name, elem)))
    models += [
        ("identity_var", lambda: identity("FP32", (-1, -1)),
         _identity_config("identity_var", "FP32", "[ -1 ]")),
        ("add_sub", lambda: add_sub((-1, 16)),
         _add_sub_config("add_sub", _params(intra_op_thread_count="1"))),
        ("add_sub_nobatch", lambda: add_sub((16,)),
         _add_sub_config("add_sub_nobatch", _params(intra_op_thread_count="1"), mbs=0)),
        ("params_ok", lambda: add_sub((-1, 16)), _add_sub_config(
            "params_ok", _params(intra_op_thread_count="1", inter_op_thread_count="1",
                                 execution_mode="1", enable_mem_arena="false") +
            "optimization { graph { level: 1 } }\n")),
        ("bad_execution_mode", lambda: add_sub((-1, 16)),
         _add_sub_config("bad_execution_mode", _params(execution_mode="2"))),
        ("bad_thread_count", lambda: add_sub((-1, 16)),
         _add_sub_config("bad_thread_count", _params(intra_op_thread_count="abc"))),
        ("missing_file", None, _add_sub_config("missing_file")),
        ("bad_datatype", lambda: add_sub((-1, 16)), _add_sub_config(
            "bad_datatype", io=ADD_SUB_IO.replace("TYPE_FP32", "TYPE_INT32", 1))),
        ("bad_input_name", lambda: add_sub((-1, 16)), _add_sub_config(
            "bad_input_name", io=ADD_SUB_IO.replace('"INPUT1"', '"INPUTX"'))),
        ("bad_dims", lambda: add_sub((-1, 16)), _add_sub_config(
            "bad_dims", io=ADD_SUB_IO.replace("[ 16 ]", "[ 8 ]"))),
        ("auto_batch", lambda: add_sub((-1, 16)), 'platform: "onnxruntime_onnx"\n'),
        ("auto_nobatch", lambda: add_sub((16,)), 'platform: "onnxruntime_onnx"\n'),
        ("auto_nobatch_mbs", lambda: add_sub((16,)),
         'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'),
        ("auto_noconfig", lambda: add_sub((-1, 16)), None),
    ]
    return models


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_test_repository(root):
    """Writes every test model (and its config.pbtxt) under root."""
    for name, gen, config in test_models():
        os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
        if gen is not None:
            _write(os.path.join(root, name, "1", "model.onnx"), gen().SerializeToString())
        if config is not None:
            _write(os.path.join(root, name, "config.pbtxt"), config.encode())


def make_many(root, n, extra=""):
    """Writes n add_sub models (FP32 [-1,16], one CPU instance, shared ONNX
    Runtime thread pools) named add_sub_0000, add_sub_0001, ... under root.
    extra is appended to every config.pbtxt."""
    data = add_sub((-1, 16)).SerializeToString()
    for i in range(n):
        name = f"add_sub_{i:04d}"
        _write(os.path.join(root, name, "1", "model.onnx"), data)
        _write(os.path.join(root, name, "config.pbtxt"), _add_sub_config(name, extra).encode())


def make_examples(root):
    script_mtime = os.path.getmtime(__file__)
    todo = [(p, g) for p, g in EXAMPLES
            if not os.path.exists(os.path.join(root, p))
            or os.path.getmtime(os.path.join(root, p)) < script_mtime]
    for rel, gen in todo:
        _write(os.path.join(root, rel), gen().SerializeToString())
        print("make_models: wrote", os.path.join(root, rel))


def main(argv):
    if len(argv) >= 2 and argv[0] == "--test":
        make_test_repository(argv[1])
    elif len(argv) >= 3 and argv[0] == "--many":
        make_many(argv[2], int(argv[1]))
    else:
        make_examples(argv[0] if argv else "examples/models")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
