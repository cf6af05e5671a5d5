"""In-place instance-group updates (Triton's UpdateInstanceGroup), through the
real binary: a Python model counts its initialize/finalize calls in files,
the tests change only the config's instance_group and load again (explicit
load, load with a config, poll) and check that only the changed instances are
created or finalized while requests keep being answered.
"""
import concurrent.futures
import json
import os
import textwrap
import threading
import time

import pytest
import requests

from conftest import Server

MODEL = "init_del"

# The model's head: imports and bump(kind), a call count kept in a file.
MODEL_HEAD = """
import os
import time
import fcntl
import numpy as np
import triton_python_backend_utils as pb_utils

LOG_DIR = {log_dir!r}


def bump(kind):
    path = os.path.join(LOG_DIR, kind)
    with open(path, "a+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read() or "0") + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
"""

MODEL_PY = MODEL_HEAD + """

class TritonPythonModel:
    def initialize(self, args):
        bump("initialize")

    def execute(self, requests):
        gate = os.path.join(LOG_DIR, "gate")
        if os.path.exists(gate + ".wait"):
            open(os.path.join(LOG_DIR, "executing"), "w").close()
            while not os.path.exists(gate):
                time.sleep(0.01)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out

    def finalize(self):
        bump("finalize")
"""

CONFIG = """
name: "init_del"
backend: "python"
max_batch_size: {mbs}
{batching}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {groups} ]
"""


def cpu(count, name=None, extra=""):
    n = f'name: "{name}" ' if name else ""
    return f"{{ {n}count: {count} kind: KIND_CPU {extra} }}"


class Model:
    def __init__(self, root, name=MODEL, source=MODEL_PY):
        self.logs = os.path.join(root, "logs")
        self.repo = os.path.join(root, "models")
        os.makedirs(self.logs)
        os.makedirs(os.path.join(self.repo, name, "1"))
        with open(os.path.join(self.repo, name, "1", "model.py"), "w") as f:
            f.write(source.format(log_dir=self.logs))

    def config(self, groups, mbs=0, batching=""):
        self.write_config(textwrap.dedent(CONFIG.format(mbs=mbs, batching=batching,
                                                        groups=",\n".join(groups))))

    def write_config(self, text, model=MODEL):
        path = os.path.join(self.repo, model, "config.pbtxt")
        # a new mtime even within one clock tick: poll mode compares them
        st = os.stat(path) if os.path.exists(path) else None
        with open(path, "w") as f:
            f.write(text)
        if st:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    def count(self, kind):
        try:
            with open(os.path.join(self.logs, kind)) as f:
                return int(f.read() or "0")
        except FileNotFoundError:
            return 0

    def counts(self):
        return self.count("initialize"), self.count("finalize")


def load(server, config=None):
    body = {"parameters": {"config": json.dumps(config)}} if config else {}
    return requests.post(f"{server.http_url}/v2/repository/models/{MODEL}/load", json=body,
                         timeout=120)


def one(server, batched=False):
    shape = [1, 3] if batched else [3]
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                        "data": [1.0, 2.0, 3.0]}]}
    r = requests.post(f"{server.http_url}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    return r


def instance_names(server):
    r = requests.get(f"{server.http_url}/v2/models/{MODEL}/config", timeout=10)
    return [(g.get("name"), g["count"]) for g in r.json()["instance_group"]]


@pytest.fixture
def model(tmp_path):
    return Model(str(tmp_path))


@pytest.fixture
def start():
    servers = []

    def go(model, *args):
        s = Server(model.repo, ["--model-control-mode=explicit", *args], "http")
        servers.append(s)
        return s

    yield go
    for s in servers:
        assert s.stop() == 0, s.output()


def test_count_changes_add_and_remove_only_the_difference(model, start):
    model.config([cpu(3)])
    s = start(model)
    assert load(s).status_code == 200
    assert model.counts() == (3, 0)
    one(s)
    model.config([cpu(4)])
    assert load(s).status_code == 200
    assert model.counts() == (4, 0)
    model.config([cpu(2)])
    assert load(s).status_code == 200
    # the two removed instances are finalized before the load answers
    assert model.counts() == (4, 2)
    one(s)
    # no change: nothing happens
    assert load(s).status_code == 200
    assert model.counts() == (4, 2)
    # count 0 means 1: one removed
    model.config([cpu(0)])
    assert load(s).status_code == 200
    assert model.counts() == (4, 3)
    assert instance_names(s)[0][1] in (0, 1)
    one(s)
    r = requests.post(f"{s.http_url}/v2/repository/models/{MODEL}/unload", timeout=60)
    assert r.status_code == 200
    assert model.counts() == (4, 4)


def test_requests_keep_flowing_and_statistics_are_kept(model, start):
    model.config([cpu(2)], mbs=2, batching="dynamic_batching { }")
    s = start(model)
    assert load(s).status_code == 200
    stop = threading.Event()
    errors, done = [], [0]

    def client():
        while not stop.is_set():
            try:
                one(s, batched=True)
                done[0] += 1
            except AssertionError as e:  # pragma: no cover - reported below
                errors.append(str(e))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client) for _ in range(4)]
        for groups in ([cpu(3)], [cpu(1)], [cpu(2)]):
            model.config(groups, mbs=2, batching="dynamic_batching { }")
            assert load(s).status_code == 200
        stop.set()
        for f in futures:
            f.result()
    assert errors == []
    assert model.counts() == (4, 2)
    stats = requests.get(f"{s.http_url}/v2/models/{MODEL}/stats", timeout=10).json()
    success = stats["model_stats"][0]["inference_stats"]["success"]["count"]
    assert success == done[0]


def test_an_update_does_not_wait_for_requests_in_flight(model, start):
    model.config([cpu(1)])
    s = start(model)
    assert load(s).status_code == 200
    open(os.path.join(model.logs, "gate.wait"), "w").close()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(one, s)
        while not os.path.exists(os.path.join(model.logs, "executing")):
            time.sleep(0.01)
        model.config([cpu(2)])
        assert load(s).status_code == 200  # while the request still executes
        assert not pending.done()
        assert model.counts() == (2, 0)
        os.unlink(os.path.join(model.logs, "gate.wait"))
        open(os.path.join(model.logs, "gate"), "w").close()
        pending.result(timeout=60)


def test_renamed_and_regrouped_instances_are_kept(model, start):
    model.config([cpu(1, "a"), cpu(2, "b")])
    s = start(model)
    assert load(s).status_code == 200
    model.config([cpu(1, "x"), cpu(1, "y"), cpu(1, "z")])
    assert load(s).status_code == 200
    assert model.counts() == (3, 0)
    assert instance_names(s) == [("x", 1), ("y", 1), ("z", 1)]
    one(s)


def test_load_with_a_config_updates_in_place(model, start):
    model.config([cpu(1)])
    s = start(model)
    assert load(s).status_code == 200
    config = requests.get(f"{s.http_url}/v2/models/{MODEL}/config", timeout=10).json()
    config["instance_group"][0]["count"] += 1
    assert load(s, config).status_code == 200
    assert model.counts() == (2, 0)
    one(s)


def test_other_changes_reload_every_instance(model, start):
    model.config([cpu(2)])
    s = start(model)
    assert load(s).status_code == 200
    model.config([cpu(3)], mbs=2)  # max_batch_size changes too: a full reload
    assert load(s).status_code == 200
    assert model.counts() == (5, 2)
    one(s, batched=True)
    with open(os.path.join(model.repo, MODEL, "1", "model.py"), "a") as f:
        f.write("\n# changed\n")  # the model file changes: a full reload
    model.config([cpu(1)], mbs=2)
    assert load(s).status_code == 200
    assert model.counts() == (6, 5)
    one(s, batched=True)


def test_poll_mode_updates_in_place(model):
    model.config([cpu(1)])
    s = Server(model.repo, ["--model-control-mode=poll", "--repository-poll-secs=1"], "http")
    try:
        assert model.counts() == (1, 0)
        model.config([cpu(3)])
        deadline = time.time() + 60
        while model.counts() != (3, 0) and time.time() < deadline:
            time.sleep(0.1)
        assert model.counts() == (3, 0)
        one(s)
    finally:
        assert s.stop() == 0, s.output()
    assert model.counts() == (3, 3)


def test_a_failed_update_keeps_the_serving_instances(model, start):
    need = 'rate_limiter { resources [ { name: "R1" count: %d } ] }'
    model.config([cpu(1, extra=need % 2)])
    s = start(model, "--rate-limit=execution_count", "--rate-limit-resource=R1:10")
    assert load(s).status_code == 200
    model.config([cpu(1, extra=need % 32)])  # more than the server has
    r = load(s)
    assert r.status_code == 400, r.text
    assert model.counts() == (1, 0)  # refused before any initialize
    one(s)
    model.config([cpu(1, extra=need % 10)])
    assert load(s).status_code == 200
    assert model.counts() == (2, 1)  # its group changed: replaced
    one(s)


def test_resource_counts_follow_the_instances(model, start):
    """Triton's verbose "Max Resource Map" after each change: a smaller need
    lowers the server's count once the old instance is gone."""
    need = 'rate_limiter { resources [ { name: "R1" count: %d } ] }'
    model.config([cpu(1, extra=need % 4)])
    s = start(model, "--rate-limit=execution_count", "--log-verbose=1")
    assert load(s).status_code == 200
    model.config([cpu(1, extra=need % 3)])
    assert load(s).status_code == 200
    assert model.counts() == (2, 1)
    one(s)
    out = s.output()
    assert "Max Resource Map===>" in out
    assert "Resource: R1\\t Count: 4" in out
    assert "Resource: R1\\t Count: 3" in out


def seq(server, sid, start=False, end=False):
    body = {"parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3],
                        "data": [1.0, 2.0, 3.0]}]}
    r = requests.post(f"{server.http_url}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
def test_sequence_models_update_in_place(model, start, strategy):
    batching = f"sequence_batching {{ {strategy} max_sequence_idle_microseconds: 8000000 }}"
    model.config([cpu(2)], batching=batching)
    s = start(model)
    assert load(s).status_code == 200
    seq(s, 1, start=True)
    seq(s, 1)
    seq(s, 1, end=True)
    model.config([cpu(4)], batching=batching)
    assert load(s).status_code == 200
    assert model.counts() == (4, 0)
    # four live sequences: one position each on four instances (a fifth
    # would wait in the backlog)
    for sid in (1, 2, 3, 4):
        seq(s, sid, start=True)
    for sid in (1, 2, 3, 4):
        seq(s, sid, end=True)
    model.config([cpu(3)], batching=batching)
    assert load(s).status_code == 200
    assert model.counts() == (4, 1)
    seq(s, 7, start=True)
    seq(s, 7, end=True)
    # a live sequence on every instance: as in Triton the removed ones
    # serve theirs until they end, then go (no reload); see
    # test_instance_update_live.py
    for sid in (11, 12, 13):
        seq(s, sid, start=True)
    model.config([cpu(1)], batching=batching)
    assert load(s).status_code == 200
    assert model.counts() == (4, 1)
    for sid in (11, 12, 13):
        seq(s, sid)
    for sid in (11, 12, 13):
        seq(s, sid, end=True)
    deadline = time.time() + 30
    while model.counts() != (4, 3) and time.time() < deadline:
        time.sleep(0.05)
    assert model.counts() == (4, 3)
    seq(s, 21, start=True)
    seq(s, 21, end=True)


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
def test_sequence_update_with_ongoing_sequences(model, start, strategy):
    """Triton's L0_model_update _test_scheduler_update_with_ongoing_sequences,
    with a KIND_CPU group of another signature where Triton's has KIND_GPU:
    the removed instances serving a sequence live until it ends."""
    batching = f"sequence_batching {{ {strategy} max_sequence_idle_microseconds: 8000000 }}"
    model.config([cpu(3)], batching=batching)
    s = start(model)
    assert load(s).status_code == 200
    seq(s, 1, start=True)
    seq(s, 2, start=True)
    model.config([cpu(1, extra="rate_limiter { priority: 2 }")], batching=batching)
    assert load(s).status_code == 200
    assert model.counts() == (4, 1)  # the idle one goes at once
    seq(s, 1)
    seq(s, 2)
    seq(s, 3, start=True)  # on the new instance
    assert model.counts() == (4, 1)
    seq(s, 1, end=True)
    seq(s, 2, end=True)
    deadline = time.time() + 30
    while model.counts() != (4, 3) and time.time() < deadline:
        time.sleep(0.05)
    assert model.counts() == (4, 3)
    seq(s, 3, end=True)
    r = requests.post(f"{s.http_url}/v2/repository/models/{MODEL}/unload", timeout=60)
    assert r.status_code == 200
    assert model.counts() == (4, 4)
