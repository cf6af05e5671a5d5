"""ONNX Runtime inputs beyond the config's plain inputs: an overridable
initializer listed as an optional config input (Triton's
L0_initializer_as_input) and batch_input tensors the core computes per
batch (Triton's L0_batch_input). Models are generated here with
python3-onnx."""
import os
import threading
import time

import numpy as np
import pytest
import requests

from http_helpers import pending_requests

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _save(repo, name, graph, config):
    os.makedirs(os.path.join(repo, name, "1"))
    model = helper.make_model(graph, producer_name="nereid-test",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, os.path.join(repo, name, "1", "model.onnx"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)


def initializer_model(repo):
    ones = helper.make_tensor("INITIALIZER", TensorProto.FLOAT, [5, 5], [1.0] * 25)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])], "init_input",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [5, 5]),
         helper.make_tensor_value_info("INITIALIZER", TensorProto.FLOAT, [5, 5])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [5, 5])],
        initializer=[ones])
    _save(repo, "add_with_initializer", graph, """
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] },
        { name: "INITIALIZER" data_type: TYPE_FP32 dims: [ 5, 5 ] optional: true } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] } ]
""")


def batch_input_model(repo, name, kinds, ragged_dims="[ -1 ]"):
    """Triton's gen_qa_ragged_models ONNX model: every output row (one per
    request) repeats BATCH_AND_SIZE_INPUT resp. BATCH_INPUT."""
    f = TensorProto.FLOAT
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, -1])
    column = helper.make_tensor("column", TensorProto.INT64, [2], [-1, 1])
    nodes = [
        helper.make_node("Reshape", ["BATCH_AND_SIZE_INPUT", "shape"], ["bs_mat"]),
        helper.make_node("Reshape", ["BATCH_INPUT", "shape"], ["batch_mat"]),
        helper.make_node("Div", ["BATCH_AND_SIZE_INPUT", "BATCH_AND_SIZE_INPUT"], ["ones"]),
        helper.make_node("Reshape", ["ones", "column"], ["expander"]),
        helper.make_node("MatMul", ["expander", "bs_mat"], ["BATCH_AND_SIZE_OUTPUT"]),
        helper.make_node("MatMul", ["expander", "batch_mat"], ["BATCH_OUTPUT"]),
    ]
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("RAGGED_INPUT", f, [-1]),
         helper.make_tensor_value_info("BATCH_AND_SIZE_INPUT", f, [-1]),
         helper.make_tensor_value_info("BATCH_INPUT", f, [-1])],
        [helper.make_tensor_value_info("BATCH_AND_SIZE_OUTPUT", f, [-1, -1]),
         helper.make_tensor_value_info("BATCH_OUTPUT", f, [-1, -1])],
        initializer=[shape, column])
    _save(repo, name, graph, f"""
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: {ragged_dims}
           allow_ragged_batch: true }} ]
output [ {{ name: "BATCH_AND_SIZE_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_input [
  {{ kind: {kinds[0]} target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32
     source_input: "RAGGED_INPUT" }},
  {{ kind: {kinds[1]} target_name: "BATCH_INPUT" data_type: TYPE_FP32
     source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: 10000000 }}
""")


@pytest.fixture
def repo(tmp_path):
    r = str(tmp_path / "models")
    os.makedirs(r)
    initializer_model(r)
    batch_input_model(r, "count_acc_zero",
                      ("BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"))
    batch_input_model(r, "acc_max",
                      ("BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"))
    batch_input_model(r, "acc_flatten",
                      ("BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ITEM_SHAPE_FLATTEN"),
                      ragged_dims="[ -1, -1 ]")
    return r


def infer(s, model, inputs, outputs=None):
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": list(a.shape),
                        "data": a.flatten().tolist()} for n, a in inputs]}
    if outputs:
        body["outputs"] = [{"name": o} for o in outputs]
    r = requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"])
            for o in r.json()["outputs"]}


def test_initializer_as_optional_input(nereid_server, repo):
    s = nereid_server(repo)
    x = np.zeros((5, 5), np.float32)
    out = infer(s, "add_with_initializer", [("INPUT", x)])["OUTPUT"]
    np.testing.assert_allclose(out, x + 1)  # the stored initializer (ones)
    x2 = np.full((5, 5), 2, np.float32)
    out = infer(s, "add_with_initializer", [("INPUT", x), ("INITIALIZER", x2)])["OUTPUT"]
    np.testing.assert_allclose(out, x + x2)  # the request's value overrides it


def _batch_of(s, model, shapes):
    """One request per shape, held until all are queued (one batch)."""
    results = [None] * len(shapes)

    def run(k):
        a = np.full(shapes[k], shapes[k][1], np.float32)
        results[k] = infer(s, model, [("RAGGED_INPUT", a)])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(shapes))]
    for k, t in enumerate(threads):  # queued in this order: the batch's order
        t.start()
        deadline = time.time() + 30
        while pending_requests(s, model) != k + 1:
            assert time.time() < deadline, "request never queued"
            time.sleep(0.01)
    for t in threads:
        t.join(60)
    return results


def test_batch_inputs(nereid_server, repo, monkeypatch):
    monkeypatch.setenv("NEREID_DELAY_SCHEDULER", "3")
    s = nereid_server(repo)
    for r in _batch_of(s, "count_acc_zero", [[1, 2], [1, 4], [1, 1]]):
        np.testing.assert_array_equal(r["BATCH_AND_SIZE_OUTPUT"], [[2, 4, 1]])
        np.testing.assert_array_equal(r["BATCH_OUTPUT"], [[0, 2, 6, 7]])
    for r in _batch_of(s, "acc_max", [[1, 2], [1, 4], [1, 1]]):
        np.testing.assert_array_equal(r["BATCH_AND_SIZE_OUTPUT"], [[2, 6, 7]])
        assert r["BATCH_OUTPUT"].shape == (1, 4)  # the largest element count as the shape
    for r in _batch_of(s, "acc_flatten", [[1, 2, 1], [1, 4, 3], [1, 1, 2]]):
        np.testing.assert_array_equal(r["BATCH_AND_SIZE_OUTPUT"], [[2, 14, 16]])
        np.testing.assert_array_equal(r["BATCH_OUTPUT"], [[2, 1, 4, 3, 1, 2]])
    # A request alone is a batch of one.
    r = infer(s, "count_acc_zero", [("RAGGED_INPUT", np.ones((1, 5), np.float32))])
    np.testing.assert_array_equal(r["BATCH_AND_SIZE_OUTPUT"], [[5]])
    np.testing.assert_array_equal(r["BATCH_OUTPUT"], [[0, 5]])
