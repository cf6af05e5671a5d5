"""Warmup as Triton's qa/L0_warmup checks it: samples of a sequence model
may list the sequence batcher's control tensors (Triton runs samples on the
instances directly; here the sequence batcher supplies the controls of the
one-request warmup sequence), a decoupled model is warmed up (its
responses collected until the final flag), Triton's verbose log line per
sample and its error text when a sample fails."""
import os
import shutil

import pytest
import requests

from conftest import EXAMPLES

WARMUP = """
model_warmup [ {
  name: "sequence sample" count: 2 batch_size: %d
  inputs { key: "INPUT" value { data_type: TYPE_INT32 dims: 1 zero_data: true } }
  inputs { key: "START" value { data_type: TYPE_INT32 dims: 1 zero_data: true } }
  inputs { key: "READY" value { data_type: TYPE_INT32 dims: 1 zero_data: true } }
} ]
"""


@pytest.mark.parametrize("batch", [1, 4])
def test_control_inputs_in_a_warmup_sample(nereid_server, tmp_path, batch):
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(EXAMPLES, "accumulator_direct"), repo / "acc")
    cfg = (repo / "acc" / "config.pbtxt").read_text().replace(
        'name: "accumulator_direct"', 'name: "acc"')
    (repo / "acc" / "config.pbtxt").write_text(cfg + WARMUP % batch)
    s = nereid_server(str(repo))
    r = requests.get(f"{s.http_url}/v2/models/acc/ready", timeout=10)
    assert r.status_code == 200, s.output()
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [5]}],
            "parameters": {"sequence_id": 7, "sequence_start": True, "sequence_end": True}}
    r = requests.post(f"{s.http_url}/v2/models/acc/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [5]


DECOUPLED_WARMUP = """
model_warmup [ {
  name: "decoupled sample" batch_size: 1
  inputs { key: "IN" value { data_type: TYPE_INT32 dims: 3 zero_data: true } }
  inputs { key: "DELAY" value { data_type: TYPE_UINT32 dims: 3 zero_data: true } }
  inputs { key: "WAIT" value { data_type: TYPE_UINT32 dims: 1 zero_data: true } }
} ]
"""


def test_decoupled_model_is_warmed_up(nereid_server, tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), repo / "repeat_int32")
    cfg = repo / "repeat_int32" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + DECOUPLED_WARMUP)
    s = nereid_server(str(repo), "--log-verbose=1")
    r = requests.get(f"{s.http_url}/v2/models/repeat_int32/ready", timeout=10)
    assert r.status_code == 200, s.output()
    assert ("model 'repeat_int32' instance repeat_int32_0_0 is running warmup sample "
            "'decoupled sample' for iteration 1") in s.output()


def test_failed_sample_has_tritons_text(nereid_server, tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), repo / "repeat_int32")
    cfg = repo / "repeat_int32" / "config.pbtxt"
    # IN and DELAY of different lengths: the repeat backend fails the request
    cfg.write_text(cfg.read_text() + DECOUPLED_WARMUP.replace(
        "key: \"DELAY\" value { data_type: TYPE_UINT32 dims: 3", "key: \"DELAY\" value "
        "{ data_type: TYPE_UINT32 dims: 2"))
    s = nereid_server(str(repo), "--exit-on-error=false", "--strict-readiness=false")
    rows = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=10).json()
    reason = [m for m in rows if m["name"] == "repeat_int32"][0]["reason"]
    assert "failed to run warmup sample 'decoupled sample': " in reason, reason


# Triton's L0_backend_python bls "model loading API with BLS warmup": the
# sample names INPUT0/INPUT1, the Python model's config lists no input.
# Triton adds such inputs as override inputs after the request is checked
# (batch dimension 1 when the model batches: the backend sees
# ShapeWithBatchDim), and the backend sees them with the others.
EXTRA_WARMUP = """
max_batch_size: %d
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
model_warmup [ {
  name: "regular sample" batch_size: 1
  inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: 4 zero_data: false } }
  inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 2, 3 ] zero_data: true } }
} ]
"""

SEEN_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.seen = []

    def execute(self, requests):
        out = []
        for r in requests:
            self.seen.append(sorted((t.name(), list(t.shape()), str(t.as_numpy().dtype))
                                    for t in r.inputs()))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT0", np.array([json.dumps(self.seen)], dtype=np.object_))]))
        return out
'''


@pytest.mark.parametrize("max_batch", [0, 4])
def test_sample_inputs_the_config_does_not_list(nereid_server, tmp_path, max_batch):
    repo = tmp_path / "models"
    (repo / "seen" / "1").mkdir(parents=True)
    (repo / "seen" / "1" / "model.py").write_text(SEEN_MODEL)
    (repo / "seen" / "config.pbtxt").write_text(
        'name: "seen" backend: "python"\n' + EXTRA_WARMUP % max_batch)
    s = nereid_server(str(repo))
    r = requests.get(f"{s.http_url}/v2/models/seen/ready", timeout=10)
    assert r.status_code == 200, s.output()
    r = requests.post(f"{s.http_url}/v2/models/seen/infer", json={"inputs": []}, timeout=30)
    assert r.status_code == 200, r.text
    seen = __import__("json").loads(r.json()["outputs"][0]["data"][0])
    # the warmup request, then this request
    b = [1] if max_batch else []
    assert seen == [[["INPUT0", b + [4], "float32"], ["INPUT1", b + [2, 3], "int32"]], []]
