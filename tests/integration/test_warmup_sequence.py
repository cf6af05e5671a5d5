"""Warmup samples of a sequence model may list the sequence batcher's
control tensors (Triton's qa/L0_warmup gives START and READY zero data, as
Triton runs samples on the instances directly): the model loads, the
sequence batcher supplies the controls of the one-request warmup sequence."""
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
