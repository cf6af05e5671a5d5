"""The python backend's hand-off of the worker's socket between execute and
the reader thread (python_reader.c, "Arming the reader"), and spin-wait-us
(python_spin.c), through the real binary.

- Messages a model sends between executes (a thread's log lines and BLS
  calls) are read, in order, also while executes keep coming and after
  they stop (the reader re-arms itself after an execute left its
  registration disarmed).
- A worker killed while the instance is idle is noticed without a request
  (the model stops being ready); one killed during execute fails that
  execute, also while execute spins.
- --backend-config=python,spin-wait-us: 0 (the default) never spins, a large value
  spins (the count in the verbose line at instance fini), nonsense is
  refused; the worker gets the same budget for its wait for the next
  request and spins for it (its own counters, read by a model), as long
  as the server's hint for each execute allows: the whole budget when the
  execute is the only Python one in flight, 0 when another one is.
No timing is asserted: waits poll with generous deadlines.
"""
import os
import signal
import textwrap
import time

import pytest
import requests


PID_MODEL = """
import os
import signal
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if int(x[0]) == -9:
                os.kill(os.getpid(), signal.SIGKILL)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", np.array([os.getpid()], np.int64))]))
        return out
"""

PID_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Each execute starts a thread that, after execute returned, logs numbered
# lines, calls another model through BLS between them, and logs the end.
CHATTY_MODEL = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        out = []
        for r in requests:
            tag = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            def run(tag=tag):
                time.sleep(0.05)  # execute has returned
                for i in range(20):
                    pb_utils.Logger.log_info(f"chatty {tag} line {i}")
                    if i % 5 == 4:
                        res = pb_utils.InferenceRequest(
                            model_name="pid", requested_output_names=["Y"],
                            inputs=[pb_utils.Tensor("X", np.array([i], np.int64))]).exec()
                        if res.has_error():
                            pb_utils.Logger.log_info(f"chatty {tag} bls error {res.error()}")
                pb_utils.Logger.log_info(f"chatty {tag} end")
            t = threading.Thread(target=run)
            t.start()
            self.threads.append(t)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", np.array([tag], np.int64))]))
        return out

    def finalize(self):
        for t in self.threads:
            t.join()
"""


# The worker's side of spin-wait-us, as the worker sees it: its budget (µs),
# how many messages its spin found, the server's hint for this execute (µs),
# how many spins it began and how many it stopped for other threads.
SPIN_PROBE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        w = pb_utils._worker
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "Y", np.array([round(w.spin_s * 1e6), w.spin_caught, w.spin_hint_us(),
                                   w.spin_n, w.spin_stopped], np.int64))])
                for _ in requests]
"""

SPIN_PROBE_CONFIG = """
name: "spinprobe"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT64 dims: [ 5 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Two instances whose executes wait for each other (each leaves a file and
# waits for the other's): the second EXECUTE is sent while the first is in
# flight. Each answers the server's hint for its own execute.
HINT_PAIR_MODEL = """
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.dir = json.loads(args["model_config"])["parameters"]["dir"]["string_value"]

    def execute(self, requests):
        hint = pb_utils._worker.spin_hint_us()
        out = []
        for r in requests:
            tag = int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            open(os.path.join(self.dir, str(tag)), "w").close()
            deadline = time.time() + 30
            while not os.path.exists(os.path.join(self.dir, str(1 - tag))):
                if time.time() > deadline:
                    break
                time.sleep(0.005)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", np.array([hint], np.int64))]))
        return out
"""

HINT_PAIR_CONFIG = """
name: "hintpair"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
parameters {{ key: "dir" value: {{ string_value: "{dir}" }} }}
"""


def write(repo, name, config, model_py):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))
    with open(os.path.join(d, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(model_py))


@pytest.fixture
def repo(tmp_path):
    r = str(tmp_path / "models")
    write(r, "pid", PID_CONFIG.format(name="pid"), PID_MODEL)
    write(r, "chatty", PID_CONFIG.format(name="chatty"), CHATTY_MODEL)
    write(r, "spinprobe", SPIN_PROBE_CONFIG, SPIN_PROBE_MODEL)
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    write(r, "hintpair", HINT_PAIR_CONFIG.format(dir=rendezvous), HINT_PAIR_MODEL)
    return r


def call(server, model, x):
    body = {"inputs": [{"name": "X", "datatype": "INT64", "shape": [1], "data": [x]}]}
    return requests.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=60)


def value(r):
    assert r.status_code == 200, r.text
    return int(r.json()["outputs"][0]["data"][0])


def wait_for(pred, what, timeout_s=30):
    deadline = time.time() + timeout_s
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def log_text(server):
    with open(server.log_path) as f:
        return f.read()


def spin_counts(text, instance):
    """(executes spun, answered while spinning, executes that let the
    worker spin after them) from the verbose fini line."""
    for line in text.splitlines():
        if f"'{instance}' spin-wait:" in line:
            words = line.split("spin-wait:")[1].split()
            return int(words[0]), int(words[3]), int(words[7])
    return None


def chatty_lines(text, tag):
    return [line.split(f"chatty {tag} ")[1].rstrip('"').strip()
            for line in text.splitlines() if f"chatty {tag} " in line]


def expected_chatty():
    return [f"line {i}" for i in range(20)] + ["end"]


@pytest.mark.parametrize("spin", ["0", "60"])
def test_thread_messages_between_executes_arrive_in_order(nereid_server, repo, spin):
    s = nereid_server(repo, f"--backend-config=python,spin-wait-us={spin}")
    # One burst: the threads send while more executes run and after they stop.
    for tag in range(5):
        assert value(call(s, "chatty", tag)) == tag
    for _ in range(50):
        value(call(s, "pid", 1))
    for tag in range(5):
        wait_for(lambda: chatty_lines(s.output(), tag)[-1:] == ["end"], f"chatty {tag} end")
        assert chatty_lines(s.output(), tag) == expected_chatty()
    # One request after a quiet spell: its thread talks to an idle server.
    time.sleep(0.2)
    assert value(call(s, "chatty", 7)) == 7
    wait_for(lambda: chatty_lines(s.output(), 7)[-1:] == ["end"], "chatty 7 end")
    assert chatty_lines(s.output(), 7) == expected_chatty()
    assert "bls error" not in s.output()


def test_worker_killed_while_idle_is_noticed(nereid_server, repo):
    s = nereid_server(repo)
    pid = None
    for _ in range(20):  # executes back to back: the reader is left disarmed
        pid = value(call(s, "pid", 1))
    os.kill(pid, signal.SIGKILL)
    # Noticed with no request: the worker is restarted at once (the model is
    # not ready meanwhile: test_python_worker_restart.py holds that window).
    wait_for(lambda: "restarted the worker of 'pid_0_0'" in s.output(),
             "the death to be noticed and the worker restarted")
    ready = f"{s.http_url}/v2/models/pid/ready"
    assert requests.get(ready).status_code == 200
    new_pid = value(call(s, "pid", 1))  # a new worker
    assert new_pid != pid


@pytest.mark.parametrize("spin", ["0", "10000"])
def test_worker_killed_during_execute_fails_it(nereid_server, repo, spin):
    s = nereid_server(repo, f"--backend-config=python,spin-wait-us={spin}")
    pid = value(call(s, "pid", 1))
    r = call(s, "pid", -9)
    assert r.status_code >= 400
    assert "Stub process 'pid_0_0' is not healthy." in r.json()["error"]
    assert value(call(s, "pid", 1)) != pid


@pytest.mark.parametrize("flags", [["--backend-config=python,spin-wait-us=0"], []])
def test_spin_wait_zero_never_spins(nereid_server, repo, flags):
    # 0 is also the default: spinning is opt-in (it costs CPU per request)
    s = nereid_server(repo, "--log-verbose=1", *flags)
    for _ in range(30):
        value(call(s, "pid", 1))
    assert s.stop() == 0
    assert spin_counts(log_text(s), "pid_0_0") == (0, 0, 0)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="a spin needs a CPU besides the worker's")
def test_spin_wait_spins(nereid_server, repo):
    s = nereid_server(repo, "--log-verbose=1", "--backend-config=python,spin-wait-us=10000")
    for _ in range(30):
        value(call(s, "pid", 1))
    assert s.stop() == 0
    spun, answered, hinted = spin_counts(log_text(s), "pid_0_0")
    assert spun > 0 and answered <= spun
    assert hinted == 30  # one request at a time: each let the worker spin


@pytest.mark.parametrize("bad", ["abc", "-1", "10001"])
def test_spin_wait_refuses_nonsense(nereid_server, repo, bad):
    s = nereid_server(repo, "--exit-on-error=false", f"--backend-config=python,spin-wait-us={bad}")
    r = requests.get(f"{s.http_url}/v2/models/pid/ready")
    assert r.status_code != 200
    assert (f"python backend: spin-wait-us must be an integer from 0 to 10000, got '{bad}'"
            in s.output())


def spin_probe(server):
    r = call(server, "spinprobe", 1)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"]


def test_worker_spin_is_off_by_default(nereid_server, repo):
    """Without the key the worker never spins (no page, so no budget and
    no hint), on any number of CPUs: spin-wait is opt-in (issue 42)."""
    s = nereid_server(repo)
    for _ in range(30):
        budget, caught, hint, spins, stopped = spin_probe(s)
    assert (budget, caught, hint, spins, stopped) == (0, 0, 0, 0, 0)


def test_worker_spins_for_its_next_request(nereid_server, repo):
    """With spin-wait-us the worker polls for its next request before it
    sleeps when the server's hint allows (one request at a time: always).
    Whether a spin finds the request depends on the machine (a spin stops
    when threads wait for a CPU): a spin begins, and each one found the
    request, was stopped, or ran out."""
    s = nereid_server(repo, "--backend-config=python,spin-wait-us=10000")
    budget, caught, hint, spins, stopped = spin_probe(s)
    assert (budget, hint) == (10000, 10000)
    # a spin needs the previous wait to be shorter than the budget, and a
    # stopped one backs off for 32 requests: keep asking, bounded
    deadline = time.time() + 60
    while spins == 0 and time.time() < deadline:
        for _ in range(40):
            budget, caught, hint, spins, stopped = spin_probe(s)
            assert hint == 10000
    assert spins > 0
    assert caught + stopped <= spins


def test_worker_spin_hint_is_zero_when_another_execute_runs(nereid_server, repo):
    """Two executes in flight at once (two instances that wait for each
    other): the first was alone when sent (its worker may spin after it),
    the second was not (its worker must not)."""
    import concurrent.futures
    s = nereid_server(repo, "--backend-config=python,spin-wait-us=300")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(call, s, "hintpair", 0)
        deadline = time.time() + 30
        while not os.listdir(os.path.join(os.path.dirname(repo), "rendezvous")):
            assert time.time() < deadline, "the first execute did not start"
            time.sleep(0.005)
        second = pool.submit(call, s, "hintpair", 1)
        hints = [value(first.result()), value(second.result())]
    assert hints == [300, 0]
