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
