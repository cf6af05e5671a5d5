"""Stress and robustness over loopback: many concurrent HTTP and gRPC clients
mixing models (C, ONNX, dynamic batching, sequences, the example ensemble)
with malformed requests interleaved; explicit reload/unload/load while clients
hammer; clients that disconnect mid-request or cancel; SIGINT with requests in
flight; bodies at and over --http-max-input-size.

Every loop is bounded in count and in time (DEADLINE seconds), so each test
stays well under 20 s, also under ASan."""
import json
import os
import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES, Server
from grpc_util import infer_request, stubs
from http_helpers import read_head

pb, pbg, _, _ = stubs()

DEADLINE = 6.0  # seconds a load loop may run (it also stops after its count)

SCRATCH_MODELS = {
    # testing backend: copies INPUT0 to OUTPUT0 after sleeping execute_delay_ms
    "st_slow": """name: "st_slow"
backend: "testing"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "execute_delay_ms" value { string_value: "300" } }
""",
    "st_dyn": """name: "st_dyn"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
    "st_acc": """name: "st_acc"
backend: "accumulator"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
}
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
    "st_victim": """name: "st_victim"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
""",
}


def scratch_repo(tmp_path):
    repo = str(tmp_path / "stress_models")
    for name, cfg in SCRATCH_MODELS.items():
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(cfg)
    return repo


def have_onnx_models():
    return os.path.exists(os.path.join(EXAMPLES, "add_sub_onnx", "1", "model.onnx"))


needs_onnx = pytest.mark.skipif(not have_onnx_models(), reason="run `make models` first")


# ---- clients --------------------------------------------------------------


class Failures:
    """Thread-safe list of unexpected outcomes (the test asserts it is empty)."""

    def __init__(self):
        self.items, self.lock = [], threading.Lock()
        self.counts = {}

    def add(self, what):
        with self.lock:
            self.items.append(what)

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1


def http_infer(sess, s, model, inputs, params=None, timeout=30):
    body = {"inputs": [{"name": n, "datatype": dt, "shape": list(shape), "data": list(data)}
                       for n, dt, shape, data in inputs]}
    if params:
        body["parameters"] = params
    return sess.post(f"{s.http_url}/v2/models/{model}/infer", json=body, timeout=timeout)


def http_out(r, name):
    assert r.status_code == 200, (r.status_code, r.text)
    return next(o for o in r.json()["outputs"] if o["name"] == name)["data"]


def grpc_out(resp, name):
    i = [o.name for o in resp.outputs].index(name)
    dt = np.int32 if resp.outputs[i].datatype == "INT32" else np.float32
    return np.frombuffer(resp.raw_output_contents[i], dtype=dt).tolist()


def fp32_req(model, values, id=""):
    v = np.asarray(values, np.float32)
    return infer_request(pb, model, [("INPUT0", "FP32", [1, len(v)] if model != "st_slow"
                                      else [len(v)], v)], id=id)


def pair16(k):
    a = [float(k + i) for i in range(16)]
    b = [float((k * 7 + i) % 5) for i in range(16)]
    return a, b


def pair_req(model, a, b, id=""):
    return infer_request(pb, model, [("INPUT0", "FP32", [1, 16], np.asarray(a, np.float32)),
                                     ("INPUT1", "FP32", [1, 16], np.asarray(b, np.float32))],
                         id=id)


def with_grpc(s):
    """The fixture waits for the HTTP port; the gRPC frontend starts after it."""
    t_end = time.time() + 60
    while time.time() < t_end and s.proc.poll() is None:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", s.grpc_port)) == 0:
                return s
        time.sleep(0.02)
    raise RuntimeError(f"gRPC port not open:\n{s.output()}")


def healthy(s):
    assert s.proc.poll() is None, s.output()
    assert requests.get(s.http_url + "/v2/health/ready", timeout=10).status_code == 200
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        r = stub.ModelInfer(fp32_req("identity_fp32", [1, 2, 3]), timeout=10)
        assert grpc_out(r, "OUTPUT0") == [1, 2, 3]


# ---- (1) many concurrent clients, mixed models, malformed requests ----------


MALFORMED_HTTP = [
    # (body bytes, headers, expected status)
    (b"{not json", {}, 400),
    (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,3],"data":[1,2]}]}', {}, 400),
    (b'{"inputs":[{"name":"NOPE","datatype":"FP32","shape":[1,1],"data":[1]}]}', {}, 400),
    (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,4],'
     b'"parameters":{"binary_data_size":16}}]}', {"Inference-Header-Content-Length": "70"}, 400),
    (b"\x00\xff" * 10, {"Inference-Header-Content-Length": "5"}, 400),
    (b"", {}, 400),
    (b'{"inputs":[]}', {"Content-Encoding": "gzip"}, 400),
]


@needs_onnx
def test_concurrent_mixed_clients(nereid_server, tmp_path):
    s = with_grpc(nereid_server([EXAMPLES, scratch_repo(tmp_path)]))
    fails = Failures()
    t_end = time.time() + DEADLINE
    ITER = 30

    def http_worker(w):
        sess = requests.Session()
        seq = 1000 + w
        total = 0
        for k in range(ITER):
            # the last step ends the sequence (9 sequences share 8 slots: one waits)
            last = k == ITER - 1 or (time.time() > t_end and k >= 4)
            try:
                # a step of this worker's sequence (interleaved with every other model)
                v = w * 10 + k
                total += v
                r = http_infer(sess, s, "st_acc", [("INPUT", "INT32", [1, 1], [v])],
                               {"sequence_id": seq, "sequence_start": k == 0,
                                "sequence_end": last})
                if http_out(r, "OUTPUT") != [total]:
                    fails.add(("acc", w, k, r.text))
                x = [float(w), float(k), -1.5]
                r = http_infer(sess, s, "identity_fp32", [("INPUT0", "FP32", [1, 3], x)])
                if http_out(r, "OUTPUT0") != x:
                    fails.add(("identity", r.text))
                a, b = pair16(w * 100 + k)
                for model in ("add_sub", "add_sub_onnx"):
                    r = http_infer(sess, s, model, [("INPUT0", "FP32", [1, 16], a),
                                                    ("INPUT1", "FP32", [1, 16], b)])
                    if (http_out(r, "OUTPUT0") != [p + q for p, q in zip(a, b)]
                            or http_out(r, "OUTPUT1") != [p - q for p, q in zip(a, b)]):
                        fails.add((model, r.text))
                r = http_infer(sess, s, "ensemble_add_sub", [("INPUT0", "FP32", [1, 16], a),
                                                             ("INPUT1", "FP32", [1, 16], b)])
                if (http_out(r, "OUTPUT0") != [3 * p for p in a]
                        or http_out(r, "OUTPUT1") != [2 * q for q in b]):
                    fails.add(("ensemble", r.text))
                body, headers, status = MALFORMED_HTTP[(w + k) % len(MALFORMED_HTTP)]
                r = sess.post(f"{s.http_url}/v2/models/identity_fp32/infer", data=body,
                              headers=headers, timeout=30)
                if r.status_code < 400 or "error" not in r.json():
                    fails.add(("malformed accepted", body, r.status_code, r.text))
                fails.count("http")
            except Exception as e:  # noqa: BLE001 - every unexpected outcome is reported
                fails.add(("http exception", w, k, repr(e)))
            if last:
                break

    def grpc_worker(w):
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            seq = 2000 + w
            total = 0
            for k in range(ITER):
                last = k == ITER - 1 or (time.time() > t_end and k >= 4)
                try:
                    v = w * 10 + k
                    total += v
                    req = infer_request(pb, "st_acc", [("INPUT", "INT32", [1, 1],
                                                        np.array([v], np.int32))])
                    req.parameters["sequence_id"].int64_param = seq
                    req.parameters["sequence_start"].bool_param = k == 0
                    req.parameters["sequence_end"].bool_param = last
                    r = stub.ModelInfer(req, timeout=30)
                    if grpc_out(r, "OUTPUT") != [total]:
                        fails.add(("grpc acc", w, k, grpc_out(r, "OUTPUT"), total))
                    # dynamically batched model: several requests in flight at once
                    futs = [(j, stub.ModelInfer.future(fp32_req("st_dyn", [w, k, j], f"d{j}"),
                                                       timeout=30)) for j in range(4)]
                    for j, f in futs:
                        r = f.result()
                        if r.id != f"d{j}" or grpc_out(r, "OUTPUT0") != [w, k, j]:
                            fails.add(("grpc dyn", r))
                    a, b = pair16(w * 1000 + k)
                    r = stub.ModelInfer(pair_req("ensemble_add_sub", a, b), timeout=30)
                    if grpc_out(r, "OUTPUT0") != [3 * p for p in a] or \
                            grpc_out(r, "OUTPUT1") != [2 * q for q in b]:
                        fails.add(("grpc ensemble", r))
                    r = stub.ModelInfer(pair_req("add_sub_onnx", a, b), timeout=30)
                    if grpc_out(r, "OUTPUT0") != [p + q for p, q in zip(a, b)]:
                        fails.add(("grpc onnx", r))
                    # malformed: wrong datatype, wrong raw size, unknown model
                    bad = [infer_request(pb, "identity_fp32", [("INPUT0", "INT32", [1, 2],
                                                                np.array([1, 2], np.int32))]),
                           fp32_req("identity_fp32", [1, 2]), fp32_req("no_such_model", [1])]
                    bad[1].raw_input_contents[0] = b"\x00" * 5
                    for req in bad:
                        try:
                            stub.ModelInfer(req, timeout=30)
                            fails.add(("grpc malformed accepted", req))
                        except grpc.RpcError as e:
                            if e.code() not in (grpc.StatusCode.INVALID_ARGUMENT,
                                                grpc.StatusCode.NOT_FOUND):
                                fails.add(("grpc malformed", e.code(), e.details()))
                    # a stream with a good and a bad request
                    # (replies may come in any order: the bad one fails at once)
                    out = list(stub.ModelStreamInfer(iter([
                        fp32_req("identity_fp32", [k], "s0"), bad[0]]), timeout=30))
                    good = [o for o in out if not o.error_message]
                    if len(out) != 2 or len(good) != 1 or good[0].infer_response.id != "s0" \
                            or grpc_out(good[0].infer_response, "OUTPUT0") != [k]:
                        fails.add(("grpc stream", out))
                    fails.count("grpc")
                except Exception as e:  # noqa: BLE001
                    fails.add(("grpc exception", w, k, repr(e)))
                if last:
                    break

    threads = [threading.Thread(target=http_worker, args=(w,)) for w in range(5)]
    threads += [threading.Thread(target=grpc_worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "client thread hung"
    assert fails.items == [], fails.items[:5]
    h, g = fails.counts.get("http", 0), fails.counts.get("grpc", 0)
    assert h >= 5 * 4 and g >= 4 * 4
    # statistics add up exactly (an ensemble request counts on its composing models too)
    stats = requests.get(s.http_url + "/v2/models/stats", timeout=10).json()["model_stats"]
    success = {m["name"]: m["inference_stats"]["success"]["count"] for m in stats}
    assert success == {"identity_fp32": 2 * h + 2 * g, "add_sub": 3 * h + 2 * g,
                       "add_sub_onnx": 2 * h + 2 * g, "ensemble_add_sub": h + g,
                       "st_dyn": 4 * g, "st_acc": h + g, "st_slow": 0, "st_victim": 0,
                       "accumulator_direct": 0, "accumulator_oldest": 0,
                       "accumulator_onnx": 0, "repeat_int32": 0, "add_sub_python": 0}, (h, g)
    healthy(s)


def test_shape_whose_byte_size_overflows(tmp_path):
    s = with_grpc(Server([EXAMPLES, scratch_repo(tmp_path)], []))
    try:
        doc = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                      "shape": [1, 1 << 62],
                                      "parameters": {"binary_data_size": 0}}]}).encode()
        r = requests.post(f"{s.http_url}/v2/models/identity_fp32/infer", data=doc,
                          headers={"Inference-Header-Content-Length": str(len(doc))}, timeout=10)
        assert r.status_code == 400 and "Expected 0," not in r.json()["error"], r.text
        with grpc.insecure_channel(s.grpc_addr) as ch:
            req = fp32_req("identity_fp32", [1])
            del req.inputs[0].shape[:]
            req.inputs[0].shape.extend([1, 1 << 62])
            req.raw_input_contents[0] = b""
            with pytest.raises(grpc.RpcError) as e:
                pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "Expected 0," not in e.value.details()
        healthy(s)
    finally:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGINT)
            s.proc.wait(timeout=30)
        s.log.close()


# ---- (2) reload / unload / load while clients hammer -------------------------


# Triton's errors for a model that is being unloaded or is not loaded
VICTIM_ERRORS = (
    "Request for unknown model: 'st_victim' is not found",
    "Request for unknown model: 'st_victim' has no available versions",
    "Request for unknown model: 'st_victim' version 1 is not at ready state",
    "Request for unknown model: 'st_victim' version 1 is not found",
)

ADD_SUB_CONFIG = {
    "name": "add_sub", "backend": "add_sub", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [16]}],
}


@needs_onnx
def test_reload_unload_load_under_load(nereid_server, tmp_path):
    s = with_grpc(nereid_server([EXAMPLES, scratch_repo(tmp_path)],
                                "--model-control-mode=explicit", "--load-model=ensemble_add_sub",
                                "--load-model=st_victim", "--load-model=st_dyn"))
    fails = Failures()
    stop = threading.Event()

    def steady_http(w):
        sess = requests.Session()
        k = 0
        while not stop.is_set() and k < 400:
            k += 1
            a, b = pair16(w * 1000 + k)
            model = ("add_sub", "ensemble_add_sub", "identity_fp32")[k % 3]
            try:
                if model == "identity_fp32":
                    r = http_infer(sess, s, model, [("INPUT0", "FP32", [1, 2], a[:2])])
                    ok = http_out(r, "OUTPUT0") == a[:2]
                else:
                    r = http_infer(sess, s, model, [("INPUT0", "FP32", [1, 16], a),
                                                    ("INPUT1", "FP32", [1, 16], b)])
                    ok = http_out(r, "OUTPUT0") == ([p + q for p, q in zip(a, b)]
                                                    if model == "add_sub" else [3 * p for p in a])
                if not ok:
                    fails.add(("steady wrong", model, r.text))
                fails.count("steady")
            except Exception as e:  # noqa: BLE001
                fails.add(("steady", model, repr(e)))

    def steady_grpc(w):
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            k = 0
            while not stop.is_set() and k < 400:
                k += 1
                try:
                    r = stub.ModelInfer(fp32_req("st_dyn", [w, k]), timeout=30)
                    if grpc_out(r, "OUTPUT0") != [w, k]:
                        fails.add(("steady grpc wrong", r))
                    fails.count("steady")
                except Exception as e:  # noqa: BLE001
                    fails.add(("steady grpc", repr(e)))

    def victim_http(w):
        sess = requests.Session()
        k = 0
        while not stop.is_set() and k < 400:
            k += 1
            try:
                r = http_infer(sess, s, "st_victim", [("INPUT0", "FP32", [1, 2], [w, k])])
                if r.status_code == 200:
                    if http_out(r, "OUTPUT0") != [w, k]:
                        fails.add(("victim wrong", r.text))
                    fails.count("victim ok")
                elif r.status_code in (400, 404, 503) and r.json().get("error") in VICTIM_ERRORS:
                    fails.count("victim refused")
                else:
                    fails.add(("victim", r.status_code, r.text))
            except Exception as e:  # noqa: BLE001
                fails.add(("victim", repr(e)))

    def victim_grpc(w):
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            k = 0
            while not stop.is_set() and k < 400:
                k += 1
                try:
                    r = stub.ModelInfer(fp32_req("st_victim", [w, k]), timeout=30)
                    if grpc_out(r, "OUTPUT0") != [w, k]:
                        fails.add(("victim grpc wrong", r))
                    fails.count("victim ok")
                except grpc.RpcError as e:
                    if e.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE) \
                            and e.details() in VICTIM_ERRORS:
                        fails.count("victim refused")
                    else:
                        fails.add(("victim grpc", e.code(), e.details()))

    def readers(w):
        """Metadata, config, statistics, index and metrics read while models change."""
        sess = requests.Session()
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            k = 0
            while not stop.is_set() and k < 200:
                k += 1
                try:
                    for path, ok in (("/v2/models/st_victim", (200, 404)),
                                     ("/v2/models/st_victim/config", (200, 404)),
                                     ("/v2/models/st_victim/ready", (200, 400)),
                                     ("/v2/models/st_victim/stats", (200, 400)),
                                     ("/v2/models/stats", (200,)),
                                     ("/v2/models/add_sub/config", (200,))):
                        r = sess.get(s.http_url + path, timeout=30)
                        if r.status_code not in ok:
                            fails.add(("reader", path, r.status_code, r.text))
                    for r in (sess.post(s.http_url + "/v2/repository/index", timeout=30),
                              sess.get(s.metrics_url + "/metrics", timeout=30)):
                        if r.status_code != 200:
                            fails.add(("reader", r.url, r.status_code, r.text))
                    stub.ModelStatistics(pb.ModelStatisticsRequest(name=""), timeout=30)
                    stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=30)
                    try:
                        stub.ModelMetadata(pb.ModelMetadataRequest(name="st_victim"), timeout=30)
                    except grpc.RpcError as e:
                        if e.code() not in (grpc.StatusCode.NOT_FOUND,
                                            grpc.StatusCode.UNAVAILABLE):
                            fails.add(("reader grpc", e.code(), e.details()))
                except Exception as e:  # noqa: BLE001
                    fails.add(("reader", repr(e)))

    threads = [threading.Thread(target=f, args=(w,)) for w, f in enumerate(
        [steady_http, steady_http, steady_grpc, victim_http, victim_grpc, readers])]
    for t in threads:
        t.start()
    admin = requests.Session()
    cycles = 0
    try:
        t_end = time.time() + DEADLINE
        while cycles < 60 and time.time() < t_end:
            cycles += 1
            # a real reload of a model the ensemble uses: it stays loaded throughout
            cfg = dict(ADD_SUB_CONFIG, instance_group=[{"count": 1 + cycles % 2,
                                                        "kind": "KIND_CPU"}])
            r = admin.post(f"{s.http_url}/v2/repository/models/add_sub/load",
                           json={"parameters": {"config": json.dumps(cfg)}}, timeout=30)
            assert r.status_code == 200, r.text
            r = admin.post(f"{s.http_url}/v2/repository/models/st_victim/unload", timeout=30)
            assert r.status_code == 200, r.text
            r = admin.post(f"{s.http_url}/v2/repository/models/st_victim/load", timeout=30)
            assert r.status_code == 200, r.text
            r = admin.post(f"{s.http_url}/v2/repository/models/st_victim/load", timeout=30)
            assert r.status_code == 200, r.text  # unchanged reload
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "client thread hung"
    assert cycles >= 2
    assert fails.items == [], fails.items[:5]
    assert fails.counts.get("steady", 0) >= 10 and fails.counts.get("victim ok", 0) >= 1
    healthy(s)


def test_poll_mode_changes_under_load(nereid_server, tmp_path):
    """Poll mode: a served model's config changes twice and another model gets
    a new version while clients hammer both: no request fails."""
    repo = scratch_repo(tmp_path)
    s = with_grpc(nereid_server(repo, "--model-control-mode=poll", "--repository-poll-secs=1"))
    fails = Failures()
    stop = threading.Event()

    def client(w, model):
        sess = requests.Session()
        k = 0
        while not stop.is_set() and k < 3000:
            k += 1
            try:
                r = http_infer(sess, s, model, [("INPUT0", "FP32", [1, 2], [w, k])])
                if http_out(r, "OUTPUT0") != [w, k]:
                    fails.add((model, r.text))
                fails.count(model)
                fails.count(r.json()["model_version"])
            except Exception as e:  # noqa: BLE001
                fails.add((model, repr(e)))

    def wait_until(cond):
        t_end = time.time() + 10
        while time.time() < t_end:
            if cond():
                return True
            time.sleep(0.1)
        return False

    def index():
        return requests.post(s.http_url + "/v2/repository/index", timeout=10).json()

    def write_config(name, text):
        path = os.path.join(repo, name, "config.pbtxt")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.rename(path + ".tmp", path)

    threads = [threading.Thread(target=client, args=(w, m)) for w, m in
               enumerate(["st_victim", "st_victim", "st_dyn"])]
    for t in threads:
        t.start()
    try:
        for count in (1, 3):
            write_config("st_victim", SCRATCH_MODELS["st_victim"].replace(
                "count: 2", f"count: {count}"))
            assert wait_until(lambda: requests.get(
                s.http_url + "/v2/models/st_victim/config", timeout=10).json()
                ["instance_group"][0]["count"] == count)
        os.makedirs(os.path.join(repo, "st_dyn", "2"))
        assert wait_until(lambda: any(r["name"] == "st_dyn" and r.get("version") == "2"
                                      and r.get("state") == "READY" for r in index()))
        t_end = time.time() + 10
        while fails.counts.get("2", 0) < 5 and time.time() < t_end:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
    assert fails.items == [], fails.items[:5]
    assert fails.counts.get("2", 0) >= 5  # st_dyn version 2 served after the poll
    assert requests.get(s.http_url + "/v2/health/ready", timeout=10).status_code == 200


# ---- (3) clients that go away mid-request ------------------------------------


def raw_http(port, request_bytes):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request_bytes)
    return sock


def infer_head(model, length, extra=""):
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n").encode()


def slow_body(v=7.0):
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [v]}]}).encode()


def test_client_disconnects(nereid_server, tmp_path):
    s = with_grpc(nereid_server([EXAMPLES, scratch_repo(tmp_path)]))
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                                   "data": [1.0] * 64}]}).encode()

    # HTTP: half a body, then close (JSON and binary framing)
    def half_bodies(i):
        for j in range(10):
            extra = "" if j % 2 else f"Inference-Header-Content-Length: {len(body)}\r\n"
            sock = raw_http(s.http_port, infer_head("identity_fp32", len(body), extra)
                            + body[:len(body) // 2 + i])
            sock.close()

    # HTTP: a full request to the slow model, closed before the reply
    def closed_before_reply(i):
        for j in range(3):
            b = slow_body(i)
            sock = raw_http(s.http_port, infer_head("st_slow", len(b)) + b)
            if j == 1:
                sock.shutdown(socket.SHUT_WR)
            sock.close()

    threads = [threading.Thread(target=half_bodies, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=closed_before_reply, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()

    # gRPC: cancel unary calls and streams mid-flight
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        futs = [stub.ModelInfer.future(fp32_req("st_slow", [i]), timeout=30) for i in range(8)]
        hold = threading.Event()

        def stream_reqs(i):
            yield fp32_req("identity_fp32", [i], "first")
            yield fp32_req("st_slow", [i], "slow")
            hold.wait(10)

        streams = [stub.ModelStreamInfer(stream_reqs(i), timeout=30) for i in range(4)]
        for st in streams[:2]:
            first = next(st)  # a reply arrived; the slow one is still executing
            assert first.infer_response.id == "first"
        time.sleep(0.05)
        for f in futs:
            f.cancel()
        for st in streams:
            st.cancel()
        hold.set()
        for f in futs:
            assert f.cancelled() or f.exception(timeout=30) is not None or \
                grpc_out(f.result(), "OUTPUT0") is not None
        for st in streams:
            with pytest.raises(grpc.RpcError) as e:
                list(st)
            assert e.value.code() == grpc.StatusCode.CANCELLED
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()

    # The server still serves every path; the slow model drains its abandoned work.
    sess = requests.Session()
    r = sess.post(f"{s.http_url}/v2/models/st_slow/infer", data=slow_body(3.0), timeout=30)
    assert http_out(r, "OUTPUT0") == [3.0]
    healthy(s)
    # Whatever was submitted before its client left either ran to completion or,
    # still queued, was cancelled without executing (Triton's request
    # cancellation): no request failed for another reason, and every execution
    # is counted once.
    t_end = time.time() + 15  # (abandoned requests may still be executing)
    while True:
        st = sess.get(f"{s.http_url}/v2/models/st_slow/stats",
                      timeout=10).json()["model_stats"][0]
        if st["inference_stats"]["success"]["count"] == st["inference_count"] or \
                time.time() > t_end:
            break
        time.sleep(0.1)
    assert st["inference_stats"]["success"]["count"] == st["inference_count"] >= 1
    # The queue has drained, so every abandoned request has completed.
    metrics = sess.get(s.metrics_url + "/metrics", timeout=10).text
    st = sess.get(f"{s.http_url}/v2/models/st_slow/stats", timeout=10).json()["model_stats"][0]
    key = 'nv_inference_request_failure{model="st_slow",reason="CANCELED",version="1"} '
    canceled = int(float(metrics.split(key)[1].split()[0])) if key in metrics else 0
    assert st["inference_stats"]["fail"]["count"] == canceled


KILLED_CLIENT = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[3])
import grpc, requests
import test_stress as T
http_url, grpc_addr = sys.argv[1], sys.argv[2]
stub = T.pbg.GRPCInferenceServiceStub(grpc.insecure_channel(grpc_addr))
hold = threading.Event()

def gen(i):
    yield T.fp32_req("st_dyn", [i], "d")
    yield T.fp32_req("st_slow", [i], "s")
    hold.wait()

streams = [stub.ModelStreamInfer(gen(i), timeout=60) for i in range(3)]
futs = [stub.ModelInfer.future(T.fp32_req("st_slow", [i]), timeout=60) for i in range(2)]

def post(i):
    try:
        requests.post(http_url + "/v2/models/st_slow/infer", data=T.slow_body(i), timeout=60)
    except Exception:
        pass

for i in range(2):
    threading.Thread(target=post, args=(i,), daemon=True).start()
for st in streams:
    next(st)  # the stream is established and its first reply came back
print("READY", flush=True)
time.sleep(60)
"""


def test_client_process_killed_mid_request(nereid_server, tmp_path):
    """A client process killed (SIGKILL: sockets reset) with gRPC streams,
    unary calls and HTTP requests in flight."""
    import subprocess
    import sys
    s = with_grpc(nereid_server([EXAMPLES, scratch_repo(tmp_path)]))
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(2):
        p = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, s.http_url, s.grpc_addr, here],
                             stdout=subprocess.PIPE)
        try:
            assert p.stdout.readline() == b"READY\n"
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
    healthy(s)
    r = requests.post(f"{s.http_url}/v2/models/st_slow/infer", data=slow_body(5.0), timeout=30)
    assert http_out(r, "OUTPUT0") == [5.0]


# ---- (4) SIGINT with requests in flight --------------------------------------


def sigint_with_requests_in_flight(tmp_path, n_http, n_grpc):
    """n_http + n_grpc client threads loop on the slow and the batched model;
    SIGINT arrives while requests run and more are queued. The server must
    exit 0 promptly and every client gets a result or a connection error."""
    s = with_grpc(Server([EXAMPLES, scratch_repo(tmp_path)], []))
    outcomes, lock = [], threading.Lock()
    started = threading.Barrier(n_http + n_grpc + 1)

    def record(kind, what):
        with lock:
            outcomes.append((kind, what))

    def http_client(i):
        sess = requests.Session()
        started.wait(10)
        model, x = ("st_slow", [float(i)]) if i % 2 else ("st_dyn", [float(i)] * 3)
        for _ in range(20):
            try:
                r = http_infer(sess, s, model, [("INPUT0", "FP32",
                                                 [1] if model == "st_slow" else [1, 3], x)],
                               timeout=30)
            except requests.ConnectionError:
                record("http", "connection error")
                return
            except requests.Timeout:
                record("http", "HANG")
                return
            if r.status_code == 200:
                record("http", "ok" if http_out(r, "OUTPUT0") == x else f"WRONG {r.text}")
            elif r.status_code == 503 and r.json().get("error") == "Server not ready":
                record("http", "refused")
                return
            else:
                record("http", f"UNEXPECTED {r.status_code} {r.text}")
                return

    def grpc_client(i):
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            started.wait(10)
            for _ in range(20):
                x = [float(i), 2.0]
                try:
                    r = stub.ModelInfer(fp32_req("st_slow" if i % 2 else "st_dyn", x),
                                        timeout=30)
                    record("grpc", "ok" if grpc_out(r, "OUTPUT0") == x else "WRONG")
                except grpc.RpcError as e:
                    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        record("grpc", "HANG")
                    elif e.code() == grpc.StatusCode.UNAVAILABLE:
                        record("grpc", "unavailable")
                    elif e.code() == grpc.StatusCode.CANCELLED:
                        # gRPC core cancels a call that reaches the server after
                        # its shutdown began but before it was matched: refused.
                        record("grpc", "unavailable")
                    else:
                        record("grpc", f"UNEXPECTED {e.code()} {e.details()}")
                    return

    threads = [threading.Thread(target=http_client, args=(i,)) for i in range(n_http)]
    threads += [threading.Thread(target=grpc_client, args=(i,)) for i in range(n_grpc)]
    try:
        for t in threads:
            t.start()
        started.wait(10)
        time.sleep(0.4)  # slow executions (300 ms) are running and more are queued
        t0 = time.time()
        s.proc.send_signal(signal.SIGINT)
        rc = s.proc.wait(timeout=30)
        took = time.time() - t0
        for t in threads:
            t.join(timeout=40)
        assert not any(t.is_alive() for t in threads), "a client hung after the server exited"
        assert rc == 0, f"exit status {rc}:\n{s.output()[-3000:]}"
        assert took < 15, f"shutdown took {took:.1f} s"
        bad = [o for o in outcomes if o[1] not in ("ok", "connection error", "refused",
                                                   "unavailable")]
        assert bad == [], bad
        assert any(o[1] == "ok" for o in outcomes)
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.log.close()


def test_sigint_with_grpc_requests_in_flight(tmp_path):
    sigint_with_requests_in_flight(tmp_path, 0, 8)


def test_sigint_with_http_requests_in_flight(tmp_path):
    for _ in range(3):  # the race is narrow: three shutdowns make it show more often
        sigint_with_requests_in_flight(tmp_path / str(_), 6, 2)


def test_sigint_with_sequence_backlog_exits_promptly(tmp_path):
    """A request waiting for a sequence slot that no client will free (new
    requests are refused once stopping) is failed after --exit-timeout-secs
    instead of holding shutdown for the sequences' idle timeout."""
    repo = scratch_repo(tmp_path)
    with open(os.path.join(repo, "st_acc", "config.pbtxt"), "w") as f:
        f.write(SCRATCH_MODELS["st_acc"].replace("60000000", "30000000"))
    s = with_grpc(Server(repo, ["--exit-timeout-secs=1"]))
    try:
        sess = requests.Session()
        for q in range(8):  # every slot (2 instances x 4) holds an open sequence
            r = http_infer(sess, s, "st_acc", [("INPUT", "INT32", [1, 1], [q])],
                           {"sequence_id": 100 + q, "sequence_start": True})
            assert http_out(r, "OUTPUT") == [q]
        outcome = []

        def backlogged():
            try:
                r = http_infer(requests.Session(), s, "st_acc",
                               [("INPUT", "INT32", [1, 1], [1])],
                               {"sequence_id": 200, "sequence_start": True}, timeout=30)
                outcome.append(r.status_code)
            except requests.ConnectionError:
                outcome.append("connection error")

        t = threading.Thread(target=backlogged)
        t.start()
        t_end = time.time() + 10  # wait until the request is queued in the backlog
        while time.time() < t_end and 'nv_inference_pending_request_count{model="st_acc",' \
                'version="1"} 1' not in requests.get(s.metrics_url + "/metrics", timeout=10).text:
            time.sleep(0.05)
        t0 = time.time()
        s.proc.send_signal(signal.SIGINT)
        rc = s.proc.wait(timeout=30)
        took = time.time() - t0
        t.join(timeout=30)
        assert rc == 0
        assert outcome and outcome[0] in (200, 503, "connection error")
        assert took < 8, f"exit took {took:.1f} s"
        assert "Exit timeout (1 s) expired" in s.output()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.log.close()


# ---- (5) bodies at and over --http-max-input-size ----------------------------

MAX = 1 << 20


def exact_size_body(n_values, total):
    """A binary-framed identity_fp32 request of exactly `total` bytes (the JSON
    header is padded with spaces)."""
    raw = np.arange(n_values, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                     "shape": [1, n_values],
                                     "parameters": {"binary_data_size": len(raw)}}],
                         "outputs": [{"name": "OUTPUT0",
                                      "parameters": {"binary_data": True}}]}).encode()
    pad = total - len(header) - len(raw)
    assert pad >= 0
    header += b" " * pad
    return header + raw, {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"}


def test_bodies_near_and_over_max_input_size(nereid_server, tmp_path):
    s = with_grpc(nereid_server([EXAMPLES, scratch_repo(tmp_path)],
                                f"--http-max-input-size={MAX}"))
    url = f"{s.http_url}/v2/models/identity_fp32/infer"
    n = (MAX - 512) // 4
    fails = Failures()

    def at_limit(i):
        sess = requests.Session()
        for j in range(3):
            body, headers = exact_size_body(n - i, MAX)
            assert len(body) == MAX
            r = sess.post(url, data=body, headers=headers, timeout=60)
            if r.status_code != 200:
                fails.add(("at limit", r.status_code, r.text[:200]))
                continue
            ihcl = int(r.headers["Inference-Header-Content-Length"])
            out = np.frombuffer(r.content[ihcl:], dtype=np.float32)
            if not np.array_equal(out, np.arange(n - i, dtype=np.float32)):
                fails.add(("at limit wrong output", i, j))

    def over_limit(i):
        # the limit bounds the JSON header (binary data after it is not
        # bounded by it, as in Triton): a header over it is refused
        sess = requests.Session()
        for j in range(3):
            body, headers = exact_size_body(16, MAX + 1 + i * 1000 + 64)
            r = sess.post(url, data=body, headers=headers, timeout=60)
            if r.status_code != 400 or "--http-max-input-size" not in r.json()["error"]:
                fails.add(("over limit", r.status_code, r.text[:200]))

    threads = [threading.Thread(target=f, args=(i,)) for i in range(3)
               for f in (at_limit, over_limit)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    assert fails.items == [], fails.items[:3]

    # binary data over the limit after a small JSON header is served (Triton)
    body, headers = exact_size_body(MAX // 2, MAX * 2 + 512)  # 2 MiB of data
    r = requests.post(url, data=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text[:200]
    ihcl = int(r.headers["Inference-Header-Content-Length"])
    assert np.array_equal(np.frombuffer(r.content[ihcl:], dtype=np.float32),
                          np.arange(MAX // 2, dtype=np.float32))

    # a JSON (non-binary) body just under the limit is parsed and answered exactly
    vals = list(range(MAX // 9))
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, len(vals)],
                       "data": vals}]}
    body = json.dumps(doc).encode()
    body += b" " * (MAX - len(body))  # exactly at the limit
    assert len(body) == MAX
    r = requests.post(url, data=body, timeout=60)
    assert r.status_code == 200, r.text[:200]
    assert r.json()["outputs"][0]["data"] == vals

    # JSON over the limit, chunked (no Content-Length) over the limit
    big = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                  "shape": [1, MAX // 4], "data": [0.5] * (MAX // 4)}]}).encode()
    r = requests.post(url, data=big, timeout=60)
    assert r.status_code == 400 and "--http-max-input-size" in r.json()["error"], r.text[:200]
    r = requests.post(url, data=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                      timeout=60)
    assert r.status_code == 400 and "--http-max-input-size" in r.json()["error"], r.text[:200]

    # a huge declared Content-Length is refused at once, unread
    sock = raw_http(s.http_port, infer_head("identity_fp32", 1 << 40) + b'{"inputs":')
    sock.settimeout(20)
    reply = read_head(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]

    # gRPC has no such limit: 8 MiB round trip
    with grpc.insecure_channel(s.grpc_addr, options=[
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1)]) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        x = np.arange(2 << 20, dtype=np.float32)
        r = stub.ModelInfer(infer_request(pb, "identity_fp32",
                                          [("INPUT0", "FP32", [1, x.size], x)]), timeout=60)
        assert np.array_equal(np.frombuffer(r.raw_output_contents[0], np.float32), x)
    healthy(s)
