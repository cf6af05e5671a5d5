"""A Python model whose worker dies is not ready until its worker is
restarted (issue 39, health that tells the truth; Triton core #473 for the
server under --strict-readiness). When it is restarted is
--backend-config=python,restart-worker: eager (the default: as soon as the
death is seen, with no request needed), on-request (Triton's QA
model_readiness kills the stub and expects the model not ready a second
later, with Triton's log line), or never (Triton 25.x+: requests fail
until the model is loaded again). The model's initialize()
waits for a file the test creates ("gate") when "hold" exists, and raises
when "fail" exists, so the window in which the restart runs, and a failed
restart, are held open by the test, not by timing."""
import json
import os
import signal
import time

import requests

from test_python_backend import workers, write

CONFIG = """
backend: "python"
max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
parameters [ { key: "dir" value: { string_value: "%s" } } ]
"""

MODEL = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        d = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]
        if os.path.exists(os.path.join(d, "fail")):
            raise RuntimeError("initialize refused by the test")
        if os.path.exists(os.path.join(d, "hold")):
            open(os.path.join(d, "holding"), "w").close()
            end = time.time() + 60
            while not os.path.exists(os.path.join(d, "gate")) and time.time() < end:
                time.sleep(0.01)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]
"""


EAGER = "--backend-config=python,restart-worker=eager"


def wait_for(cond, what):
    deadline = time.time() + 60
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.01)


def infer(s):
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    return requests.post(f"{s.http_url}/v2/models/py/infer", json=body, timeout=60)


def model_ready(s):
    return requests.get(f"{s.http_url}/v2/models/py/ready", timeout=30).status_code == 200


def server_ready(s):
    return requests.get(f"{s.http_url}/v2/health/ready", timeout=30).status_code == 200


def worker_pid(s):
    r = infer(s)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][0]


def test_dead_worker_not_ready_until_restarted(nereid_server, tmp_path):
    d = tmp_path / "ctl"
    d.mkdir()
    repo = str(tmp_path / "models")
    write(repo, "py", CONFIG % d, MODEL)
    s = nereid_server(repo, "--strict-readiness=true", EAGER)
    assert model_ready(s) and server_ready(s)
    pid = worker_pid(s)
    # The restart's initialize() waits for "gate".
    (d / "hold").write_text("")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: os.path.exists(d / "holding"), "the worker was not restarted without a request")
    assert not model_ready(s)
    assert not server_ready(s)
    assert "restarted the worker of 'py_0_0'" not in s.output()
    (d / "gate").write_text("")
    wait_for(lambda: model_ready(s), "the model did not turn ready after the restart")
    assert server_ready(s)
    assert "restarted the worker of 'py_0_0'" in s.output()
    new_pid = worker_pid(s)
    assert new_pid != pid
    assert new_pid in workers(s.proc.pid)


def test_failed_restart_keeps_not_ready(nereid_server, tmp_path):
    d = tmp_path / "ctl"
    d.mkdir()
    repo = str(tmp_path / "models")
    write(repo, "py", CONFIG % d, MODEL)
    s = nereid_server(repo, "--strict-readiness=true", EAGER)
    pid = worker_pid(s)
    (d / "fail").write_text("")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: "restarting the worker of 'py_0_0' failed" in s.output(),
             "the failed restart was not logged")
    assert not model_ready(s)
    assert not server_ready(s)
    # A request meanwhile tries again (and fails while initialize raises).
    r = infer(s)
    assert r.status_code == 500 and "initialize refused by the test" in r.text, r.text
    assert not model_ready(s)
    # Once initialize succeeds, the next request's restart brings it back.
    os.remove(d / "fail")
    assert worker_pid(s) != pid
    assert model_ready(s) and server_ready(s)


def kill_and_wait(s, pid):
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not model_ready(s), "the model stayed ready after its worker was killed")


def test_on_request_restarts_on_the_next_request_only(nereid_server, tmp_path):
    """Triton's qa/L0_backend_python/model_readiness: kill the stub, wait a
    second, the model is not ready over HTTP and gRPC with Triton's log
    line; restart-worker=on-request then restarts the worker for the next
    request."""
    d = tmp_path / "ctl"
    d.mkdir()
    repo = str(tmp_path / "models")
    write(repo, "py", CONFIG % d, MODEL)
    s = nereid_server(repo, "--log-verbose=1", "--backend-config=python,restart-worker=on-request")
    pid = worker_pid(s)
    kill_and_wait(s, pid)
    time.sleep(1.0)
    assert not model_ready(s)
    assert "Model 'py' version 1 is not ready: Stub process 'py_0_0' is not healthy." in s.output()
    assert "restarted the worker of 'py_0_0'" not in s.output()
    new_pid = worker_pid(s)  # this request restarts it
    assert new_pid != pid
    assert model_ready(s)


def test_never_fails_requests_until_loaded_again(nereid_server, tmp_path):
    d = tmp_path / "ctl"
    d.mkdir()
    repo = str(tmp_path / "models")
    write(repo, "py", CONFIG % d, MODEL)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=py",
                      "--backend-config=python,restart-worker=never")
    pid = worker_pid(s)
    kill_and_wait(s, pid)
    for _ in range(2):
        r = infer(s)
        assert r.status_code == 500 and "Stub process 'py_0_0' is not healthy." in r.text, r.text
    assert not model_ready(s)
    # an unchanged model's load keeps it as it is (Triton's too): unload first
    for what in ("unload", "load"):
        r = requests.post(f"{s.http_url}/v2/repository/models/py/{what}", timeout=60)
        assert r.status_code == 200, r.text
    wait_for(lambda: requests.post(f"{s.http_url}/v2/repository/models/py/load",
                                   timeout=60).status_code == 200 and model_ready(s),
             "the model did not load again")
    assert worker_pid(s) != pid
    assert model_ready(s)


def test_bad_restart_worker_value_is_refused(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "py", CONFIG % tmp_path, MODEL)
    s = nereid_server(repo, "--backend-config=python,restart-worker=sometimes",
                      "--exit-on-error=false", "--strict-readiness=false")
    r = requests.get(f"{s.http_url}/v2/models/py/ready", timeout=30)
    assert r.status_code != 200
    assert "restart-worker must be 'on-request', 'never' or 'eager', got 'sometimes'" in s.output()
