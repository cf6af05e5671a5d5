"""In-place instance updates with work the new or the leaving instances must
honour, as Triton does (TritonModel::UpdateInstanceGroup):

- an added instance runs the model's model_warmup samples before the
  scheduler hands it a request (TritonModelInstance::CreateInstance ->
  SetBackendThread -> InitAndWarmUpModelInstance); a failing warm-up fails
  the update and the old instances keep serving (ModelLifeCycle::
  UpdateModelConfig: "version N is at READY state: ...");
- a live sequence on an instance the update removes keeps running there
  until it ends (SequenceBatchScheduler::Update marks the instance's slots
  pending removal; ReleaseSequenceSlot erases them as sequences end, and
  no new sequence gets them); the update does not wait for it.

A Python model logs every execution (instance, input, controls) in a file.
"""
import concurrent.futures
import json
import os
import threading
import time

import pytest
import requests

from test_instance_update import MODEL_HEAD
from test_instance_update import Model as CountingModel
from test_instance_update import start  # noqa: F401  (the fixture)

MODEL = "live"

MODEL_PY = MODEL_HEAD + """
import json


def append(line):
    with open(os.path.join(LOG_DIR, "log"), "a") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)
        f.write(line + "\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.acc = {{}}
        bump("initialize")

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(r, "START")
            corr = pb_utils.get_input_tensor_by_name(r, "CORRID")
            start = None if start is None else int(start.as_numpy().reshape(-1)[0])
            corr = None if corr is None else int(corr.as_numpy().reshape(-1)[0])
            append(json.dumps([self.name, x, start, corr]))
            if x == 0.0 and os.path.exists(os.path.join(LOG_DIR, "refuse_warmup")):
                out.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("warm-up refused by " + self.name)))
                continue
            if corr is not None:
                if start:
                    self.acc[corr] = 0.0
                self.acc[corr] += x
                x = self.acc[corr]
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.array([x], dtype=np.float32))]))
        return out

    def finalize(self):
        bump("finalize")
"""

WARMUP = """
model_warmup [ { name: "zeros" batch_size: 1 count: 2
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } } ]
"""

SEQUENCE = """
sequence_batching {
  direct { }
  max_sequence_idle_microseconds: {idle}
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


def config_text(count, warmup=True, sequence=False, idle=60000000):
    return f"""
name: "{MODEL}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{WARMUP if warmup else ""}
{SEQUENCE.replace("{idle}", str(idle)) if sequence else ""}
"""


class Model(CountingModel):
    """test_instance_update's model (initialize/finalize counts), with a
    model.py that also logs each execution."""

    def __init__(self, root):
        super().__init__(root, MODEL, MODEL_PY)

    def config(self, count, **kw):  # pylint: disable=arguments-differ
        self.write_config(config_text(count, **kw), MODEL)

    def log(self):
        try:
            with open(os.path.join(self.logs, "log")) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []


@pytest.fixture
def model(tmp_path):
    return Model(str(tmp_path))


def load(server, config=None):
    body = {"parameters": {"config": json.dumps(config)}} if config else {}
    return requests.post(f"{server.http_url}/v2/repository/models/{MODEL}/load", json=body,
                         timeout=120)


def served_config(server):
    return requests.get(f"{server.http_url}/v2/models/{MODEL}/config", timeout=10).json()


def infer(server, x, sid=None, start=False, end=False, timeout=60):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]}
    if sid is not None:
        body["parameters"] = {"sequence_id": sid, "sequence_start": start,
                              "sequence_end": end}
    return requests.post(f"{server.http_url}/v2/models/{MODEL}/infer", json=body,
                         timeout=timeout)


def value(r):
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][0]


def inst(i):
    """Triton's instance name: <group name (model_0)>_<index>."""
    return f"{MODEL}_0_{i}"


def first_runs(log):
    """Per instance, the inputs of its executions in order."""
    runs = {}
    for name, x, _start, _corr in log:
        runs.setdefault(name, []).append(x)
    return runs


def test_added_instances_are_warmed_up_before_they_serve(model, start):
    model.config(1)
    s = start(model)
    assert load(s).status_code == 200
    assert value(infer(s, 1.0)) == 1.0
    # clients keep the model busy while the update adds two instances
    stop = threading.Event()
    errors = []

    def client():
        while not stop.is_set():
            r = infer(s, 2.0)
            if r.status_code != 200:  # pragma: no cover - reported below
                errors.append(r.text)

    config = served_config(s)
    config["instance_group"][0]["count"] = 3
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(client) for _ in range(3)]
        time.sleep(0.3)
        assert load(s, config).status_code == 200
        # until each new instance has served a client (bounded: a loaded
        # machine may take a while to spread three clients over three)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                2.0 in first_runs(model.log()).get(inst(i), []) for i in (1, 2)):
            time.sleep(0.1)
        stop.set()
        for f in futures:
            f.result()
    assert errors == []
    assert model.counts() == (3, 0)
    runs = first_runs(model.log())
    assert set(runs) == {inst(0), inst(1), inst(2)}
    for name in (inst(1), inst(2)):
        # each new instance ran the sample (count 2) before any request
        assert runs[name][:2] == [0.0, 0.0], (name, runs[name][:5])
        assert 2.0 in runs[name], name  # and then served
        assert runs[name].count(0.0) == 2, name
    assert served_config(s)["instance_group"][0]["count"] == 3


def test_a_failing_warmup_fails_the_update_and_keeps_the_instances(model, start):
    model.config(1)
    s = start(model)
    assert load(s).status_code == 200
    open(os.path.join(model.logs, "refuse_warmup"), "w").close()
    model.config(3)
    r = load(s)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    # Triton: ModelLifeCycle::UpdateModelConfig keeps the version READY
    assert "version 1 is at READY state: " in err, err
    assert "failed to run warmup sample 'zeros': warm-up refused by live_" in err, err
    # the first new instance failed its warm-up: it and nothing else was
    # created and finalized; the old instance serves, with the old config
    assert model.counts() == (2, 1)
    assert value(infer(s, 4.0)) == 4.0
    assert served_config(s)["instance_group"][0]["count"] == 1
    ready = requests.get(f"{s.http_url}/v2/models/{MODEL}/ready", timeout=10)
    assert ready.status_code == 200
    os.unlink(os.path.join(model.logs, "refuse_warmup"))
    assert load(s).status_code == 200
    assert model.counts() == (4, 1)


def test_added_sequence_instances_are_warmed_up_with_controls(model, start):
    model.config(1, sequence=True)
    s = start(model)
    assert load(s).status_code == 200
    model.config(2, sequence=True)
    assert load(s).status_code == 200
    assert model.counts() == (2, 0)
    new = [e for e in model.log() if e[0] == inst(1)]
    # a one-request sequence: START set, a correlation id of its own
    assert len(new) == 2 and all(e[1] == 0.0 and e[2] == 1 for e in new), new
    assert value(infer(s, 3.0, sid=5, start=True)) == 3.0
    assert value(infer(s, 4.0, sid=6, start=True)) == 4.0
    assert value(infer(s, 1.0, sid=5, end=True)) == 4.0
    assert value(infer(s, 1.0, sid=6, end=True)) == 5.0


def shrink_with_live_sequences(model, start, **kw):
    """Two instances, sequence 1 (1.0 so far) on live_0_0 and sequence 2
    (10.0) on live_0_1 (one position each), then an update to one."""
    model.config(2, warmup=False, sequence=True, **kw)
    s = start(model)
    assert load(s).status_code == 200
    assert value(infer(s, 1.0, sid=1, start=True)) == 1.0
    assert value(infer(s, 10.0, sid=2, start=True)) == 10.0
    where = {corr: name for name, _x, _st, corr in model.log()}
    assert where == {1: inst(0), 2: inst(1)}
    model.config(1, warmup=False, sequence=True, **kw)
    t0 = time.time()
    assert load(s).status_code == 200  # does not wait for sequence 2
    assert time.time() - t0 < 10
    assert model.counts() == (2, 0)  # live_0_1 still serves sequence 2
    return s


def test_a_live_sequence_on_a_removed_instance_continues(model, start):
    s = shrink_with_live_sequences(model, start)
    assert served_config(s)["instance_group"][0]["count"] == 1
    # both sequences go on where they are, their state intact
    assert value(infer(s, 1.0, sid=1)) == 2.0
    assert value(infer(s, 10.0, sid=2)) == 20.0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        # a new sequence does not get live_0_1's position: it waits for live_0_0
        third = pool.submit(lambda: infer(s, 100.0, sid=3, start=True))
        assert value(infer(s, 10.0, sid=2, end=True)) == 30.0
        deadline = time.time() + 30
        while model.counts() != (2, 1) and time.time() < deadline:
            time.sleep(0.05)
        assert model.counts() == (2, 1)  # gone once its sequence ended
        time.sleep(0.3)
        assert not third.done()
        assert value(infer(s, 1.0, sid=1, end=True)) == 3.0
        assert value(third.result(timeout=30)) == 100.0
    assert value(infer(s, 1.0, sid=3, end=True)) == 101.0
    assert {name for name, _x, _st, corr in model.log() if corr == 3} == {inst(0)}
    # a later update joins the instance that left; the unload the rest
    model.config(2, warmup=False, sequence=True)
    assert load(s).status_code == 200
    assert model.counts() == (3, 1)
    r = requests.post(f"{s.http_url}/v2/repository/models/{MODEL}/unload", timeout=60)
    assert r.status_code == 200
    assert model.counts() == (3, 3)


def test_an_idle_sequence_ends_and_its_removed_instance_goes(model, start):
    s = shrink_with_live_sequences(model, start, idle=500000)
    # no request for 0.5 s: the reaper ends sequence 2, live_0_1 goes
    deadline = time.time() + 30
    while model.counts() != (2, 1) and time.time() < deadline:
        time.sleep(0.05)
    assert model.counts() == (2, 1)
    r = infer(s, 1.0, sid=2)
    assert r.status_code == 400 and "must specify the START flag" in r.text, r.text


def test_unload_ends_a_lingering_instance(model, start):
    s = shrink_with_live_sequences(model, start)
    r = requests.post(f"{s.http_url}/v2/repository/models/{MODEL}/unload", timeout=60)
    assert r.status_code == 200
    assert model.counts() == (2, 2)
