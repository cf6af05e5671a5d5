"""Sequence batcher over HTTP: interleaved sequences on the C accumulator
backend (explicit controls, direct strategy), string correlation ids (oldest
strategy), implicit state with the output state requested, and Triton's
error texts and status codes."""
import os
import threading

import requests

ACC_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CONTROLS = """
control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] } ]
"""

MODELS = {
    "acc_direct": 'backend: "accumulator" max_batch_size: 4\n' + ACC_IO
    + 'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
    + "sequence_batching { direct { } " + CONTROLS % "TYPE_UINT64" + " }\n",
    "acc_str": 'backend: "accumulator" max_batch_size: 4\n' + ACC_IO
    + 'parameters { key: "key" value { string_value: "corrid" } }\n'
    + "sequence_batching { oldest { max_candidate_sequences: 8 } "
    + CONTROLS % "TYPE_STRING" + " }\n",
    "acc_state": 'backend: "accumulator" max_batch_size: 4\n'
    + 'parameters { key: "mode" value { string_value: "state" } }\n'
    + 'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    + 'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
    + '         { name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
    + 'sequence_batching { state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" '
    + "data_type: TYPE_INT32 dims: [ -1 ] initial_state: { data_type: TYPE_INT32 dims: [ 1 ] "
    + 'data_file: "seed" name: "seed" } } ] }\n',
}


def make_repo(root):
    repo = os.path.join(str(root), "models")
    for name, config in MODELS.items():
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config)
    os.makedirs(os.path.join(repo, "acc_state", "initial_state"))
    with open(os.path.join(repo, "acc_state", "initial_state", "seed"), "wb") as f:
        f.write((1000).to_bytes(4, "little"))
    return repo


def infer(server, model, value, seq_id, start=False, end=False, outputs=None, name="INPUT",
          shape=(1, 1)):
    params = {"sequence_id": seq_id}
    if start:
        params["sequence_start"] = True
    if end:
        params["sequence_end"] = True
    body = {"inputs": [{"name": name, "datatype": "INT32", "shape": list(shape),
                        "data": [value]}], "parameters": params}
    if outputs:
        body["outputs"] = [{"name": n} for n in outputs]
    return requests.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def output(resp, name="OUTPUT"):
    assert resp.status_code == 200, resp.text
    return next(o for o in resp.json()["outputs"] if o["name"] == name)["data"]


def test_sequences_over_http(nereid_server, tmp_path):
    server = nereid_server(make_repo(tmp_path))
    # 12 sequences over 2 instances x 4 slots (4 backlogged), each in its own thread
    results, lock = {}, threading.Lock()

    def run(q):
        total, got = 0, []
        for k in range(5):
            v = q * 100 + k
            total += v
            got.append((output(infer(server, "acc_direct", v, 10 + q, k == 0, k == 4))[0], total))
        with lock:
            results[q] = got

    threads = [threading.Thread(target=run, args=(q,)) for q in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 12
    for got in results.values():
        assert all(a == b for a, b in got)

    # string correlation ids
    assert output(infer(server, "acc_str", 5, "alpha", start=True)) == [5]
    assert output(infer(server, "acc_str", 7, "beta", start=True)) == [7]
    assert output(infer(server, "acc_str", 1, "alpha", end=True)) == [6]
    assert output(infer(server, "acc_str", 1, "beta", end=True)) == [8]

    # implicit state from a data_file; output state only when requested
    r = infer(server, "acc_state", 1, 99, start=True, outputs=["OUTPUT", "OUTPUT_STATE"])
    assert output(r) == [1001] and output(r, "OUTPUT_STATE") == [1001]
    r = infer(server, "acc_state", 2, 99, end=True, outputs=["OUTPUT"])
    assert output(r) == [1003] and len(r.json()["outputs"]) == 1


def test_sequence_errors_over_http(nereid_server, tmp_path):
    server = nereid_server(make_repo(tmp_path))
    r = infer(server, "acc_direct", 1, 0, start=True)
    assert r.status_code == 400
    assert r.json()["error"] == ("inference request to model 'acc_direct' must specify a "
                                 "non-zero or non-empty correlation ID")
    r = infer(server, "acc_direct", 1, 1234)
    assert r.status_code == 400
    assert r.json()["error"] == ("inference request for sequence 1234 to model 'acc_direct' "
                                 "must specify the START flag on the first request of the "
                                 "sequence")
    r = infer(server, "acc_str", 1, 12, start=True)
    assert r.status_code == 400
    assert "sequence batching control 'CORRID' data-type is 'UINT64', but model 'acc_str' " \
        "expects 'BYTES'" in r.json()["error"]
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [2, 1], "data": [1, 2]}],
            "parameters": {"sequence_id": 5, "sequence_start": True}}
    r = requests.post(f"{server.http_url}/v2/models/acc_direct/infer", json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == ("inference request to model 'acc_direct' must specify "
                                 "batch-size 1 due to requirements of sequence batcher")


def test_onnx_accumulator_implicit_state(nereid_server, tmp_path):
    """The seed's ONNX accumulator: state and START live in the server."""
    import shutil
    import sys
    from conftest import EXAMPLES, ROOT
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_models
    repo = os.path.join(str(tmp_path), "models")
    shutil.copytree(os.path.join(EXAMPLES, "accumulator_onnx"),
                    os.path.join(repo, "accumulator_onnx"),
                    ignore=shutil.ignore_patterns("*.onnx"))
    os.makedirs(os.path.join(repo, "accumulator_onnx", "1"), exist_ok=True)
    with open(os.path.join(repo, "accumulator_onnx", "1", "model.onnx"), "wb") as f:
        f.write(make_models.accumulator().SerializeToString())
    server = nereid_server(repo)
    results, lock = {}, threading.Lock()

    def run(q):
        total, got = 0, []
        for k in range(6):
            v = q * 10 + k + 1
            total += v
            got.append((output(infer(server, "accumulator_onnx", v, 100 + q, k == 0, k == 5))[0],
                        total))
        with lock:
            results[q] = got

    threads = [threading.Thread(target=run, args=(q,)) for q in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    for got in results.values():
        assert all(a == b for a, b in got), got
    # a restart resets the sum
    assert output(infer(server, "accumulator_onnx", 4, 7, start=True)) == [4]
    assert output(infer(server, "accumulator_onnx", 5, 7)) == [9]
    assert output(infer(server, "accumulator_onnx", 6, 7, start=True, end=True)) == [6]


def test_pytorch_sequence_models(nereid_server, tmp_path):
    """LibTorch models get START/READY controls and implicit state by name."""
    import subprocess
    import sys
    from conftest import BUILD, ROOT
    if not os.path.exists(os.path.join(BUILD, "backends", "libnereid_pytorch.so")):
        import pytest
        pytest.skip("pytorch backend not built")
    repo = os.path.join(str(tmp_path), "models")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "integration", "pytorch_models.py"),
                    repo, "--sequence"], check=True)
    server = nereid_server(repo)

    def pt(model, value, seq_id, start=False, end=False):
        r = infer(server, model, value, seq_id, start, end, name="INPUT__0", shape=(1,))
        return output(r, "OUTPUT__0")

    # implicit state (one instance, no batching: one slot, sequences in turn)
    assert pt("pt_seq_state", 5, 1, start=True) == [5]
    assert pt("pt_seq_state", 1, 1) == [6]
    assert pt("pt_seq_state", 4, 1, end=True) == [10]
    assert pt("pt_seq_state", 7, 2, start=True) == [7]
    assert pt("pt_seq_state", 1, 2, end=True) == [8]
    # state inside the model (one slot): START resets it
    assert pt("pt_seq_accumulator", 3, 9, start=True) == [3]
    assert pt("pt_seq_accumulator", 4, 9, end=True) == [7]
    assert pt("pt_seq_accumulator", 2, 10, start=True, end=True) == [2]
