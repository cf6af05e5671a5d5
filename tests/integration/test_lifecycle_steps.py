"""Differences from Triton that Triton's qa/L0_lifecycle steps found
(scripts/triton_qa/lifecycle_steps.sh; docs/compatibility.md, "L0_lifecycle
step by step"), each checked against the real binary with Triton's status
codes and texts."""
import json
import os
import shutil
import subprocess
import time

import requests

from conftest import NEREID, free_port

F2 = 'data_type: TYPE_FP32 dims: [ 2 ]'
TESTING = f"""backend: "testing" max_batch_size: 8
input [ {{ name: "INPUT0" {F2} }} ]
output [ {{ name: "OUTPUT0" {F2} }} ]
"""


def write_model(repo, name, config, versions=("1",)):
    d = os.path.join(repo, name)
    os.makedirs(d, exist_ok=True)
    for v in versions:
        os.makedirs(os.path.join(d, v), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)


def ready(s, model, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    return requests.get(s.http_url + path, timeout=30).status_code


def test_version_dirs_with_leading_zeros_or_no_number_are_ignored(tmp_path, nereid_server):
    # L0_lifecycle test_parse_ignore_zero_prefixed_version and
    # test_parse_ignore_non_intergral_version: Triton's VersionsToLoad skips
    # "003" (leading zeros) and "abc" (no integral number) with a warning
    # each; version 3 of the policy is then simply absent, and the server
    # is ready (strict readiness) with version 1.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING + "version_policy: { specific { versions: [1, 3] }}\n",
                versions=("1", "003", "abc"))
    # warmup/, initial_state/ and configs/ are not versions, and not warned about
    os.makedirs(os.path.join(repo, "m", "warmup"))
    s = nereid_server(repo)
    assert requests.get(s.http_url + "/v2/health/ready", timeout=30).status_code == 200
    assert ready(s, "m", "1") == 200
    assert ready(s, "m", "3") != 200
    index = requests.post(s.http_url + "/v2/repository/index", timeout=30).json()
    assert sorted(r.get("version") for r in index if r["name"] == "m") == ["1"]
    out = s.output()
    assert "ignore version directory '003' which contains leading zeros in its directory name" in out
    assert "ignore version directory 'abc' which fails to convert to integral number" in out
    assert "'warmup'" not in out


def infer(s, model):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def wait_for(cond, secs=20):
    deadline = time.time() + secs
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def test_poll_removed_model_has_no_available_versions(tmp_path, nereid_server):
    # L0_lifecycle test_dynamic_model_load_unload: a model whose directory
    # leaves the repository is unloaded by the poll and stays known to the
    # lifecycle (Triton's PollAndUpdate: AsyncUnload), so a request gets
    # "has no available versions"; the index lists only what is on disk,
    # the server stays ready, and the model loads again when it comes back.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING)
    write_model(repo, "other", TESTING)
    s = nereid_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    assert infer(s, "m").status_code == 200
    saved = str(tmp_path / "m")
    shutil.move(os.path.join(repo, "m"), saved)
    assert wait_for(lambda: ready(s, "m") != 200)
    r = infer(s, "m")
    assert r.status_code == 404  # Triton: NOT_FOUND, as "is not found"
    assert r.json()["error"] == "Request for unknown model: 'm' has no available versions"
    index = requests.post(s.http_url + "/v2/repository/index", timeout=30).json()
    assert [m["name"] for m in index] == ["other"]
    assert requests.get(s.http_url + "/v2/health/ready", timeout=30).status_code == 200
    time.sleep(2.5)  # later polls leave it alone (no "unloaded" again)
    assert s.output().count("successfully unloaded 'm'") == 1
    shutil.move(saved, os.path.join(repo, "m"))
    assert wait_for(lambda: ready(s, "m") == 200)
    assert infer(s, "m").status_code == 200


def test_poll_removed_version_is_unloaded_not_unknown(tmp_path, nereid_server):
    # L0_lifecycle test_dynamic_version_load_unload: a version directory the
    # poll finds removed stays in the model's lifecycle as UNAVAILABLE
    # "unloaded" (Triton's OnLoadFinal releases it; the version map keeps
    # it): a request for it gets 503 "version 1 is not at ready state", the
    # index lists it with reason "unloaded", and strict readiness holds.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING + "version_policy: { all { }}\n", versions=("1", "2"))
    s = nereid_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1")
    assert ready(s, "m", "1") == 200
    shutil.rmtree(os.path.join(repo, "m", "1"))
    assert wait_for(lambda: ready(s, "m", "1") != 200)
    assert ready(s, "m", "2") == 200
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    r = requests.post(f"{s.http_url}/v2/models/m/versions/1/infer", json=body, timeout=30)
    assert r.status_code == 503
    assert r.json()["error"] == "Request for unknown model: 'm' version 1 is not at ready state"
    index = requests.post(s.http_url + "/v2/repository/index", timeout=30).json()
    assert {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index
    assert {"name": "m", "version": "2", "state": "READY"} in index
    assert requests.get(s.http_url + "/v2/health/ready", timeout=30).status_code == 200
    # and a version that comes (back) loads
    os.makedirs(os.path.join(repo, "m", "7"))
    assert wait_for(lambda: ready(s, "m", "7") == 200)
    assert ready(s, "m", "1") != 200


def test_startup_model_not_in_any_repository(tmp_path, nereid_server):
    # L0_lifecycle "Test loading a startup model that doesn't exist": with
    # --exit-on-error (the default) the server does not start, and Triton's
    # PollModels line is in the log; with --exit-on-error=false it starts.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING)
    ports = [f"--http-port={free_port()}", f"--grpc-port={free_port()}",
             f"--metrics-port={free_port()}", "--http-address=127.0.0.1",
             "--grpc-address=127.0.0.1"]
    r = subprocess.run([NEREID, f"--model-repository={repo}", "--model-control-mode=explicit",
                        "--load-model=does-not-exist", "--load-model=m", *ports],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert ("failed to poll model 'does-not-exist': model not found in any model repository."
            in r.stdout + r.stderr)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=does-not-exist",
                      "--load-model=m", "--exit-on-error=false")
    assert ready(s, "m") == 200
    assert "model not found in any model repository" in s.output()


def test_same_repository_given_twice_is_one_repository(tmp_path, nereid_server):
    # L0_lifecycle test_config_override starts Triton with the same
    # --model-repository twice: Triton keeps the paths in a set, so the
    # models are not "in two or more repositories".
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING)
    s = nereid_server([repo, repo], "--model-control-mode=explicit")
    r = requests.post(s.http_url + "/v2/repository/models/m/load", timeout=30)
    assert r.status_code == 200, r.text
    assert ready(s, "m") == 200
    index = requests.post(s.http_url + "/v2/repository/index", timeout=30).json()
    assert [m["name"] for m in index] == ["m"]


ENSEMBLE = f"""platform: "ensemble" max_batch_size: 8
input [ {{ name: "X" {F2} }} ]
output [ {{ name: "Y" {F2} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "step" input_map {{ key: "INPUT0" value: "X" }}
     output_map {{ key: "OUTPUT0" value: "Y" }} }} ] }}
"""


def test_unloading_a_step_unloads_its_ensembles(tmp_path, nereid_server):
    # L0_lifecycle test_model_control: unloading the composing model forces
    # the ensemble that uses it to be unloaded (Triton's dependency graph);
    # after an explicit unload of the ensemble, loading the step again does
    # not bring the ensemble back.
    repo = str(tmp_path / "models")
    write_model(repo, "step", TESTING)
    write_model(repo, "ens", ENSEMBLE)
    write_model(repo, "other", TESTING)
    s = nereid_server(repo, "--model-control-mode=explicit", "--strict-readiness=false")
    for m in ("ens", "other"):
        assert requests.post(f"{s.http_url}/v2/repository/models/{m}/load", timeout=30).status_code == 200
    assert ready(s, "ens") == 200 and ready(s, "step") == 200
    assert requests.post(f"{s.http_url}/v2/repository/models/step/unload", timeout=30).status_code == 200
    assert ready(s, "step") != 200
    assert ready(s, "ens") != 200
    assert ready(s, "other") == 200
    assert requests.post(f"{s.http_url}/v2/repository/models/ens/unload", timeout=30).status_code == 200
    assert requests.post(f"{s.http_url}/v2/repository/models/step/load", timeout=30).status_code == 200
    assert ready(s, "step") == 200
    assert ready(s, "ens") != 200


IDENTITY_SLOW = """backend: "identity" max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
parameters [ { key: "creation_delay_sec" value: { string_value: "2" } } ]
"""


def test_identity_creation_delay_keeps_old_version_serving(tmp_path, nereid_server):
    # L0_lifecycle test_model_availability_on_reload_2: Triton's identity
    # backend sleeps creation_delay_sec while a model loads; during a reload
    # that moves the policy from version 1 to 2, version 1 keeps serving.
    import threading
    repo = str(tmp_path / "models")
    write_model(repo, "idm", IDENTITY_SLOW + "version_policy: { specific { versions: [1] }}\n",
                versions=("1", "2"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    t0 = time.time()
    r = requests.post(f"{s.http_url}/v2/repository/models/idm/load", timeout=60)
    assert r.status_code == 200, r.text
    assert time.time() - t0 >= 2.0
    write_model(repo, "idm", IDENTITY_SLOW + "version_policy: { specific { versions: [2] }}\n",
                versions=("1", "2"))
    done = {}
    th = threading.Thread(target=lambda: done.setdefault(
        "r", requests.post(f"{s.http_url}/v2/repository/models/idm/load", timeout=60)))
    th.start()
    time.sleep(1.0)
    assert "r" not in done  # still loading version 2
    assert ready(s, "idm", "1") == 200
    th.join()
    assert done["r"].status_code == 200
    assert ready(s, "idm", "2") == 200
    assert ready(s, "idm", "1") != 200


def test_load_and_unload_log_lines_are_tritons(tmp_path, nereid_server):
    # L0_lifecycle test_load_new_model_version counts "successfully loaded
    # 'identity_fp32'" (one per load: Triton's OnLoadFinal) and
    # test_shutdown_while_background_unloading counts "successfully
    # unloaded" (one per version: Triton's OnDestroy); Triton also logs
    # "loading: <model>:<version>" for every version it loads.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING + "version_policy: { all { }}\n", versions=("1", "2"))
    write_model(repo, "bad", TESTING.replace('"testing"', '"no_such_backend"'))
    s = nereid_server(repo, "--model-control-mode=explicit")
    url = f"{s.http_url}/v2/repository/models"
    assert requests.post(f"{url}/m/load", timeout=30).status_code == 200
    out = s.output()
    assert "loading: m:1" in out and "loading: m:2" in out
    assert out.count("successfully loaded 'm'") == 1
    assert "successfully loaded 'm' version" not in out
    # an unchanged model is not loaded again: no new line
    assert requests.post(f"{url}/m/load", timeout=30).status_code == 200
    assert s.output().count("successfully loaded 'm'") == 1
    assert requests.post(f"{url}/m/unload", timeout=30).status_code == 200
    out = s.output()
    assert "successfully unloaded 'm' version 1" in out
    assert "successfully unloaded 'm' version 2" in out
    assert requests.post(f"{url}/bad/load", timeout=30).status_code == 400
    assert "failed to load 'bad'" in s.output()


def test_load_without_config_keeps_the_override_until_files_change(tmp_path, nereid_server):
    # L0_lifecycle test_config_override and test_model_config_overwite:
    # after a load with a config override, Triton counts the config as
    # modified at that moment, so a load without a config finds the model
    # unmodified and keeps serving the override; once config.pbtxt is
    # touched, a load without a config goes back to the local config.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING)
    s = nereid_server(repo, "--model-control-mode=explicit")
    url = f"{s.http_url}/v2/repository/models/m"
    assert requests.post(f"{url}/load", timeout=30).status_code == 200
    original = requests.get(f"{s.http_url}/v2/models/m/config", timeout=30).json()
    override = {"parameters": {"config": json.dumps({
        "backend": "testing", "max_batch_size": 8,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]})}}
    r = requests.post(f"{url}/load", json=override, timeout=30)
    assert r.status_code == 200, r.text
    overridden = requests.get(f"{s.http_url}/v2/models/m/config", timeout=30).json()
    assert overridden["instance_group"][0]["count"] == 2
    assert requests.post(f"{url}/load", timeout=30).status_code == 200
    assert requests.get(f"{s.http_url}/v2/models/m/config", timeout=30).json() == overridden
    time.sleep(0.1)
    os.utime(os.path.join(repo, "m", "config.pbtxt"))
    assert requests.post(f"{url}/load", timeout=30).status_code == 200
    assert requests.get(f"{s.http_url}/v2/models/m/config", timeout=30).json() == original


def test_step_unloaded_while_its_ensemble_loads(tmp_path, nereid_server):
    # L0_lifecycle test_concurrent_model_load_unload: the ensemble is being
    # loaded (its step loads slowly) when its step is unloaded; as Triton's
    # (the step is in the load's dependency set), the unload waits for the
    # whole ensemble load, which succeeds, and then the step and the
    # ensemble end unloaded, as Triton's dependency graph leaves them.
    import threading
    repo = str(tmp_path / "models")
    write_model(repo, "slowstep", IDENTITY_SLOW)
    write_model(repo, "ens", """platform: "ensemble" max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "slowstep" input_map { key: "INPUT0" value: "X" }
  output_map { key: "OUTPUT0" value: "Y" } } ] }
""")
    s = nereid_server(repo, "--model-control-mode=explicit")
    url = f"{s.http_url}/v2/repository/models"
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(
        "load", requests.post(f"{url}/ens/load", timeout=60)))
    t.start()
    time.sleep(1.0)
    r = requests.post(f"{url}/slowstep/unload", timeout=60)
    t.join()
    assert r.status_code == 200, r.text
    assert res["load"].status_code == 200, res["load"].text
    assert ready(s, "slowstep") != 200
    assert ready(s, "ens") != 200
    assert requests.get(s.http_url + "/v2/health/ready", timeout=30).status_code == 200


def test_verbose_2_load_and_unload_trace_lines(tmp_path, nereid_server):
    # L0_lifecycle test_shutdown_while_loading greps Triton's
    # LOG_VERBOSE(2) lines "OnLoadFinal()" and "AsyncUnload()" for their
    # order: the load ends before the shutdown's unload begins.
    repo = str(tmp_path / "models")
    write_model(repo, "m", TESTING)
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=m", "--log-verbose=2")
    assert requests.post(f"{s.http_url}/v2/repository/models/m/unload", timeout=30).status_code == 200
    out = s.output()
    assert "OnLoadFinal() 'm' for all version(s)" in out
    assert out.index("OnLoadFinal() 'm'") < out.index("AsyncUnload() 'm'")
    q = nereid_server(repo, "--model-control-mode=explicit", "--load-model=m", "--log-verbose=1")
    assert "OnLoadFinal()" not in q.output()
