"""A model whose configuration cannot be read (no config.pbtxt under
--strict-model-config=true, a config that does not parse) is left out of the
model table as Triton's poll leaves it out of its model infos: with
--exit-on-error=false the server is ready under strict readiness and the
model is unknown ("Request for unknown model: '<m>' is not found"), while a
model whose config was read but whose load failed still keeps the server not
ready (L0_lifecycle test_parse_error_no_model_config, test_parse_error_modelfail)."""
import os

import requests

from http_helpers import identity_config, write_model


def test_unreadable_config_is_unknown_and_not_counted(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "good", identity_config("good", "TYPE_FP32"))
    os.makedirs(os.path.join(repo, "noconfig", "1"))
    write_model(repo, "garbled", "this is { not a config")
    s = nereid_server(repo, "--exit-on-error=false", "--strict-model-config=true",
                      "--strict-readiness=true")
    out = s.output()
    assert ("failed to open text file for read "
            f"{repo}/noconfig/config.pbtxt: No such file or directory") in out
    assert requests.get(f"{s.http_url}/v2/health/ready", timeout=10).status_code == 200
    for m in ("noconfig", "garbled"):
        for path in (f"/v2/models/{m}", f"/v2/models/{m}/versions/1"):
            r = requests.get(s.http_url + path, timeout=10)
            assert r.status_code == 404, r.text  # Triton's NOT_FOUND
            assert r.json()["error"] == f"Request for unknown model: '{m}' is not found"
    assert requests.get(f"{s.http_url}/v2/models/good/ready", timeout=10).status_code == 200


def test_failed_load_of_a_read_config_still_counts(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "good", identity_config("good", "TYPE_FP32"))
    write_model(repo, "nobackend", 'backend: "no_such_backend"\nmax_batch_size: 0\n'
                'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    s = nereid_server(repo, "--exit-on-error=false", "--strict-readiness=true")
    assert requests.get(f"{s.http_url}/v2/health/ready", timeout=10).status_code == 400
    r = requests.get(f"{s.http_url}/v2/models/nobackend", timeout=10)
    assert r.json()["error"] == ("Request for unknown model: 'nobackend' has no available "
                                 "versions"), r.text


def test_fixed_config_loads_in_explicit_mode(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    os.makedirs(os.path.join(repo, "later", "1"))
    s = nereid_server(repo, "--exit-on-error=false", "--strict-model-config=true",
                      "--model-control-mode=explicit", "--load-model=later")
    assert requests.get(f"{s.http_url}/v2/health/ready", timeout=10).status_code == 200
    with open(os.path.join(repo, "later", "config.pbtxt"), "w") as f:
        f.write(identity_config("later", "TYPE_FP32"))
    r = requests.post(f"{s.http_url}/v2/repository/models/later/load", timeout=30)
    assert r.status_code == 200, r.text
    assert requests.get(f"{s.http_url}/v2/models/later/ready", timeout=10).status_code == 200
    assert requests.get(f"{s.http_url}/v2/health/ready", timeout=10).status_code == 200
