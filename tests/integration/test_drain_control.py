"""Model control while a graceful exit drains (issue 39): once SIGTERM made
the server not ready, Triton's LoadModel, UnloadModel, RepositoryIndex and
ModelIsReady answer UNAVAILABLE "Server not ready" (core src/server.cc
checks ready_state_ first). A load or unload arriving on a live keep-alive
connection during --exit-timeout-secs is refused with 503 and changes
nothing; the repository index is refused the same way and model readiness
is false. Over gRPC no new call is accepted during the drain at all (an
open channel's new call is refused: UNAVAILABLE). The drain is held by a
request that executes until the test creates a file, so nothing here
depends on timing."""
import http.client
import json
import os
import shutil
import signal
import threading
import time

import grpc
from conftest import Server
from grpc_util import identity_repo, stubs

pb, pbg, _, _ = stubs()


def connect(s):
    c = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
    c.connect()
    return c


def call(c, method, path, body=None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    return r.status, r.read()


def infer_body(value, parameters=None, shape=(1,)):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(shape),
                        "data": [value]}]}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body)


def wait_for(pred, what):
    deadline = time.time() + 30
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_model_control_refused_while_draining(tmp_path):
    repo = identity_repo(str(tmp_path / "models"))
    s = Server(repo, ["--exit-timeout-secs=30", "--model-control-mode=explicit",
                      "--load-model=slow", "--load-model=id_batch"])
    release = tmp_path / "release"
    started = tmp_path / "started"
    try:
        names = ("busy", "load", "unload", "index", "ready", "infer")
        conns = {n: connect(s) for n in names}
        ch = grpc.insecure_channel(s.grpc_addr)
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        # Before the signal both work (and are answered on a live connection).
        st, raw = call(conns["index"], "POST", "/v2/repository/index", "{}")
        assert st == 200 and {"name": "slow", "version": "1", "state": "READY"} in json.loads(raw)
        # A request that holds the drain until the test releases it.
        result = {}

        def busy():
            result["reply"] = call(conns["busy"], "POST", "/v2/models/slow/infer", infer_body(
                1.0, {"wait_for_file": str(release), "started_file": str(started)}))

        t = threading.Thread(target=busy)
        t.start()
        wait_for(lambda: os.path.exists(started), "the long request to start")
        s.proc.send_signal(signal.SIGTERM)
        # The countdown is logged once the server turned not ready.
        wait_for(lambda: "Timeout 30: " in s.output(), "the drain to begin")
        not_ready = {"error": "Server not ready"}
        st, raw = call(conns["load"], "POST", "/v2/repository/models/id_fp32/load", "{}")
        assert st == 503 and json.loads(raw) == not_ready, (st, raw)
        st, raw = call(conns["unload"], "POST", "/v2/repository/models/id_batch/unload", "{}")
        assert st == 503 and json.loads(raw) == not_ready, (st, raw)
        st, raw = call(conns["index"], "POST", "/v2/repository/index", "{}")
        assert st == 503 and json.loads(raw) == not_ready, (st, raw)
        # Model readiness is false while the server exits (Triton's
        # ModelIsReady: "Server not ready", answered as not ready).
        st, raw = call(conns["ready"], "GET", "/v2/models/id_batch/ready")
        assert st == 400, (st, raw)
        # The refused unload changed nothing: id_batch still serves.
        st, raw = call(conns["infer"], "POST", "/v2/models/id_batch/infer", infer_body(4.0, shape=(1, 1)))
        assert st == 200 and json.loads(raw)["outputs"][0]["data"] == [4.0], (st, raw)
        # gRPC: no new call is accepted while draining, control included.
        req = pb.RepositoryModelLoadRequest(model_name="id_fp32")
        refused = None
        for _ in range(50):
            try:
                stub.RepositoryModelLoad(req, timeout=10)
                refused = False
                break
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED:
                    continue  # reached the server as its shutdown began: try again
                refused = e.code() == grpc.StatusCode.UNAVAILABLE
                break
        assert refused, "a gRPC load was accepted during the drain"
        release.write_text("")
        t.join(30)
        assert result["reply"][0] == 200
        for c in conns.values():
            c.close()
        ch.close()
        assert s.proc.wait(timeout=30) == 0
        log = s.output()
        assert "successfully loaded 'id_fp32'" not in log
        assert "successfully unloaded 'id_batch'" not in log.split("Waiting for in-flight")[0]
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.log.close()


def test_no_poll_while_draining(tmp_path):
    """Triton's PollModelRepository does nothing unless the server is ready:
    in poll mode, a model added and one removed during the drain are left
    as they are (here for three countdown seconds, three poll periods)."""
    repo = identity_repo(str(tmp_path / "models"))
    s = Server(repo, ["--exit-timeout-secs=30", "--model-control-mode=poll",
                      "--repository-poll-secs=1"])
    release = tmp_path / "release"
    started = tmp_path / "started"
    try:
        busy = connect(s)
        result = {}

        def hold():
            result["reply"] = call(busy, "POST", "/v2/models/slow/infer", infer_body(
                1.0, {"wait_for_file": str(release), "started_file": str(started)}))

        t = threading.Thread(target=hold)
        t.start()
        wait_for(lambda: os.path.exists(started), "the long request to start")
        s.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "Timeout 30: " in s.output(), "the drain to begin")
        cfg = open(os.path.join(repo, "id_fp32", "config.pbtxt")).read()
        os.makedirs(os.path.join(repo, "id_new", "1"))
        with open(os.path.join(repo, "id_new", "config.pbtxt"), "w") as f:
            f.write(cfg.replace('name: "id_fp32"', 'name: "id_new"'))
        shutil.rmtree(os.path.join(repo, "id_batch"))
        wait_for(lambda: "Timeout 27: " in s.output(), "three seconds of countdown")
        release.write_text("")
        t.join(30)
        assert result["reply"][0] == 200
        busy.close()
        assert s.proc.wait(timeout=30) == 0
        log = s.output()
        assert "loading: id_new" not in log
        draining = log.split("Timeout 30: ")[1].split("Waiting for in-flight")[0]
        assert "unloaded 'id_batch'" not in draining
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.log.close()
