"""An ensemble load holds its composing models until the whole load ends
(issue 41): an unload of a step that arrives meanwhile waits for the
ensemble load, as Triton's waits on a conflicting load (its dependency set
is locked), and then unloads the step and the ensemble that uses it. Two
ensembles that share steps in opposite orders load concurrently without
deadlock (the steps are taken all at once)."""
import os
import threading
import time

import requests

IDENTITY = """backend: "identity" max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
{params}"""


def write_model(repo, name, config):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)


def identity(delay_sec=0):
    params = (f'parameters [ {{ key: "creation_delay_sec" value: {{ string_value: "{delay_sec}" }} }} ]'
              if delay_sec else "")
    return IDENTITY.format(params=params)


def chain(first, second):
    """An ensemble X -> first -> T -> second -> Y."""
    return f"""platform: "ensemble" max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{first}" model_version: -1 input_map {{ key: "INPUT0" value: "X" }}
    output_map {{ key: "OUTPUT0" value: "T" }} }},
  {{ model_name: "{second}" model_version: -1 input_map {{ key: "INPUT0" value: "T" }}
    output_map {{ key: "OUTPUT0" value: "Y" }} }} ] }}
"""


def ready(s, model):
    return requests.get(f"{s.http_url}/v2/models/{model}/ready", timeout=30).status_code == 200


def states(s):
    index = requests.post(f"{s.http_url}/v2/repository/index", json={}, timeout=30).json()
    return {m["name"]: m.get("state") for m in index}


def infer(s, model):
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}]}
    return requests.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=30)


def control(s, model, action, results, body=None):
    """POST load/unload of model; results[(model, action)] = (status, text)."""
    r = requests.post(f"{s.http_url}/v2/repository/models/{model}/{action}", json=body,
                      timeout=120)
    results[(model, action)] = (r.status_code, r.text)


def start(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def no_ready_ensemble_without_its_steps(st, ensembles):
    for ens, steps in ensembles.items():
        if st.get(ens) == "READY":
            assert all(st.get(k) == "READY" for k in steps), st


def test_step_unload_waits_for_its_ensemble_load(tmp_path, nereid_server):
    # ens loads fast (ready at once), then slow (3 s). While slow loads, fast
    # is READY and held by ens's load: an unload of fast waits for the whole
    # ensemble load, then unloads fast and ens (Triton's dependency graph).
    # Before, the unload went through at once and ens's load went on with a
    # step gone.
    repo = str(tmp_path / "models")
    write_model(repo, "fast", identity())
    write_model(repo, "slow", identity(3))
    write_model(repo, "ens", chain("fast", "slow"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    res = {}
    loader = start(control, s, "ens", "load", res)
    deadline = time.monotonic() + 30
    while not ready(s, "fast"):
        assert time.monotonic() < deadline, "ens's load did not make fast ready"
        time.sleep(0.05)
    assert not ready(s, "ens")
    unloader = start(control, s, "fast", "unload", res)
    time.sleep(0.5)
    # the step stays loaded while its ensemble loads
    assert ready(s, "fast")
    loader.join(60)
    unloader.join(60)
    assert not loader.is_alive() and not unloader.is_alive(), "load or unload did not end"
    load, unload = res[("ens", "load")], res[("fast", "unload")]
    assert load[0] == 200, load[1]
    assert unload[0] == 200, unload[1]
    log = s.output()
    assert "successfully loaded 'ens'" in log, log
    # the step's unload began once the ensemble's load had ended
    assert log.index("successfully loaded 'ens'") < log.index("successfully unloaded 'fast'"), log
    st = states(s)
    assert (st["fast"], st["ens"], st["slow"]) == ("UNAVAILABLE", "UNAVAILABLE", "READY"), st
    assert "unloading 'ens': its step 'fast' is unloaded" in s.output()
    # Loaded again, the ensemble serves.
    assert requests.post(f"{s.http_url}/v2/repository/models/ens/load",
                         timeout=60).status_code == 200
    r = infer(s, "ens")
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1, 2, 3]


def test_ensembles_sharing_steps_in_opposite_order_do_not_deadlock(tmp_path, nereid_server):
    # e1 uses s1 then s2, e2 uses s2 then s1; both load at once, while a
    # third client unloads s2, round after round. Every call ends (bounded
    # wait), and no ensemble is READY with a step that is not.
    repo = str(tmp_path / "models")
    write_model(repo, "s1", identity(1))
    write_model(repo, "s2", identity())
    write_model(repo, "e1", chain("s1", "s2"))
    write_model(repo, "e2", chain("s2", "s1"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    ensembles = {"e1": ("s1", "s2"), "e2": ("s1", "s2")}
    for rnd in range(4):
        res = {}
        threads = [start(control, s, "e1", "load", res), start(control, s, "e2", "load", res)]
        if rnd % 2:
            time.sleep(0.3)
            threads.append(start(control, s, "s2", "unload", res))
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"round {rnd}: a call hangs: {res}"
        assert all(r[0] == 200 for r in res.values()), res
        st = states(s)
        no_ready_ensemble_without_its_steps(st, ensembles)
        if rnd % 2 == 0:
            assert (st["e1"], st["e2"]) == ("READY", "READY"), st
            for e in ("e1", "e2"):
                r = infer(s, e)
                assert r.status_code == 200, r.text
        # every round starts with nothing loaded (an ensemble that its
        # step's unload unloaded no longer names its dependents)
        for m in ("e1", "e2", "s1", "s2"):
            r = requests.post(f"{s.http_url}/v2/repository/models/{m}/unload",
                              json={"parameters": {"unload_dependents": True}}, timeout=60)
            assert r.status_code == 200, r.text
        st = states(s)
        assert all(v != "READY" for v in st.values()), (rnd, st)
