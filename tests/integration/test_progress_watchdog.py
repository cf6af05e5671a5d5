"""--model-progress-timeout-secs: a model whose execution has not returned
for the timeout, while none of its instances completed one, is wedged: it
answers not ready (and so does the server, under --strict-readiness), new
requests are refused at once with 503, the event is logged and counted in
nereid_model_progress_timeouts_total; the first execution that returns
clears it. The testing backend's execution waits on a file the test
creates, so the test decides when the model is stuck and when it recovers;
every wait has a deadline only against hangs."""
import os
import threading
import time

import requests

SLOW = """backend: "testing" max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
COUNTER = 'nereid_model_progress_timeouts_total{model="slow",version="1"}'


def repo(tmp_path):
    path = tmp_path / "models"
    os.makedirs(path / "slow" / "1")
    (path / "slow" / "config.pbtxt").write_text(SLOW)
    return str(path)


def infer(s, parameters=None, timeout=60):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
    if parameters:
        body["parameters"] = parameters
    return requests.post(f"{s.http_url}/v2/models/slow/infer", json=body, timeout=timeout)


def wait_for(cond, what, limit=60):
    deadline = time.time() + limit
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.05)


def status(s, path):
    return requests.get(f"{s.http_url}{path}", timeout=10).status_code


def counter(s):
    for line in requests.get(f"{s.metrics_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(COUNTER):
            return int(line.split()[-1])
    return None


def test_wedged_model_is_not_ready_refuses_and_recovers(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path), "--model-progress-timeout-secs=1")
    assert counter(s) == 0
    go, started = tmp_path / "go", tmp_path / "started"
    stuck = {}
    t = threading.Thread(target=lambda: stuck.update(r=infer(
        s, {"wait_for_file": str(go), "started_file": str(started)})))
    t.start()
    try:
        wait_for(started.exists, "the execution did not start")
        wait_for(lambda: status(s, "/v2/models/slow/ready") != 200, "model stayed ready")
        assert status(s, "/v2/health/ready") != 200  # --strict-readiness (default)
        assert status(s, "/v2/health/live") == 200
        r = infer(s, timeout=10)
        assert r.status_code == 503, r.text
        assert "is not making progress" in r.json()["error"]
        assert counter(s) == 1
        assert "'slow' version 1 is not making progress" in s.output()
    finally:
        go.write_text("")
        t.join(60)
    assert stuck["r"].status_code == 200, stuck["r"].text
    wait_for(lambda: status(s, "/v2/models/slow/ready") == 200, "model did not recover")
    assert status(s, "/v2/health/ready") == 200
    assert infer(s).status_code == 200
    assert counter(s) == 1
    assert "'slow' version 1 is making progress again" in s.output()


def test_off_by_default(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path))
    assert infer(s).status_code == 200
    assert counter(s) is None
    assert "nereid_model_progress_timeouts_total" not in requests.get(
        f"{s.metrics_url}/metrics", timeout=10).text


HANG_PY = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            while x[0] < 0:  # a model stuck for good (a deadlock, a lost wait)
                time.sleep(1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''
HANG_CONFIG = SLOW.replace('backend: "testing"', 'backend: "python"')


def test_wedged_python_worker_is_restarted(nereid_server, tmp_path):
    path = tmp_path / "models"
    os.makedirs(path / "hang" / "1")
    (path / "hang" / "config.pbtxt").write_text(HANG_CONFIG)
    (path / "hang" / "1" / "model.py").write_text(HANG_PY)
    s = nereid_server(str(path), "--model-progress-timeout-secs=1")

    def call(x):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]}
        return requests.post(f"{s.http_url}/v2/models/hang/infer", json=body, timeout=120)

    assert call(1).status_code == 200
    r = call(-1)  # stuck until the watchdog kills its worker
    assert r.status_code == 500, r.text
    assert "it was ended because its execution made no progress" in r.json()["error"]
    out = s.output()
    assert "'hang' version 1 is not making progress" in out
    assert "worker of 'hang_0_0' killed" in out
    # The next request starts a new worker; the model is ready again.
    wait_for(lambda: call(2).status_code == 200, "no new worker")
    assert status(s, "/v2/models/hang/ready") == 200
    key = 'nereid_model_progress_timeouts_total{model="hang",version="1"}'
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    assert f"{key} 1" in text
