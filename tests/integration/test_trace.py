"""Triton's tracing through the real binary: --trace-config, the trace
settings API (HTTP /v2[/models/<m>]/trace/setting and gRPC TraceSetting) with
Triton's fallback, clearing and error texts, the JSON trace file (timestamps
of HTTP and gRPC requests, rate, count, log_frequency, ensemble children with
parent_id), and opentelemetry mode: OTLP/HTTP protobuf export to a collector
run here on loopback, with W3C traceparent propagation."""
import http.server
import importlib
import json
import os
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import stubs

pb, pbg, _, _ = stubs()
otlp = importlib.import_module("otlp_trace_pb2")

DEFAULTS = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}

HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
              "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
              "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
CORE_ORDER = HTTP_ORDER[2:9]
GRPC_ORDER = CORE_ORDER + ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
                           "GRPC_SEND_START", "GRPC_SEND_END"]


def infer_body(request_id=None):
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [1] * 16}]}
    if request_id:
        body["id"] = request_id
    return body


def infer(s, model="add_sub", headers=None, request_id=None):
    r = requests.post(f"{s.http_url}/v2/models/{model}/infer", json=infer_body(request_id),
                      headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text


def grpc_infer(s, model="add_sub", metadata=None):
    req = pb.ModelInferRequest(model_name=model)
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(np.arange(16, dtype=np.float32).tolist())
    with grpc.insecure_channel(s.grpc_addr) as ch:
        pbg.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=metadata or ())


def post(s, path, body, **kw):
    return requests.post(s.http_url + path, json=body, timeout=10, **kw)


def get(s, path):
    r = requests.get(s.http_url + path, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def read_traces(path):
    """{id: {"header": {...}, "names": [...], "ns": [...]}} from a trace file."""
    with open(path) as f:
        entries = json.load(f)
    traces = {}
    for e in entries:
        t = traces.setdefault(e["id"], {"header": None, "names": [], "ns": []})
        if "model_name" in e:
            assert t["header"] is None
            t["header"] = e
        else:
            (ts,) = e["timestamps"]
            t["names"].append(ts["name"])
            t["ns"].append(ts["ns"])
    return traces


# ---- Command line ----

@pytest.mark.parametrize("args,text", [
    (["--trace-config", "rate=abc"],
     'Bad option: "--trace-config rate".\nInvalid option value. Got abc'),
    (["--trace-config", "level=bogus"],
     'Bad option: "--trace-config level".\ninvalid value for trace level option: bogus'),
    (["--trace-config", ",rate=1"], "No trace mode specified. --trace-config option format is "
     "<trace mode>,<setting>=<value> or <setting>=<value>. Got ,rate=1"),
    (["--trace-config", "Zipkin,url=x"], 'invalid value for trace mode option: zipkin. '
     'Available options are "triton" and "opentelemetry"'),
    (["--trace-config", "triton,file"],
     "--trace-config option format is '<trace mode>,<setting>=<value>'. Got triton,file"),
    (["--trace-config", "triton,log-frequency=x"],
     'Bad option: "--trace-config triton,log-frequency".\nInvalid option value. Got x'),
    (["--trace-config", "mode=opentelemetry", "--trace-config",
      "opentelemetry,bsp_schedule_delay=soon"],
     'Bad option: "--trace-config opentelemetry,bsp_schedule_delay".\n'
     'Invalid option value. Got soon'),
    (["--trace-rate", "x"], 'Bad option: "--trace-rate".\nInvalid option value. Got x'),
])
def test_cli_errors(args, text):
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}"] + args, capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2, p.stderr
    assert text in p.stderr


# ---- Settings API ----

def test_defaults_and_extension(nereid_server):
    s = nereid_server(EXAMPLES)
    assert "trace" in get(s, "/v2")["extensions"]
    assert get(s, "/v2/trace/setting") == DEFAULTS
    assert list(get(s, "/v2/trace/setting")) == list(DEFAULTS)  # Triton's key order
    assert get(s, "/v2/models/add_sub/trace/setting") == DEFAULTS
    # Level on without a file: Triton refuses the setting.
    r = post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]})
    assert r.status_code == 400
    assert r.json()["error"] == ("Attempting to set invalid trace setting :trace file name is "
                                 "not given")
    r = requests.get(s.http_url + "/v2/models/nope/trace/setting", timeout=10)
    assert r.status_code == 400 and r.json()["error"] == "Request for unknown model : nope"


def test_http_settings_round_trip_and_fallback(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}")
    glob = dict(DEFAULTS, trace_file=f)
    assert get(s, "/v2/trace/setting") == glob
    # A model setting starts from the global one; unset values follow it.
    r = post(s, "/v2/models/add_sub/trace/setting", {"trace_rate": "5"})
    assert r.status_code == 200, r.text
    assert r.json() == dict(glob, trace_rate="5")
    r = post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_count": "10"})
    assert r.status_code == 200, r.text
    glob = dict(glob, trace_level=["TIMESTAMPS"], trace_count="10")
    assert r.json() == glob
    assert get(s, "/v2/models/add_sub/trace/setting") == dict(glob, trace_rate="5")
    assert get(s, "/v2/models/identity_fp32/trace/setting") == glob
    # null clears: the model's rate falls back to the global one, and with
    # nothing of its own left the model follows the global setting.
    r = post(s, "/v2/models/add_sub/trace/setting", {"trace_rate": None})
    assert r.status_code == 200 and r.json() == glob
    r = post(s, "/v2/trace/setting", {"log_frequency": "3"})
    assert r.json() == dict(glob, log_frequency="3")
    assert get(s, "/v2/models/add_sub/trace/setting") == dict(glob, log_frequency="3")
    # Clearing a global value returns to the command line's.
    r = post(s, "/v2/trace/setting", {"trace_level": None, "log_frequency": None,
                                      "trace_count": None})
    assert r.json() == dict(DEFAULTS, trace_file=f)
    # An empty body changes nothing.
    r = requests.post(s.http_url + "/v2/trace/setting", data=b"", timeout=10)
    assert r.status_code == 200 and r.json() == dict(DEFAULTS, trace_file=f)
    # Level list: TIMESTAMPS and TENSORS together, unknown names ignored.
    r = post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS", "TENSORS", "BOGUS"]})
    assert r.json()["trace_level"] == ["TIMESTAMPS", "TENSORS"]


@pytest.mark.parametrize("body,status,text", [
    ({"trace_file": "/tmp/x"}, 501,
     "trace file location can not be updated through network protocol"),
    ({"trace_file": None}, 501,
     "trace file location can not be updated through network protocol"),
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    ({"trace_rate": "99999999999"}, 400, "Unable to parse 'trace_rate', value is out of range "
     "[ 0, 4294967295 ], got: 99999999999"),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"trace_count": "x"}, 400, "Unable to parse 'trace_count', got: x"),
    ({"log_frequency": "many"}, 400, "Unable to parse 'log_frequency', got: many"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400,
     "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": "TIMESTAMPS"}, 500, "attempt to access JSON non-array as array"),
    ({"trace_level": [1]}, 500, "attempt to access JSON non-string as string"),
    ({"trace_rate": 5}, 500, "attempt to access JSON non-string as string"),
    ({"trace_level": ["TIMESTAMPS"], "trace_rate": "0"}, 400,
     "Attempting to set invalid trace setting :sample rate must be non-zero"),
])
def test_http_setting_errors(nereid_server, tmp_path, body, status, text):
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={tmp_path / 't.json'}")
    for path in ("/v2/trace/setting", "/v2/models/add_sub/trace/setting"):
        r = post(s, path, body)
        assert r.status_code == status, r.text
        assert r.json()["error"] == text
    r = post(s, "/v2/models/nope/trace/setting", {"trace_rate": "1"})
    assert r.status_code == 400 and r.json()["error"] == "Request for unknown model : nope"


def _grpc_settings(stub, model="", **values):
    req = pb.TraceSettingRequest(model_name=model)
    for k, v in values.items():
        req.settings[k].value.extend(v)
    r = stub.TraceSetting(req)
    return {k: list(v.value) for k, v in r.settings.items()}


def test_grpc_trace_setting(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-config",
                      "level=TIMESTAMPS")
    want = {k: v if isinstance(v, list) else [v] for k, v in DEFAULTS.items()}
    want.update(trace_file=[f], trace_level=["TIMESTAMPS"])
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert _grpc_settings(stub) == want
        got = _grpc_settings(stub, "add_sub", trace_rate=["7"], trace_count=["3"])
        assert got == dict(want, trace_rate=["7"], trace_count=["3"])
        # Shared with HTTP.
        assert get(s, "/v2/models/add_sub/trace/setting")["trace_rate"] == "7"
        # An empty value clears it.
        assert _grpc_settings(stub, "add_sub", trace_rate=[]) == dict(want, trace_count=["3"])
        got = _grpc_settings(stub, "add_sub", trace_level=["OFF"])
        assert got == dict(want, trace_count=["3"], trace_level=["OFF"])
        cases = [({"trace_rate": ["1", "2"]}, grpc.StatusCode.INVALID_ARGUMENT,
                  "expect only 1 value for 'trace_rate'"),
                 ({"trace_count": ["-5"]}, grpc.StatusCode.INVALID_ARGUMENT,
                  "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"),
                 ({"log_frequency": ["x"]}, grpc.StatusCode.INVALID_ARGUMENT,
                  "Unable to parse 'log_frequency', got: x"),
                 ({"trace_file": ["/tmp/y"]}, grpc.StatusCode.UNIMPLEMENTED,
                  "trace file location can not be updated through network protocol")]
        for values, code, text in cases:
            with pytest.raises(grpc.RpcError) as e:
                _grpc_settings(stub, **values)
            assert e.value.code() == code and e.value.details() == text
        with pytest.raises(grpc.RpcError) as e:
            _grpc_settings(stub, "nope")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "Request for unknown model : nope"


# ---- Trace files ----

def test_http_and_grpc_trace_file(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-config",
                      "level=TIMESTAMPS", "--trace-config", "rate=1")
    infer(s, request_id="req-\"7\"")
    grpc_infer(s)
    assert not os.path.exists(f)  # log_frequency 0: written at shutdown
    assert s.stop() == 0
    traces = read_traces(f)
    assert sorted(traces) == [1, 2]
    h, g = traces[1], traces[2]
    assert h["header"] == {"id": 1, "model_name": "add_sub", "model_version": 1,
                           "request_id": "req-\"7\""}
    assert h["names"] == HTTP_ORDER
    assert h["ns"] == sorted(h["ns"])
    assert g["header"] == {"id": 2, "model_name": "add_sub", "model_version": 1}
    assert g["names"] == GRPC_ORDER
    ns = dict(zip(g["names"], g["ns"]))
    assert g["ns"][:7] == sorted(g["ns"][:7])
    assert ns["GRPC_WAITREAD_START"] <= ns["GRPC_WAITREAD_END"] <= ns["REQUEST_START"]
    assert ns["REQUEST_END"] <= ns["INFER_RESPONSE_COMPLETE"] <= ns["GRPC_SEND_START"] \
        <= ns["GRPC_SEND_END"]


def test_grpc_traced_after_turning_on(nereid_server, tmp_path):
    # Calls posted while tracing was off are traced once it is on.
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}")
    grpc_infer(s)
    r = post(s, "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert r.status_code == 200, r.text
    grpc_infer(s)
    assert s.stop() == 0
    traces = read_traces(f)
    assert len(traces) == 1
    (t,) = traces.values()
    assert t["names"] == GRPC_ORDER


def test_rate_and_count(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-config",
                      "level=TIMESTAMPS", "--trace-config", "rate=2", "--trace-config", "count=2")
    for _ in range(7):
        infer(s)
    assert get(s, "/v2/trace/setting")["trace_count"] == "0"
    assert s.stop() == 0
    traces = read_traces(f)
    assert sorted(traces) == [1, 2]  # the 2nd and 4th request, then count ran out
    assert all(t["header"]["model_name"] == "add_sub" for t in traces.values())


def test_log_frequency_files(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-config",
                      "triton,log-frequency=2", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1")
    for _ in range(5):
        infer(s)
    # Each file holds its traces once written (the file is written when the
    # second trace of it is released, before its reply's send ends).
    deadline = time.time() + 30
    while not os.path.exists(f + ".1") and time.time() < deadline:
        time.sleep(0.05)
    # A trace is released as its reply is sent, so two back-to-back requests
    # may be released in either order: each file holds two traces, whichever.
    first, second = read_traces(f + ".0"), read_traces(f + ".1")
    assert len(first) == 2 and len(second) == 2, (sorted(first), sorted(second))
    assert s.stop() == 0
    rest = read_traces(f + ".2")  # the rest, at shutdown
    assert len(rest) == 1
    assert sorted([*first, *second, *rest]) == [1, 2, 3, 4, 5]
    assert not os.path.exists(f)


def test_model_setting_traces_only_that_model(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}")
    infer(s)  # tracing off
    r = post(s, "/v2/models/identity_fp32/trace/setting",
             {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    assert r.status_code == 200, r.text
    infer(s)  # no setting of its own: the global one (off)
    r = requests.post(f"{s.http_url}/v2/models/identity_fp32/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]}, timeout=30)
    assert r.status_code == 200, r.text
    assert s.stop() == 0
    traces = read_traces(f)
    assert len(traces) == 1
    (t,) = traces.values()
    assert t["header"]["model_name"] == "identity_fp32" and t["names"] == HTTP_ORDER


def test_ensemble_children(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-config",
                      "level=TIMESTAMPS", "--trace-config", "rate=1")
    infer(s, "ensemble_add_sub")
    assert s.stop() == 0
    traces = read_traces(f)
    parent = [t for t in traces.values() if t["header"]["model_name"] == "ensemble_add_sub"]
    assert len(parent) == 1
    p = parent[0]
    pid = p["header"]["id"]
    assert "parent_id" not in p["header"]
    # The ensemble itself: no compute of its own.
    assert p["names"] == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
                          "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                          "HTTP_SEND_END"]
    children = [t for t in traces.values() if t is not p]
    assert sorted(c["header"]["model_name"] for c in children) == [
        "add_sub", "add_sub", "add_sub_onnx", "identity_fp32"]
    for c in children:
        assert c["header"]["parent_id"] == pid
        assert c["names"] == CORE_ORDER
        assert p["ns"][2] <= c["ns"][0] and c["ns"][-1] <= p["ns"][4]


def test_tensors_level_records_inputs_and_outputs(nereid_server, tmp_path):
    # Triton's TENSORS level: TENSOR_QUEUE_INPUT for each input a (non
    # sequence) scheduler takes, TENSOR_BACKEND_OUTPUT for each output sent,
    # the ensemble's own and its steps' (L0_cmdline_trace counts them).
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-level=TIMESTAMPS",
                      "--trace-level=TENSORS", "--trace-rate=1")
    infer(s, "ensemble_add_sub", request_id="1")
    assert s.stop() == 0
    with open(f) as fh:
        entries = json.load(fh)
    headers = {e["id"]: e for e in entries if "model_name" in e}
    (ens,) = [i for i, h in headers.items() if h["model_name"] == "ensemble_add_sub"]
    tensors = [e for e in entries if "activity" in e]
    mine = [(e["activity"], e["tensor"]["name"]) for e in tensors if e["id"] == ens]
    assert sorted(mine) == [("TENSOR_BACKEND_OUTPUT", "OUTPUT0"),
                            ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"),
                            ("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1")]
    assert {"id": ens, "activity": "TENSOR_QUEUE_INPUT", "tensor": {
        "name": "INPUT0", "data": ",".join(str(i) for i in range(16)), "shape": "1,16",
        "dtype": "FP32"}} in tensors
    assert {"id": ens, "activity": "TENSOR_BACKEND_OUTPUT", "tensor": {
        "name": "OUTPUT0", "data": ",".join(str(3 * i) for i in range(16)), "shape": "1,16",
        "dtype": "FP32"}} in tensors
    # every traced request (the ensemble and its 4 steps) queued 2 inputs
    # (identity_fp32 takes one) and sent its outputs
    queued = [e for e in tensors if e["activity"] == "TENSOR_QUEUE_INPUT"]
    assert len({e["id"] for e in queued}) == len(headers) == 5
    assert all(e["activity"] != "TENSOR_BACKEND_INPUT" for e in tensors)


def test_grpc_stream_requests_are_traced(nereid_server, tmp_path):
    f = str(tmp_path / "t.json")
    s = nereid_server(EXAMPLES, "--trace-config", f"triton,file={f}", "--trace-level=TIMESTAMPS",
                      "--trace-rate=1")
    req = pb.ModelInferRequest(model_name="add_sub", id="s1")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        t.contents.fp32_contents.extend(np.arange(16, dtype=np.float32).tolist())
    with grpc.insecure_channel(s.grpc_addr) as ch:
        rs = list(pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(iter([req, req]), timeout=30))
    assert len(rs) == 2 and all(r.error_message == "" for r in rs)
    assert s.stop() == 0
    traces = read_traces(f)
    assert len(traces) == 2
    for t in traces.values():
        assert t["header"]["model_name"] == "add_sub" and t["header"]["request_id"] == "s1"
        assert [n for n in t["names"] if n in CORE_ORDER] == CORE_ORDER
        assert sorted(n for n in t["names"] if n not in CORE_ORDER) == [
            "GRPC_SEND_END", "GRPC_SEND_START", "GRPC_WAITREAD_END", "GRPC_WAITREAD_START"]


# ---- OpenTelemetry ----

class Collector:
    """An OTLP/HTTP receiver on loopback: decodes each POST /v1/traces."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                msg = otlp.ExportTraceServiceRequest()
                msg.ParseFromString(body)
                with outer.lock:
                    outer.requests.append((self.path, self.headers["Content-Type"], msg))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def spans(self):
        with self.lock:
            return [(rs.resource, span) for _, _, m in self.requests for rs in m.resource_spans
                    for ss in rs.scope_spans for span in ss.spans]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.close()


def attrs(kvs):
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


def test_opentelemetry_export(nereid_server, collector):
    url = f"http://127.0.0.1:{collector.port}/v1/traces"
    s = nereid_server(EXAMPLES, "--trace-config", "mode=opentelemetry", "--trace-config",
                      f"opentelemetry,url={url}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1", "--trace-config",
                      "opentelemetry,resource=test.key=test.value", "--trace-config",
                      "opentelemetry,bsp_schedule_delay=50")
    got = get(s, "/v2/trace/setting")
    assert got == {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
                   "trace_mode": "opentelemetry", "url": url,
                   "resource": "test.key=test.value", "bsp_schedule_delay": "50",
                   "bsp_max_queue_size": "2048", "bsp_max_export_batch_size": "512"}
    trace_http = "0af7651916cd43dd8448eb211c80319c"
    trace_grpc = "4bf92f3577b34da6a3ce929d0e0e4736"
    infer(s, headers={"traceparent": f"00-{trace_http}-b7ad6b7169203331-01"}, request_id="r1")
    grpc_infer(s, metadata=(("traceparent", f"00-{trace_grpc}-00f067aa0ba902b7-01"),))
    infer(s, "ensemble_add_sub")
    deadline = time.time() + 60
    while len(collector.spans()) < 3 + 3 + 10 and time.time() < deadline:
        time.sleep(0.05)
    spans = collector.spans()
    assert len(spans) == 16, [sp.name for _, sp in spans]
    path, ctype, _ = collector.requests[0]
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    res = attrs(spans[0][0].attributes)
    assert res["service.name"] == "triton-inference-server" and res["test.key"] == "test.value"
    by_trace = {}
    for _, sp in spans:
        by_trace.setdefault(sp.trace_id.hex(), []).append(sp)
    for tid, parent_span in ((trace_http, "b7ad6b7169203331"), (trace_grpc, "00f067aa0ba902b7")):
        group = {sp.name: sp for sp in by_trace[tid]}
        assert sorted(group) == ["InferRequest", "add_sub", "compute"]
        root, model, compute = group["InferRequest"], group["add_sub"], group["compute"]
        assert root.parent_span_id.hex() == parent_span  # propagated context
        assert model.parent_span_id == root.span_id
        assert compute.parent_span_id == model.span_id
        assert all(sp.kind == otlp.Span.SPAN_KIND_SERVER for sp in group.values())
        assert [e.name for e in model.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
        assert [e.name for e in compute.events] == ["COMPUTE_START", "COMPUTE_INPUT_END",
                                                    "COMPUTE_OUTPUT_START", "COMPUTE_END"]
        a = attrs(model.attributes)
        assert a["triton.model_name"] == "add_sub" and a["triton.model_version"] == 1
        assert a["triton.trace_parent_id"] == 0
        assert root.start_time_unix_nano <= model.start_time_unix_nano \
            <= compute.start_time_unix_nano <= compute.end_time_unix_nano \
            <= model.end_time_unix_nano <= root.end_time_unix_nano
        assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 3600
    http_root = next(sp for sp in by_trace[trace_http] if sp.name == "InferRequest")
    assert [e.name for e in http_root.events] == ["HTTP_RECV_START", "HTTP_RECV_END",
                                                  "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
                                                  "HTTP_SEND_END"]
    model = next(sp for sp in by_trace[trace_http] if sp.name == "add_sub")
    assert attrs(model.attributes)["triton.request_id"] == "r1"
    # The ensemble: a fresh trace id; steps' model spans under the ensemble's.
    (ens_tid,) = [t for t in by_trace if t not in (trace_http, trace_grpc)]
    group = by_trace[ens_tid]
    ens = next(sp for sp in group if sp.name == "ensemble_add_sub")
    root = next(sp for sp in group if sp.name == "InferRequest")
    assert not root.parent_span_id and ens.parent_span_id == root.span_id
    steps = [sp for sp in group if sp.name in ("add_sub", "add_sub_onnx", "identity_fp32")]
    assert len(steps) == 4 and all(sp.parent_span_id == ens.span_id for sp in steps)
    ens_id = attrs(ens.attributes)["triton.trace_id"]
    assert all(attrs(sp.attributes)["triton.trace_parent_id"] == ens_id for sp in steps)
    assert sum(sp.name == "compute" for sp in group) == 4


def test_opentelemetry_rate_zero_traces_only_propagated(nereid_server, collector):
    url = f"http://127.0.0.1:{collector.port}/v1/traces"
    s = nereid_server(EXAMPLES, "--trace-config", "mode=opentelemetry", "--trace-config",
                      f"opentelemetry,url={url}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=0")
    infer(s)
    infer(s, headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    infer(s, headers={"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"})
    assert s.stop() == 0  # the exporter sends what it holds at shutdown
    spans = collector.spans()
    assert {sp.trace_id.hex() for _, sp in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    assert len(spans) == 3
