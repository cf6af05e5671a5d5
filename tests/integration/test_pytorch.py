"""PyTorch (TorchScript) backend over HTTP: models generated with Debian's
python3-torch (pytorch_models.py), exact outputs for every supported datatype,
name mappings, tuple and string outputs, dynamic batching, a stateful model,
request errors and load failures."""
import concurrent.futures
import os
import sys

import numpy as np
import pytest
import requests

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import Server  # noqa: E402
from http_helpers import build_infer, infer, output_array, split_response  # noqa: E402
import pytorch_models  # noqa: E402


@pytest.fixture(scope="module")
def pt_server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("pytorch") / "models")
    pytorch_models.write_all(repo)
    s = Server(repo, [])
    yield s
    rc = s.stop()
    assert rc == 0, f"nereid exited with {rc}:\n{s.output()}"


def run(server, model, inputs, binary=False):
    for i in inputs:
        i.setdefault("binary", binary)
    body, headers = build_infer(inputs)
    r = infer(server, model, body, headers)
    return r


def ok(server, model, inputs, binary=False):
    r = run(server, model, inputs, binary)
    assert r.status_code == 200, r.text
    return split_response(r)


def test_model_metadata(pt_server):
    r = requests.get(pt_server.http_url + "/v2/models/pt_add_sub", timeout=10)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["platform"] == "pytorch_libtorch"
    assert [i["name"] for i in doc["inputs"]] == ["INPUT__0", "INPUT__1"]


def test_add_sub_exact(pt_server):
    a = np.arange(16, dtype=np.float32) * 0.5
    b = np.linspace(-4, 4, 16, dtype=np.float32)
    doc, raw = ok(pt_server, "pt_add_sub", [
        {"name": "INPUT__0", "datatype": "FP32", "data": a},
        {"name": "INPUT__1", "datatype": "FP32", "data": b}])
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT__0"), a + b)
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT__1"), a - b)


def test_forward_argument_names(pt_server):
    # The config lists y before x; forward(x, y) returns x - y.
    x = np.array([10, 20, 30], dtype=np.float32)
    y = np.array([1, 2, 3], dtype=np.float32)
    doc, raw = ok(pt_server, "pt_arg_names", [
        {"name": "x", "datatype": "FP32", "data": x},
        {"name": "y", "datatype": "FP32", "data": y}])
    np.testing.assert_array_equal(output_array(doc, raw, "diff"), x - y)


def test_dict_input(pt_server):
    a = np.array([2, 3], dtype=np.float32)
    b = np.array([5, 7], dtype=np.float32)
    doc, raw = ok(pt_server, "pt_dict", [
        {"name": "a", "datatype": "FP32", "data": a},
        {"name": "b", "datatype": "FP32", "data": b}])
    np.testing.assert_array_equal(output_array(doc, raw, "OUTPUT__0"), a * b)


def test_tuple_outputs(pt_server):
    x = np.array([-1.5, 0.0, 2.5], dtype=np.float32)
    doc, raw = ok(pt_server, "pt_tuple", [{"name": "X__0", "datatype": "FP32", "data": x}])
    types = {o["name"]: o["datatype"] for o in doc["outputs"]}
    assert types == {"BOOL__2": "BOOL", "DOUBLE__0": "FP32", "LONG__1": "INT64"}
    np.testing.assert_array_equal(output_array(doc, raw, "DOUBLE__0"), x * 2)
    np.testing.assert_array_equal(output_array(doc, raw, "LONG__1"), [-1, 0, 2])
    np.testing.assert_array_equal(output_array(doc, raw, "BOOL__2"), [False, False, True])


ALL_TYPES = [("BOOL", np.bool_), ("UINT8", np.uint8), ("INT8", np.int8), ("INT16", np.int16),
             ("INT32", np.int32), ("INT64", np.int64), ("FP16", np.float16),
             ("FP32", np.float32), ("FP64", np.float64)]


def expected(dt, a):
    if dt == "BOOL":
        return np.logical_not(a)
    return {"UINT8": lambda v: v + 1, "INT8": lambda v: v - 1, "INT16": lambda v: v * 2,
            "INT32": lambda v: v + 7, "INT64": lambda v: v * -1, "FP16": lambda v: v * 2,
            "FP32": lambda v: v / 2, "FP64": lambda v: v + 0.25}[dt](a).astype(a.dtype)


@pytest.mark.parametrize("binary", [False, True])
def test_every_datatype(pt_server, binary):
    inputs, data = [], {}
    for i, (dt, np_t) in enumerate(ALL_TYPES):
        if dt == "BOOL":
            a = np.array([True, False, False, True])
        elif np.issubdtype(np_t, np.integer):
            info = np.iinfo(np_t)
            a = np.array([info.min + 1, 0, 3, info.max // 2], dtype=np_t)
        else:
            a = np.array([1.5, -2.0, 0.0, 1e3], dtype=np_t)
        data[dt] = a
        # FP16 has no JSON form; it always travels binary.
        inputs.append({"name": f"IN{i}_{dt}__{i}", "datatype": dt, "data": a,
                       "binary": binary or dt == "FP16"})
    body, headers = build_infer(inputs, outputs=[
        {"name": f"OUT{i}_{dt}__{i}", "parameters": {"binary_data": True}}
        for i, (dt, _) in enumerate(ALL_TYPES)])
    r = infer(pt_server, "pt_all_types", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    for i, (dt, _) in enumerate(ALL_TYPES):
        out = next(o for o in doc["outputs"] if o["name"] == f"OUT{i}_{dt}__{i}")
        assert out["datatype"] == dt and out["shape"] == [4]
        np.testing.assert_array_equal(output_array(doc, raw, out["name"]),
                                      expected(dt, data[dt]))


def test_strings(pt_server):
    texts = np.array([b"ab", b"", "x y\u00e9".encode()], dtype=object)
    doc, raw = ok(pt_server, "pt_strings", [{"name": "TEXT__0", "datatype": "BYTES",
                                             "data": texts}])
    got = output_array(doc, raw, "UPPER__0")
    # TorchScript upper-cases ASCII only; the UTF-8 bytes pass through intact.
    assert list(got) == [b"AB!", b"!", "X Y\u00e9!".encode()]


def test_batch_dimension(pt_server):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    doc, raw = ok(pt_server, "pt_batched", [{"name": "INPUT__0", "datatype": "FP32", "data": x}])
    out = output_array(doc, raw, "OUTPUT__0")
    assert out.shape == (3, 4)
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_dynamic_batching_concurrent(pt_server):
    """Concurrent requests (batch 1..3) meet in the dynamic batcher; every
    reply holds exactly its own rows."""
    def one(k):
        x = (np.arange(4 * (k % 3 + 1), dtype=np.float32) + 100 * k).reshape(-1, 4)
        doc, raw = ok(pt_server, "pt_batched", [{"name": "INPUT__0", "datatype": "FP32",
                                                 "data": x}], binary=True)
        return x, output_array(doc, raw, "OUTPUT__0")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        for x, out in pool.map(one, range(12)):
            np.testing.assert_array_equal(out, x * 2 + 1)
    r = requests.get(pt_server.http_url + "/v2/models/pt_batched/stats", timeout=10)
    stats = r.json()["model_stats"][0]
    assert int(stats["inference_count"]) >= 24


def test_accumulator_state(pt_server):
    steps = [(3, 1, 1, 3), (4, 0, 1, 7), (5, 0, 0, 7), (10, 1, 1, 10), (1, 0, 1, 11)]
    for value, start, ready, want in steps:
        doc, raw = ok(pt_server, "pt_accumulator", [
            {"name": "INPUT__0", "datatype": "INT32", "data": np.array([value], np.int32)},
            {"name": "START__1", "datatype": "INT32", "data": np.array([start], np.int32)},
            {"name": "READY__2", "datatype": "INT32", "data": np.array([ready], np.int32)}])
        assert output_array(doc, raw, "OUTPUT__0").tolist() == [want]


def test_bad_shape_is_400(pt_server):
    r = run(pt_server, "pt_add_sub", [
        {"name": "INPUT__0", "datatype": "FP32", "data": np.zeros(8, np.float32)},
        {"name": "INPUT__1", "datatype": "FP32", "data": np.zeros(16, np.float32)}])
    assert r.status_code == 400
    assert "unexpected shape for input 'INPUT__0' for model 'pt_add_sub'" in r.json()["error"]


def test_execute_failure(pt_server):
    # Shapes the config allows ([-1]) but forward() cannot subtract.
    r = run(pt_server, "pt_arg_names", [
        {"name": "x", "datatype": "FP32", "data": np.zeros(3, np.float32)},
        {"name": "y", "datatype": "FP32", "data": np.zeros(4, np.float32)}])
    assert r.status_code == 500
    err = r.json()["error"]
    assert err.startswith("PyTorch execute failure: ")
    assert "must match the size of tensor" in err
    # The instance keeps serving.
    test_forward_argument_names(pt_server)


def test_load_failures(tmp_path):
    repo = str(tmp_path / "broken")
    pytorch_models.write_broken(repo)
    pytorch_models.write_all(repo, ["pt_add_sub"])
    s = Server(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    try:
        r = requests.post(s.http_url + "/v2/repository/index", timeout=10)
        assert r.status_code == 200, r.text
        index = {m["name"]: m for m in r.json()}
        assert index["pt_add_sub"]["state"] == "READY"
        for name, (_, _, text) in pytorch_models.BROKEN.items():
            assert index[name]["state"] == "UNAVAILABLE", index[name]
            assert text in index[name]["reason"], (name, index[name])
            r = requests.get(f"{s.http_url}/v2/models/{name}/ready", timeout=10)
            assert r.status_code != 200
    finally:
        rc = s.stop()
    assert rc == 0, s.output()


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_SEQUENCE_BATCHER = bool(
    [f for f in os.listdir(os.path.join(ROOT, "src", "sched")) if f.startswith("sequence")])


@pytest.mark.skipif(not HAVE_SEQUENCE_BATCHER, reason="sequence batcher not in this tree yet")
@pytest.mark.parametrize("model", ["pt_seq_accumulator", "pt_seq_state"])
def test_sequence_models(tmp_path, model):
    """START/READY come from sequence_batching; pt_seq_state also carries
    its sum in implicit state (ACC_IN__3 -> ACC_OUT__1)."""
    repo = str(tmp_path / "seq")
    pytorch_models.write_sequence(repo)
    s = Server(repo, [])
    try:
        def step(seq, value, start=False, end=False):
            doc = {"parameters": {"sequence_id": seq, "sequence_start": start,
                                  "sequence_end": end},
                   "inputs": [{"name": "INPUT__0", "datatype": "INT32", "shape": [1],
                               "data": [value]}]}
            r = requests.post(f"{s.http_url}/v2/models/{model}/infer", json=doc, timeout=30)
            assert r.status_code == 200, r.text
            return r.json()["outputs"][0]["data"]

        assert step(7, 3, start=True) == [3]
        assert step(7, 4) == [7]
        assert step(7, 5, end=True) == [12]
        assert step(8, 10, start=True) == [10]
        assert step(8, 1, end=True) == [11]
    finally:
        rc = s.stop()
    assert rc == 0, s.output()
