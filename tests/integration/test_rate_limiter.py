"""The rate limiter through the real binary (--rate-limit=execution_count,
--rate-limit-resource, instance_group rate_limiter): models on the testing
backend append "start <model> <running>" / "end <model>" lines to one
execution log, so the tests check overlap and order, never durations. A
gated request (wait_for_file) holds its resources until the test opens the
gate."""
import os
import subprocess
import threading
import time

import pytest
import requests

from conftest import NEREID
from http_helpers import pending_requests

IO = """input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def model(repo, name, log, resources, priority=0, count=1, delay_ms=0):
    """A testing-backend model with `count` instances needing `resources`
    ([(name, count, global)]) at `priority`."""
    res = ", ".join(f'{{ name: "{n}" count: {c}{" global: true" if g else ""} }}'
                    for n, c, g in resources)
    limiter = f"rate_limiter {{ resources [ {res} ] priority: {priority} }}" if resources else ""
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(f"""backend: "testing" max_batch_size: 8
instance_group [ {{ count: {count} kind: KIND_CPU {limiter} }} ]
parameters {{ key: "execution_log" value {{ string_value: "{log}" }} }}
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay_ms}" }} }}
""" + IO)


def infer(s, name, gate=None):
    """One request to `name`; with `gate`, it executes until the file exists
    (at most 300 s, far beyond any wait in these tests)."""
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    if gate:
        body["parameters"] = {"wait_for_file": gate, "wait_for_file_ms": 300000}
    r = requests.post(f"{s.http_url}/v2/models/{name}/infer", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r


def in_background(fn, *args):
    t = threading.Thread(target=fn, args=args)
    t.start()
    return t


def read_log(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split() for line in f.read().splitlines()]


def starts(log):
    return [(e[1], int(e[2])) for e in read_log(log) if e[0] == "start"]


def wait_for(cond, what, timeout=120):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.01)


def open_gate(gate):
    with open(gate, "w"):
        pass


def test_shared_resource_of_one_never_overlaps(nereid_server, tmp_path):
    """Two models (two instances each) needing R, which the server has one
    of (the most any instance needs): one execution at a time, across
    models. A request of 'b' that arrives while 'a' holds R starts only
    after 'a' ends."""
    repo, log, gate = str(tmp_path / "m"), str(tmp_path / "log"), str(tmp_path / "gate")
    model(repo, "a", log, [("R", 1, False)], count=2, delay_ms=2)
    model(repo, "b", log, [("R", 1, False)], count=2, delay_ms=2)
    s = nereid_server(repo, "--rate-limit=execution_count")
    held = in_background(infer, s, "a", gate)
    wait_for(lambda: ("a", 1) in starts(log), "a did not start")
    waiting = in_background(infer, s, "b")
    time.sleep(0.3)  # lets b reach the limiter; a late arrival cannot fail the test
    assert [m for m, _ in starts(log)] == ["a"], read_log(log)
    open_gate(gate)
    held.join()
    waiting.join()
    assert read_log(log) == [["start", "a", "1"], ["end", "a"], ["start", "b", "1"], ["end", "b"]]
    clients = [in_background(infer, s, name) for name in ["a", "b"] * 12]
    for t in clients:
        t.join()
    runs = starts(log)
    assert len(runs) == 26 and max(n for _, n in runs) == 1, runs


def test_rate_limit_off_ignores_resources(nereid_server, tmp_path):
    """--rate-limit=off (the default): 'b' runs while 'a' holds R, and a
    config whose needs exceed the given counts still loads."""
    repo, log, gate = str(tmp_path / "m"), str(tmp_path / "log"), str(tmp_path / "gate")
    model(repo, "a", log, [("R", 1, False)])
    model(repo, "b", log, [("R", 3, False)])
    for args in [(), ("--rate-limit=off",)]:
        if os.path.exists(log):
            os.unlink(log)
        if os.path.exists(gate):
            os.unlink(gate)
        s = nereid_server(repo, *args, "--rate-limit-resource=R:1")
        held = in_background(infer, s, "a", gate)
        wait_for(lambda: ("a", 1) in starts(log), "a did not start")
        infer(s, "b")  # completes while a still holds R
        assert ("b", 2) in starts(log)
        open_gate(gate)
        held.join()
        assert s.stop() == 0


def test_resource_of_two_runs_two(nereid_server, tmp_path):
    """--rate-limit-resource=R:2: two models holding R run together; a third
    starts only when one of them ends."""
    repo, log = str(tmp_path / "m"), str(tmp_path / "log")
    gate_a, gate_b = str(tmp_path / "gate_a"), str(tmp_path / "gate_b")
    for name in "abc":
        model(repo, name, log, [("R", 1, False)])
    s = nereid_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:2")
    held_a = in_background(infer, s, "a", gate_a)
    held_b = in_background(infer, s, "b", gate_b)
    wait_for(lambda: len(starts(log)) == 2, "a and b did not both start")
    assert sorted(n for _, n in starts(log)) == [1, 2]
    waiting = in_background(infer, s, "c")
    time.sleep(0.3)  # lets c reach the limiter; a late arrival cannot fail the test
    assert "c" not in [m for m, _ in starts(log)]
    open_gate(gate_a)
    held_a.join()
    waiting.join()
    open_gate(gate_b)
    held_b.join()
    events = read_log(log)
    assert events.index(["start", "c", "2"]) > events.index(["end", "a"]), events


def test_priority_gives_half_the_turns(nereid_server, tmp_path):
    """'p1' (priority 1) and 'p2' (priority 2) share R; both have 16
    requests queued when R frees: p2 gets one turn for each two of p1's
    (Triton: turns by execution count times priority). Whether both
    instances are already waiting for R when it frees does not matter: an
    instance that comes late still gets the turns its count gives it."""
    repo, log, gate = str(tmp_path / "m"), str(tmp_path / "log"), str(tmp_path / "gate")
    model(repo, "gate", log, [("R", 1, False)])
    # Executions long enough (10 ms) that an instance's thread is back in
    # the limiter well before its deferral lapses, even on a busy machine.
    model(repo, "p1", log, [("R", 1, False)], priority=1, delay_ms=10)
    model(repo, "p2", log, [("R", 1, False)], priority=2, delay_ms=10)
    s = nereid_server(repo, "--rate-limit=execution_count")
    held = in_background(infer, s, "gate", gate)
    wait_for(lambda: ("gate", 1) in starts(log), "gate did not start")
    n = 16
    clients = [in_background(infer, s, name) for name in ["p1", "p2"] * n]
    # Every request queued while the gate holds R (it holds it until
    # opened, so the wait can be long on a loaded machine).
    wait_for(lambda: (pending_requests(s, "p1"), pending_requests(s, "p2")) == (n, n),
             "not every request was queued", timeout=300)
    open_gate(gate)
    held.join()
    for t in clients:
        t.join()
    order = [m for m, _ in starts(log)][1:]
    assert len(order) == 2 * n
    p2_turns = order[:[i for i, m in enumerate(order) if m == "p1"][n - 1]].count("p2")
    assert n // 2 - 2 <= p2_turns <= n // 2 + 2, " ".join(order)


@pytest.mark.parametrize("counts", [["--rate-limit-resource=R:4", "--rate-limit-resource=G:2"], []],
                         ids=["explicit", "implicit"])
def test_cross_model_prioritization_limited_resource(nereid_server, tmp_path, counts):
    """L0_rate_limiter's test_cross_model_prioritization_limited_resource in
    turns. 'a' is custom_zero_1_float32 (R 4, priority 0 = 1), 'b' its _v2
    (R 2 and global G 2, priority 2): they never run together, and both
    always have work. The QA client keeps 8 requests of each in flight and
    stops once 'a' has sent 80 (when a's 72nd ends); 'b' has then sent its
    finished turns + 8 and sends one more, so the QA ratio is
    80 / (b's turns before a's 72nd + 9), and Triton passes it (> 1.8):
    each instance starts with 2 executions (Triton's INIT and WARM_UP
    payloads), so b gets 35 of those turns, not 36 (80/45 = 1.78).
    Here every request is queued while a's first (gated) holds R, so the
    order of turns is the limiter's alone."""
    repo, log, gate = str(tmp_path / "m"), str(tmp_path / "log"), str(tmp_path / "gate")
    model(repo, "a", log, [("R", 4, False)])
    model(repo, "b", log, [("R", 2, False), ("G", 2, True)], priority=2)
    s = nereid_server(repo, "--rate-limit=execution_count", *counts)
    held = in_background(infer, s, "a", gate)
    wait_for(lambda: ("a", 1) in starts(log), "a did not start")
    n_a, n_b = 80, 45
    clients = [in_background(infer, s, name) for name in ["a"] * (n_a - 1) + ["b"] * n_b]
    wait_for(lambda: (pending_requests(s, "a"), pending_requests(s, "b")) == (n_a - 1, n_b),
             "not every request was queued", timeout=300)
    open_gate(gate)
    held.join()
    for t in clients:
        t.join()
    order = [m for m, _ in starts(log)]
    assert len(order) == n_a + n_b and max(n for _, n in starts(log)) == 1
    a72 = [i for i, m in enumerate(order) if m == "a"][71]
    b_turns = order[:a72].count("b")
    ratio = n_a / (b_turns + 8 + 1)
    assert b_turns == 35 and ratio > 1.8, (ratio, "".join(order))


def index_reason(s, name):
    for m in requests.post(f"{s.http_url}/v2/repository/index", timeout=10).json():
        if m["name"] == name:
            return m.get("reason", "")
    return None


def test_load_errors_are_tritons(nereid_server, tmp_path):
    repo, log = str(tmp_path / "m"), str(tmp_path / "log")
    model(repo, "needs3", log, [("R", 3, False)])
    model(repo, "local", log, [("G", 1, False)])
    model(repo, "ok", log, [("R", 2, False)])
    s = nereid_server(repo, "--rate-limit=execution_count", "--rate-limit-resource=R:2",
                      "--rate-limit-resource=G:1", "--exit-on-error=false")
    assert ('Resource count for "R" is limited to 2 which will prevent scheduling of one or more '
            'model instances, the minimum required count is 3') in index_reason(s, "needs3")
    infer(s, "ok")
    assert s.stop() == 0
    model(repo, "global", log, [("G", 1, True)])
    s = nereid_server(repo, "--rate-limit=execution_count", "--model-control-mode=explicit",
                      "--load-model=local")
    r = requests.post(f"{s.http_url}/v2/repository/models/global/load", timeout=60)
    assert r.status_code == 400
    assert ('Resource "G" is present as both global and device-specific resource in the model '
            'configuration.') in r.json()["error"]
    infer(s, "local")


def run_cli(*args):
    return subprocess.run([NEREID, "--model-repository=/nonexistent", *args],
                          capture_output=True, text=True, timeout=60)


def test_bad_flag_values_give_tritons_texts():
    r = run_cli("--rate-limit=sometimes")
    assert r.returncode == 2 and "invalid argument for --rate-limit" in r.stderr
    fmt = ("--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
           "'<resource_name>:<count>'. Got ")
    for value in ["R", "R:1:0:2"]:
        r = run_cli(f"--rate-limit-resource={value}")
        assert r.returncode == 2 and fmt + value in r.stderr, r.stderr
    r = run_cli("--rate-limit-resource=R:many")
    assert r.returncode == 2 and "Invalid option value. Got many" in r.stderr
    r = run_cli("--rate-limit-resource=R:1:gpu")
    assert r.returncode == 2 and "Invalid option value. Got gpu" in r.stderr
    r = run_cli("--rate-limit-resource=R:99999999999")
    assert r.returncode == 2 and "Provided option value is out of bound. Got 99999999999" in r.stderr
    # Accepted values reach the repository (which does not exist here).
    r = run_cli("--rate-limit=EXECUTION_COUNT", "--rate-limit-resource=R:2:0")
    assert r.returncode == 1 and "failed to open model repository" in r.stderr, r.stderr


def test_dynamic_batch_is_formed_when_the_turn_comes(nereid_server, tmp_path):
    """Triton's rate limiter hands the dynamic batcher an instance first and
    the batch is formed then (L0_rate_limiter test_single_model_dynamic_
    batching): requests that arrive while every instance waits for R make
    one batch, not one batch each."""
    repo, log, gate = str(tmp_path / "m"), str(tmp_path / "log"), str(tmp_path / "gate")
    model(repo, "dyn", log, [("R", 1, False)], count=2)
    with open(os.path.join(repo, "dyn", "config.pbtxt"), "a") as f:
        f.write("dynamic_batching { preferred_batch_size: [ 1, 2, 3, 4 ] }\n")
    s = nereid_server(repo, "--rate-limit=execution_count")
    held = in_background(infer, s, "dyn", gate)
    wait_for(lambda: ("dyn", 1) in starts(log), "the gated request did not start")
    clients = [in_background(infer, s, "dyn") for _ in range(3)]
    wait_for(lambda: pending_requests(s, "dyn") == 3, "not every request was queued")
    open_gate(gate)
    held.join()
    for t in clients:
        t.join()
    st = requests.get(f"{s.http_url}/v2/models/dyn/stats", timeout=10).json()["model_stats"][0]
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]} == {1: 1, 3: 1}


def test_startup_model_table_names_each_failure(tmp_path):
    """Triton's startup model table (PrintBackendAndModelSummary): one row per
    model version with its state and, unescaped, the reason it failed;
    L0_rate_limiter greps the resource texts there before the server exits."""
    repo, log = str(tmp_path / "m"), str(tmp_path / "log")
    model(repo, "needs4", log, [("R", 4, False)])
    model(repo, "ok", log, [])
    r = subprocess.run([NEREID, f"--model-repository={repo}", "--rate-limit=execution_count",
                        "--rate-limit-resource=R:1", "--http-port=0", "--grpc-port=0",
                        "--metrics-port=0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    reason = ('Invalid argument: Resource count for "R" is limited to 1 which will prevent '
              'scheduling of one or more model instances, the minimum required count is 4')
    status = f"UNAVAILABLE: {reason}"
    width = len(status)
    border = "+--------+---------+" + "-" * (width + 2) + "+"
    lines = r.stdout.splitlines()
    start = lines.index(border)
    assert lines[start - 1].startswith("I") and lines[start - 1].endswith("] ")
    assert lines[start:start + 6] == [
        border,
        "| Model  | Version | " + "Status".ljust(width) + " |",
        border,
        "| needs4 | 1       | " + status + " |",
        "| ok     | 1       | " + "READY".ljust(width) + " |",
        border]
