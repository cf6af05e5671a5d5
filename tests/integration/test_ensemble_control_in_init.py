"""Model control from the initialize of a step of an ensemble being loaded.

An ensemble load holds its composing models until it ends (issue 41), and
it waits for each step's initialize. A step whose initialize loads or
unloads another step of the same ensemble used to wait for the ensemble's
hold from the Python backend's control thread: the load, and then the
server's shutdown, never ended. Now that thread acts for the load that runs
the initialize (backend ABI 1.12, nereid_model_act_for_load): the steps the
load holds are its own to load or unload, and a load of the model being
initialized is refused at once with a clear error. (Triton waits here: its
LoadUnloadModels blocks on the locked dependency-graph nodes.)
"""
import json
import os
import threading

import numpy as np
import pytest
import requests

from conftest import Server
from http_helpers import build_infer, infer, output_array, split_response
from test_ensemble_claims import chain, ready
from test_python_backend import write

LOAD_TIMEOUT = 60  # a hang fails the test instead of blocking it

# A step: identity on INPUT0; its initialize runs CALLS (op, model) and
# writes what each call answered to <tmp>/seen_<NAME>.json.
STEP_PY = """
import json
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        seen = []
        for op, name in CALLS:
            try:
                if op == "load":
                    pb_utils.load_model(model_name=name)
                else:
                    pb_utils.unload_model(model_name=name)
                seen.append([op, name, "ok"])
            except pb_utils.TritonModelException as e:
                seen.append([op, name, str(e)])
        path = os.path.join(args["model_repository"], "..", "..", "seen_NAME.json")
        tmp = f"{path}.{os.getpid()}"  # each instance (a process) its own
        with open(tmp, "w") as f:
            json.dump(seen, f)
        os.replace(tmp, path)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

STEP_CONFIG = """
name: "NAME"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: COUNT } ]
"""

SELF_REFUSED = "is being loaded or unloaded by the call that made this one"


def make_repo(tmp_path, calls, count=1):
    """ens: X -> a -> b -> Y; a's initialize makes calls."""
    repo = str(tmp_path / "models")
    for name, made in (("a", calls), ("b", [])):
        write(repo, name, STEP_CONFIG.replace("NAME", name).replace("COUNT", str(count)),
              STEP_PY.replace("CALLS", repr(made)).replace("NAME", name))
    os.makedirs(os.path.join(repo, "ens", "1"), exist_ok=True)
    with open(os.path.join(repo, "ens", "config.pbtxt"), "w") as f:
        f.write(chain("a", "b"))
    return repo


def control(s, model, action="load"):
    return requests.post(f"{s.http_url}/v2/repository/models/{model}/{action}",
                         timeout=LOAD_TIMEOUT)


def seen(tmp_path, name="a"):
    with open(str(tmp_path / f"seen_{name}.json")) as f:
        return json.load(f)


def infer_ens(s):
    body, headers = build_infer(
        [{"name": "X", "datatype": "INT32", "data": np.array([4, 5], dtype=np.int32)}])
    r = infer(s, "ens", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    return list(output_array(doc, raw, "Y"))


def stop(s):
    rc = s.stop()  # SIGINT; a shutdown that hangs raises after 60 s
    assert rc == 0, open(s.log_path).read()


@pytest.mark.parametrize("count", [1, 2])
def test_step_initialize_loads_another_step(tmp_path, count):
    # a's initialize loads b (each of a's instances, in parallel with count
    # 2: the second waits for the first), and tries to load a itself.
    repo = make_repo(tmp_path, [["load", "b"], ["load", "a"]], count)
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        r = control(s, "ens")
        assert r.status_code == 200, r.text + open(s.log_path).read()
        assert ready(s, "ens") and ready(s, "a") and ready(s, "b")
        got = seen(tmp_path)
        assert got[0] == ["load", "b", "ok"], got
        assert got[1][:2] == ["load", "a"] and SELF_REFUSED in got[1][2], got
        assert got[1][2].startswith("Failed to load model: model 'a' "), got
        assert infer_ens(s) == [4, 5]
    finally:
        stop(s)


def test_step_initialize_unloads_another_step(tmp_path):
    # b is loaded first; a's initialize unloads it (and tries to unload
    # itself, refused); the ensemble's load then loads b again.
    repo = make_repo(tmp_path, [["unload", "b"], ["unload", "a"]])
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        assert control(s, "b").status_code == 200
        r = control(s, "ens")
        assert r.status_code == 200, r.text + open(s.log_path).read()
        got = seen(tmp_path)
        assert got[0] == ["unload", "b", "ok"], got
        assert got[1][:2] == ["unload", "a"] and SELF_REFUSED in got[1][2], got
        assert got[1][2].startswith("Failed to unload model: model 'a' "), got
        assert ready(s, "ens") and ready(s, "a") and ready(s, "b")
        assert infer_ens(s) == [4, 5]
    finally:
        stop(s)


def test_plain_model_initialize_loads_itself(tmp_path):
    # Not an ensemble: a model whose initialize loads itself is told at once
    # (it used to wait for its own load forever), and loads.
    repo = make_repo(tmp_path, [["load", "a"]])
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        r = control(s, "a")
        assert r.status_code == 200, r.text
        got = seen(tmp_path)
        assert SELF_REFUSED in got[0][2], got
        assert ready(s, "a")
    finally:
        stop(s)


def test_shutdown_during_the_ensemble_load_ends(tmp_path):
    # A stop that arrives while a's initialize loads b waits for the
    # ensemble load, which ends: the server exits cleanly.
    repo = make_repo(tmp_path, [["load", "b"]])
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    answers = []

    def load():
        try:
            answers.append(control(s, "ens").status_code)
        except requests.RequestException as e:
            answers.append(str(e))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        for _ in range(600):  # a's initialize began (its worker runs)
            if "loading: a:1" in open(s.log_path).read():
                break
            threading.Event().wait(0.05)
    finally:
        stop(s)
    t.join(LOAD_TIMEOUT)
    assert answers, "the ensemble load never answered"
