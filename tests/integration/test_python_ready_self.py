"""pb_utils.is_model_ready about the model itself when the model defines
is_ready(), through the real binary: the answer comes on the socket that
the asking request's server thread reads, so that thread reads it itself
(python_reader.c ready_pump) instead of a thread per call. Asked from execute,
from a thread of the model while execute waits, and from a thread while
execute returns (its DONE arrives while the check reads the socket).
"""
import json

import numpy as np
import pytest

from conftest import Server
from test_python_backend import post, write

SELF_READY = """
import json
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils

NAME = "{name}"

class TritonPythonModel:
    def initialize(self, args):
        self.ok = True
        self.asked = threading.Event()
        self.slow = False

    def is_ready(self):
        if getattr(self, "hostile", False):  # garbage instead of the answer
            import os, socket
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=os.dup(3)).send(b"xx")
            time.sleep(30)
        self.asked.set()
        if self.slow:
            time.sleep(0.3)
        return self.ok

    def execute(self, requests):
        out = []
        for r in requests:
            mode = r.inputs()[0].as_numpy()[0].decode()
            if mode == "loop":
                seen = []
                for i in range(50):
                    self.ok = i % 2 == 0
                    seen.append(pb_utils.is_model_ready(NAME))
                self.ok = True
                box = []
                t = threading.Thread(target=lambda: box.append(pb_utils.is_model_ready(NAME)))
                t.start()
                t.join()
                res = {{"seen": seen, "thread": box}}
            elif mode == "while_returning":
                # a thread asks; execute returns while is_ready() runs, so the
                # server reads execute's answer while it waits for is_ready()'s
                self.asked.clear()
                self.slow = True
                box = []
                t = threading.Thread(target=lambda: box.append(pb_utils.is_model_ready(NAME)))
                t.start()
                self.asked.wait(10)
                self.t, self.box = t, box
                res = {{"returned": True}}
            elif mode == "hostile":
                self.hostile = True
                res = {{"ready": pb_utils.is_model_ready(NAME)}}
            elif mode == "joined":
                self.t.join()
                self.slow = False
                res = {{"thread": self.box}}
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(res).encode()], dtype=np.object_))]))
        return out
"""

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("readyself") / "models")
    for name, count in (("self_ready", 1), ("self_ready2", 2)):
        write(repo, name, CONFIG.format(name=name, count=count), SELF_READY.format(name=name))
    s = Server(repo, [])
    yield s
    assert s.stop() == 0, s.output()


def run(server, model, mode):
    r = post(server, model, [{"name": "MODE", "datatype": "BYTES", "data": [mode]}])
    assert r.status_code == 200, r.text
    return json.loads(r.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize("model", ["self_ready", "self_ready2"])
def test_is_model_ready_about_itself(server, model):
    res = run(server, model, "loop")
    # with two instances, the other one's is_ready() says True: the model is
    # ready when the asking one's says so
    assert res["seen"] == [i % 2 == 0 for i in range(50)]
    assert res["thread"] == [True]


def test_is_model_ready_about_itself_while_execute_returns(server):
    assert run(server, "self_ready", "while_returning") == {"returned": True}
    assert run(server, "self_ready", "joined") == {"thread": [True]}
    assert run(server, "self_ready", "loop")["thread"] == [True]  # still serving
    assert "not healthy" not in server.output()


def test_garbage_while_the_check_reads_ends_the_worker(server):
    # The garbage fails the model's is_model_ready() call, so its execute
    # returns and sends DONE: the worker is ended for the garbage before the
    # reader thread gets the socket back, which must not read that DONE and
    # blame the worker for "an unexpected reply" instead.
    r = post(server, "self_ready", [{"name": "MODE", "datatype": "BYTES", "data": ["hostile"]}])
    assert r.status_code == 500
    assert r.json()["error"].startswith("Stub process 'self_ready_0_0' is not healthy: it sent an invalid message: "
                                       "malformed message header")
    assert "malformed message header" in server.output()
    assert "an unexpected reply" not in server.output()
    assert run(server, "self_ready", "loop")["thread"] == [True]  # restarted
