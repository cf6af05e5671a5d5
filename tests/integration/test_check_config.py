"""`nereid check-config` end to end: the real binary on example and broken
model directories."""
import json
import os
import subprocess

from conftest import BUILD, ROOT

NEREID = os.path.join(BUILD, "nereid")
EXAMPLES = os.path.join(ROOT, "examples", "models")
CASES = os.path.join(ROOT, "tests", "config")


def run(*args):
    return subprocess.run([NEREID, "check-config", *args], capture_output=True, text=True,
                          timeout=30)


def test_examples_are_valid():
    r = run(EXAMPLES)
    assert r.returncode == 0, r.stderr
    configs = [json.loads(line) for line in r.stdout.splitlines()]
    names = sorted(c["name"] for c in configs)
    assert names == sorted(d for d in os.listdir(EXAMPLES)
                           if os.path.isdir(os.path.join(EXAMPLES, d)))
    for c in configs:
        assert c["version_policy"] == {"latest": {"num_versions": 1}}
        assert all(g["kind"] == "KIND_CPU" for g in c["instance_group"])


def test_valid_case_prints_expected_json():
    d = os.path.join(CASES, "seed_oldest_stateful_model")
    r = run(d)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(d, "expected.json")) as f:
        assert r.stdout.strip() == f.read().strip()


def test_broken_config_reports_file_line_col(tmp_path):
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "identity"\ninput [ { name: "x" data_type: TYPE_FP32 '
        'dims: [ 0 ] } ]\ninstance_group [ { kind: KIND_GPU } ]\n')
    r = run(str(model))
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    cfg = str(model / "config.pbtxt")
    assert lines == [
        cfg + ":4:20: instance group broken_0 of model broken has kind KIND_GPU but server "
        "does not support GPUs",
        cfg + ":3:50: model input 'x' dimension must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for broken",
    ]
    assert r.stdout == ""


def test_syntax_error_and_missing_path(tmp_path):
    model = tmp_path / "typo"
    model.mkdir()
    (model / "config.pbtxt").write_text('name: "typo"\nmax_batch_sise: 4\n')
    r = run(str(model), str(tmp_path / "nope"))
    assert r.returncode == 1
    assert (str(model / "config.pbtxt") + ':2:1: Message type "inference.ModelConfig" has no '
            'field named "max_batch_sise" (did you mean "max_batch_size"?)') in r.stderr
    assert "nope: no such model directory or repository" in r.stderr


def test_usage():
    r = subprocess.run([NEREID, "check-config"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "usage: nereid check-config" in r.stderr
