"""--model-namespacing=true as Triton does it (model_repository_manager.cc):
the same model name in several repositories, each copy in its repository's
namespace. An ensemble's step names the model in the ensemble's own
repository first, else the one repository that has it; a request names a
model by name alone, and a name known in two namespaces is Triton's
ambiguity error; metrics carry a namespace label. The two composing models
differ: "composing_model" in repo a is the add_sub backend (OUTPUT0 = a+b,
OUTPUT1 = a-b), in repo b the testing backend (an identity)."""
import os
import shutil
import time

import requests

X = [float(i) for i in range(16)]
Y = [2.0] * 16
ADD_SUB = ([x + y for x, y in zip(X, Y)], [x - y for x, y in zip(X, Y)])
IDENTITY = (X, Y)

IO = """max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def composing(name, backend):
    return f'name: "{name}"\nbackend: "{backend}"\n' + IO


def ensemble(name, step):
    return (f'name: "{name}"\nplatform: "ensemble"\n' + IO + f"""
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
  output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
}} ] }}
""")


def write(repo, name, config):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"))
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)


def repos(tmp_path, a_models, b_models):
    out = []
    for tag, models in (("a", a_models), ("b", b_models)):
        repo = str(tmp_path / f"{tag}_repo")
        os.makedirs(repo)
        for name, cfg in models:
            write(repo, name, cfg)
        out.append(repo)
    return out


def infer(s, model):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": X},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": Y}]}
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def outputs(s, model):
    r = infer(s, model)
    assert r.status_code == 200, r.text
    out = {o["name"]: o["data"] for o in r.json()["outputs"]}
    return out["OUTPUT0"], out["OUTPUT1"]


def assert_ambiguous(s, model, n=2):
    r = infer(s, model)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == (
        f"There are {n} identifiers of model '{model}' in global map, model namespace must be "
        "provided to resolve ambiguity.")


def index(s):
    r = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def duplication(tmp_path):
    """Each repository: an ensemble over its own 'composing_model'."""
    return repos(tmp_path,
                 [("ens_a", ensemble("ens_a", "composing_model")),
                  ("composing_model", composing("composing_model", "add_sub"))],
                 [("ens_b", ensemble("ens_b", "composing_model")),
                  ("composing_model", composing("composing_model", "testing"))])


def ensemble_duplication(tmp_path):
    """Each repository: a 'simple_ensemble' over a composing model of its own."""
    return repos(tmp_path,
                 [("simple_ensemble", ensemble("simple_ensemble", "composing_addsub")),
                  ("composing_addsub", composing("composing_addsub", "add_sub"))],
                 [("simple_ensemble", ensemble("simple_ensemble", "composing_identity")),
                  ("composing_identity", composing("composing_identity", "testing"))])


def test_ensembles_use_their_own_repositorys_copy(nereid_server, tmp_path):
    a, b = duplication(tmp_path)
    s = nereid_server([a, b], "--model-namespacing=true")
    assert outputs(s, "ens_a") == ADD_SUB
    assert outputs(s, "ens_b") == IDENTITY
    assert_ambiguous(s, "composing_model")
    # Every lookup by the ambiguous name is the same error.
    r = requests.get(f"{s.http_url}/v2/models/composing_model", timeout=10)
    assert r.status_code == 400 and "resolve ambiguity" in r.json()["error"]
    r = requests.get(f"{s.http_url}/v2/models/composing_model/stats", timeout=10)
    assert r.status_code == 400 and "resolve ambiguity" in r.json()["error"]
    # Both copies are in the index, Triton's order: by namespace, then name.
    assert [(m["name"], m["state"]) for m in index(s)] == [
        ("composing_model", "READY"), ("ens_a", "READY"),
        ("composing_model", "READY"), ("ens_b", "READY")]
    # The ensemble's config says which copy its step uses, as Triton's does.
    cfg = requests.get(f"{s.http_url}/v2/models/ens_a/config", timeout=10).json()
    assert cfg["ensemble_scheduling"]["step"][0]["model_namespace"] == a
    # Metrics: a namespace label between model and version.
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    for repo in (a, b):
        assert ('nv_inference_request_success{model="composing_model",namespace="%s",'
                'version="1"} 1' % repo) in text
    assert 'nv_inference_request_success{model="ens_a",namespace="%s",version="1"} 1' % a in text


def test_without_namespacing_a_duplicate_name_is_unavailable(nereid_server, tmp_path):
    a, b = duplication(tmp_path)
    s = nereid_server([a, b], "--exit-on-error=false", "--strict-readiness=false")
    rows = [m for m in index(s) if m["name"] == "composing_model"]
    assert len(rows) == 1 and rows[0]["state"] == "UNAVAILABLE"
    assert "model appears in two or more repositories" in rows[0]["reason"]


def test_unique_names_and_ensemble_duplication(nereid_server, tmp_path):
    a, b = ensemble_duplication(tmp_path)
    s = nereid_server([a, b], "--model-namespacing=true")
    assert outputs(s, "composing_addsub") == ADD_SUB
    assert outputs(s, "composing_identity") == IDENTITY
    assert_ambiguous(s, "simple_ensemble")
    r = requests.get(f"{s.http_url}/v2/models/simple_ensemble/ready", timeout=10)
    assert r.status_code == 400


def test_step_found_in_another_repository(nereid_server, tmp_path):
    """A step missing from the ensemble's repository is the one copy
    elsewhere; missing everywhere is Triton's error naming ns::ensemble."""
    a, b = repos(tmp_path,
                 [("ens_a", ensemble("ens_a", "composing_model")),
                  ("broken", ensemble("broken", "nowhere"))],
                 [("composing_model", composing("composing_model", "testing"))])
    s = nereid_server([a, b], "--model-namespacing=true", "--exit-on-error=false",
                      "--strict-readiness=false")
    assert outputs(s, "ens_a") == IDENTITY
    assert outputs(s, "composing_model") == IDENTITY
    row = [m for m in index(s) if m["name"] == "broken"][0]
    assert row["state"] == "UNAVAILABLE"
    assert (f"ensemble {a}::broken contains models that are not available or ambiguous: "
            "nowhere") in row["reason"]


def test_explicit_load_and_dynamic_resolution(nereid_server, tmp_path):
    """Triton's ModelNamespaceExplicit.test_dynamic_resolution: with repo a's
    copy moved away, ens_a uses repo b's; back again, loading ens_a once
    more brings its own copy back."""
    a, b = duplication(tmp_path)
    s = nereid_server([a, b], "--model-namespacing=true", "--model-control-mode=explicit")
    own = os.path.join(a, "composing_model")
    aside = str(tmp_path / "composing_model")
    shutil.move(own, aside)
    for m in ("ens_a", "ens_b"):
        r = requests.post(f"{s.http_url}/v2/repository/models/{m}/load", timeout=60)
        assert r.status_code == 200, r.text
    assert outputs(s, "ens_a") == IDENTITY
    assert outputs(s, "ens_b") == IDENTITY
    assert outputs(s, "composing_model") == IDENTITY  # one copy known
    shutil.move(aside, own)
    r = requests.post(f"{s.http_url}/v2/repository/models/ens_a/load", timeout=60)
    assert r.status_code == 200, r.text
    assert outputs(s, "ens_a") == ADD_SUB
    assert outputs(s, "ens_b") == IDENTITY
    assert_ambiguous(s, "composing_model")
    # Unloading a name unloads every namespace's copy.
    r = requests.post(f"{s.http_url}/v2/repository/models/composing_model/unload", timeout=60)
    assert r.status_code == 200, r.text
    states = [m.get("state") for m in index(s) if m["name"] == "composing_model"]
    assert states == ["UNAVAILABLE", "UNAVAILABLE"]


def test_explicit_load_of_a_duplicated_ensemble_loads_both(nereid_server, tmp_path):
    a, b = ensemble_duplication(tmp_path)
    s = nereid_server([a, b], "--model-namespacing=true", "--model-control-mode=explicit")
    r = infer(s, "simple_ensemble")  # nothing loaded yet: Triton's INVALID_ARG
    assert r.status_code == 400
    assert r.json()["error"] == "Request for unknown model: 'simple_ensemble' is not found"
    r = requests.post(f"{s.http_url}/v2/repository/models/simple_ensemble/load", timeout=60)
    assert r.status_code == 200, r.text
    assert outputs(s, "composing_addsub") == ADD_SUB
    assert outputs(s, "composing_identity") == IDENTITY
    assert_ambiguous(s, "simple_ensemble")


def expect(s, model, want):
    def check():
        assert outputs(s, model) == want
    return check


def wait_for(check, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def test_poll_reconnects_ensembles(nereid_server, tmp_path):
    """Triton's ModelNamespacePoll.test_dynamic_resolution: the poll that
    sees repo a's copy gone points ens_a at repo b's; the one that sees it
    back points ens_a at its own again."""
    a, b = duplication(tmp_path)
    s = nereid_server([a, b], "--model-namespacing=true", "--model-control-mode=poll",
                      "--repository-poll-secs=1")
    assert outputs(s, "ens_a") == ADD_SUB
    own = os.path.join(a, "composing_model")
    aside = str(tmp_path / "composing_model")
    shutil.move(own, aside)
    wait_for(expect(s, "ens_a", IDENTITY))
    assert outputs(s, "composing_model") == IDENTITY
    assert outputs(s, "ens_b") == IDENTITY
    shutil.move(aside, own)
    wait_for(expect(s, "ens_a", ADD_SUB))
    assert outputs(s, "ens_b") == IDENTITY
    wait_for(lambda: assert_ambiguous(s, "composing_model"))
