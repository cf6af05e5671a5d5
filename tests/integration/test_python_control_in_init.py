"""Model control from a Python model's own code, through the real binary
(Triton's qa/L0_backend_python/bls "model loading API with BLS" step): in
explicit mode, a model whose initialize calls pb_utils.load_model /
unload_model / is_model_ready loads, and other models load while it
initializes (Triton loads unrelated models in parallel); a second load of
the same model waits for the first one.

Before the repository let go of its control lock around a model's init,
the model's own load_model waited for the lock its load held: the load
never answered.
"""
import json
import os
import threading
import time

import numpy as np
import requests

from conftest import Server
from http_helpers import build_infer, infer, output_array, split_response
from test_python_backend import write

# Runs Triton's sequence of calls in initialize, then waits for the test's
# go-ahead file (so the test can load other models meanwhile); execute
# answers what initialize saw.
LOADER = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

def ready(name, version=""):
    try:
        return pb_utils.is_model_ready(model_name=name, model_version=version)
    except pb_utils.TritonModelException as e:
        return str(e)

class TritonPythonModel:
    def initialize(self, args):
        seen = {}
        seen["before"] = ready("target")
        pb_utils.load_model(model_name="target")
        seen["loaded"] = [ready("target", "1"), ready("target", "2")]
        try:
            pb_utils.load_model(model_name="target", config='{"backend": not json')
            seen["bad_config"] = "accepted"
        except pb_utils.TritonModelException as e:
            seen["bad_config"] = "refused"
        seen["after_bad"] = [ready("target", "1"), ready("target", "2")]
        pb_utils.load_model("target", config=TARGET_V2_JSON)
        seen["v2_only"] = [ready("target", "1"), ready("target", "2")]
        files = {"file:1/model.py": open(os.path.join(args["model_repository"], "..", "target",
                                                      "1", "model.py"), "rb").read()}
        pb_utils.load_model(model_name="override_model", config=TARGET_JSON, files=files)
        seen["override"] = ready("override_model", "1")
        pb_utils.unload_model("target")
        seen["unloaded"] = ready("target")
        self.seen = seen
        go = os.path.join(args["model_repository"], "..", "..", "go")
        open(os.path.join(args["model_repository"], "..", "..", "waiting"), "w").close()
        for _ in range(600):
            if os.path.exists(go):
                break
            time.sleep(0.05)

    def execute(self, requests):
        out = json.dumps(self.seen).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.array([out], dtype=np.object_))]) for _ in requests]
"""

LOADER_CONFIG = """
name: "loader"
backend: "python"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Triton's warmup variant: the model's warmup requests run during its load.
WARMUP = """
model_warmup [ { name: "sample" batch_size: 1
                 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: 4 zero_data: true } } } ]
"""

TARGET = {
    "name": "target", "backend": "python",
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
}
TARGET_V2 = dict(TARGET, version_policy={"specific": {"versions": [2]}})
OVERRIDE = {k: v for k, v in TARGET.items() if k != "name"}  # as Triton's test: no name

TARGET_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
"""

TARGET_CONFIG = """
name: "target"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
version_policy: { all { } }
"""


def make_repo(tmp_path, warmup=False):
    repo = str(tmp_path / "models")
    loader = LOADER.replace("TARGET_V2_JSON", repr(json.dumps(TARGET_V2))).replace(
        "TARGET_JSON", repr(json.dumps(OVERRIDE)))
    write(repo, "loader", LOADER_CONFIG + (WARMUP if warmup else ""), loader)
    write(repo, "target", TARGET_CONFIG, TARGET_PY, version="1")
    write(repo, "target", None, TARGET_PY, version="2")
    write(repo, "other", TARGET_CONFIG.replace('"target"', '"other"'), TARGET_PY)
    return repo


def wait_for(path, server, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not os.path.exists(path):
        time.sleep(0.05)
    assert os.path.exists(path), open(server.log_path).read()


def load(server, name, out=None, timeout=120):
    r = requests.post(f"{server.http_url}/v2/repository/models/{name}/load", timeout=timeout)
    if out is not None:
        out.append((time.monotonic(), r.status_code, r.text))
    return r


def load_quietly(server, name):
    try:
        load(server, name)
    except requests.RequestException:
        pass  # the server stopped first


def ready(server, name, version=None):
    path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/ready"
    return requests.get(server.http_url + path, timeout=10).status_code == 200


def seen_by_loader(server):
    body, headers = build_infer(
        [{"name": "IN", "datatype": "FP32", "data": np.zeros(4, dtype=np.float32)}])
    r = infer(server, "loader", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    return json.loads(output_array(doc, raw, "OUT")[0])


def test_initialize_loads_and_unloads_models_while_others_load(tmp_path):
    repo = make_repo(tmp_path)
    go = os.path.join(str(tmp_path), "go")
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        first, second = [], []
        t1 = threading.Thread(target=load, args=(s, "loader", first))
        t1.start()
        # The loader's initialize has made its calls; it waits for the
        # go-ahead file.
        wait_for(os.path.join(str(tmp_path), "waiting"), s)
        # An unrelated model loads while loader initializes ...
        r = load(s, "other", timeout=60)
        assert r.status_code == 200, r.text
        assert ready(s, "other")
        # ... and a second load of loader waits for the first one.
        t2 = threading.Thread(target=load, args=(s, "loader", second))
        t2.start()
        time.sleep(0.5)
        assert not first and not second, (first, second)
        assert not ready(s, "loader")
        released = time.monotonic()
        open(go, "w").close()
        t1.join(60)
        t2.join(60)
        assert first and first[0][1] == 200, first
        assert second and second[0][1] == 200, second
        assert first[0][0] >= released and second[0][0] >= released
        assert ready(s, "loader")
        seen = seen_by_loader(s)
        assert seen["before"] is False or \
            seen["before"].startswith("Request for unknown model: 'target'"), seen
        assert seen["loaded"] == [True, True], seen
        assert seen["bad_config"] == "refused", seen
        assert seen["after_bad"] == [True, True], seen
        assert seen["v2_only"] == [False, True], seen
        assert seen["override"] is True, seen
        assert seen["unloaded"] is False, seen
        assert not ready(s, "target") and ready(s, "override_model")
    finally:
        open(go, "w").close()
        rc = s.stop()
    assert rc == 0, open(s.log_path).read()


def test_initialize_loads_models_with_warmup(tmp_path):
    repo = make_repo(tmp_path, warmup=True)
    open(os.path.join(str(tmp_path), "go"), "w").close()
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        r = load(s, "loader", timeout=60)
        assert r.status_code == 200, r.text
        assert seen_by_loader(s)["override"] is True
    finally:
        rc = s.stop()
    assert rc == 0, open(s.log_path).read()


def test_unload_during_initialize_waits_and_shutdown_ends(tmp_path):
    """An unload of a model that is still initializing waits for its load
    (it does not tear the half-loaded model down), and a server stopped
    while a load is under way ends cleanly."""
    repo = make_repo(tmp_path)
    go = os.path.join(str(tmp_path), "go")
    s = Server(repo, ["--model-control-mode=explicit"], "http")
    try:
        first, unloads = [], []
        t1 = threading.Thread(target=load, args=(s, "loader", first))
        t1.start()
        wait_for(os.path.join(str(tmp_path), "waiting"), s)

        def unload():
            r = requests.post(f"{s.http_url}/v2/repository/models/loader/unload", timeout=60)
            unloads.append((time.monotonic(), r.status_code))

        t2 = threading.Thread(target=unload)
        t2.start()
        time.sleep(0.5)
        assert not unloads and not first
        released = time.monotonic()
        open(go, "w").close()
        t1.join(60)
        t2.join(60)
        assert first[0][1] == 200 and unloads[0][1] == 200, (first, unloads)
        assert unloads[0][0] >= released
        assert not ready(s, "loader")
        # A load still initializing when the server stops: the stop waits
        # for it, then ends the models.
        os.unlink(go)
        os.unlink(os.path.join(str(tmp_path), "waiting"))
        t3 = threading.Thread(target=lambda: load_quietly(s, "loader"))
        t3.start()
        wait_for(os.path.join(str(tmp_path), "waiting"), s)
        rcs = []
        t4 = threading.Thread(target=lambda: rcs.append(s.stop()))
        t4.start()
        time.sleep(1)
        open(go, "w").close()
        t4.join(60)
        t3.join(60)
        assert rcs == [0], open(s.log_path).read()
    finally:
        open(go, "w").close()
        if s.proc.poll() is None:
            assert s.stop() == 0, open(s.log_path).read()


# A model that unloads itself from execute: Triton's unload returns once the
# model is out of service, so the request that asked answers, then the model
# drains and finalizes. Before, the unload waited for the drain, which waited
# for that very request: the request, the unload and shutdown hung.
SELF_UNLOAD = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = os.path.join(args["model_repository"], "..", "..")

    def execute(self, requests):
        pb_utils.unload_model("selfish")
        ready = pb_utils.is_model_ready("selfish")
        open(os.path.join(self.dir, "ready_after_unload"), "w").write(str(ready))
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]

    def finalize(self):
        open(os.path.join(self.dir, "finalized"), "w").close()
"""


def test_execute_unloads_its_own_model(tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "selfish", TARGET_CONFIG.replace('"target"', '"selfish"'), SELF_UNLOAD)
    s = Server(repo, ["--model-control-mode=explicit", "--load-model=selfish"], "http")
    try:
        body, headers = build_infer(
            [{"name": "X", "datatype": "INT32", "data": np.array([7], dtype=np.int32)}])
        r = infer(s, "selfish", body, headers)
        assert r.status_code == 200, r.text
        doc, raw = split_response(r)
        assert list(output_array(doc, raw, "Y")) == [7]
        wait_for(str(tmp_path / "finalized"), s)
        assert open(str(tmp_path / "ready_after_unload")).read() == "False"
        want = [{"name": "selfish", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # finalize ran; the state follows
            rows = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=10).json()
            if rows == want:
                break
            time.sleep(0.05)
        assert rows == want
    finally:
        rc = s.stop()
    assert rc == 0, open(s.log_path).read()
