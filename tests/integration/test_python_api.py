"""pb_utils beyond inference, through the real binary: custom metrics
(MetricFamily / Metric on /metrics), model control from a model
(load_model, unload_model, is_model_ready), per-request requested outputs
and response parameters, and Python-based backends (a backend directory
with model.py, `runtime: "model.py"`).

One explicit-mode server holds most models. The "api" model evaluates the
Python expression a request sends (CMD) inside its worker and answers
{"result": ...} or {"error": "<Type>: <message>"}, so each test drives
pb_utils directly and checks what the server shows for it.
"""
import json
import os
import textwrap

import grpc
import numpy as np
import pytest
import requests

from conftest import BUILD, Server
from grpc_util import stubs
from http_helpers import build_infer, infer, output_array, split_response
from test_python_backend import write

pb, pbg, _, _ = stubs()


API = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.env = {"pb_utils": pb_utils, "np": np, "json": json, "self": self}
        self.requests = pb_utils.MetricFamily(
            name="api_requests_total", description="Requests the api model saw",
            kind=pb_utils.MetricFamily.COUNTER)
        self.seen = self.requests.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        out = []
        for r in requests:
            self.seen.increment(1)
            cmd = pb_utils.get_input_tensor_by_name(r, "CMD").as_numpy()[0].decode()
            res = {}
            self.env["result"] = None
            try:
                exec(compile(cmd, "<cmd>", "exec"), self.env)
                res["result"] = self.env.get("result")
            except Exception as e:
                res["error"] = f"{type(e).__name__}: {e}"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(res, default=repr).encode()], dtype=np.object_))]))
        return out
"""

API_CONFIG = """
name: "api"
backend: "python"
input [ { name: "CMD" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Returns every output whatever was asked; NAMES says what the request asked.
OUTS = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            names = json.dumps(sorted(r.requested_output_names())).encode()
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("A", x + 1), pb_utils.Tensor("B", x + 2),
                 pb_utils.Tensor("NAMES", np.array([names], dtype=np.object_))],
                parameters={"p_str": "hello", "p_int": 42, "p_bool": True}))
        return out
"""

OUTS_CONFIG = """
name: "outs"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "B" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "NAMES" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 2 ] }
"""

DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            s = r.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)],
                                              parameters={"index": 0, "last": False}))
            s.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)],
                                              parameters={"index": 1, "last": True}),
                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

DECOUPLED_CONFIG = """
name: "dec"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

LOADED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 10)]) for r in requests]
"""

LOADED_CONFIG = {
    "name": "loaded", "backend": "python",
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pyapi") / "models")
    write(path, "api", API_CONFIG, API)
    write(path, "outs", OUTS_CONFIG, OUTS)
    write(path, "dec", DECOUPLED_CONFIG, DECOUPLED)
    write(path, "on_disk", DECOUPLED_CONFIG.replace('"dec"', '"on_disk"'), DECOUPLED)
    return path


@pytest.fixture(scope="module")
def server(repo):
    s = Server(repo, ["--model-control-mode=explicit", "--load-model=api",
                      "--load-model=outs", "--load-model=dec"], "http")
    yield s
    rc = s.stop()
    with open(s.log_path) as f:
        out = f.read()
    assert rc == 0, out


def run(server, code, model="api"):
    """Runs code in the model's worker; its `result` or {"error": ...}."""
    body, headers = build_infer(
        [{"name": "CMD", "datatype": "BYTES", "data": np.array([code.encode()], dtype=object)}])
    r = infer(server, model, body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    res = json.loads(output_array(doc, raw, "OUT")[0])
    if "error" in res:
        return {"error": res["error"]}
    return res["result"]


def metrics(server):
    return requests.get(server.metrics_url + "/metrics", timeout=10).text


# ---- custom metrics ----

def test_counter_gauge_and_histogram_on_metrics_page(server):
    assert run(server, textwrap.dedent("""
        c = pb_utils.MetricFamily(name="t_counter", description="A counter",
                                  kind=pb_utils.MetricFamily.COUNTER)
        g = pb_utils.MetricFamily(name="t_gauge", description="A gauge",
                                  kind=pb_utils.MetricFamily.GAUGE)
        h = pb_utils.MetricFamily(name="t_hist", description="A histogram",
                                  kind=pb_utils.MetricFamily.HISTOGRAM)
        self.cm = c.Metric(labels={"z": "last", "a": 'q"uote'})
        self.gm = g.Metric()
        self.hm = h.Metric(labels={"m": "x"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
        self.fams = (c, g, h)
        self.cm.increment(2023.0)
        self.gm.increment(5)
        self.gm.increment(-23.5)
        for v in (0.05, 1.5, 6.0):
            self.hm.observe(v)
        result = [self.cm.value(), self.gm.value()]
    """)) == [2023.0, -18.5]
    text = metrics(server)
    assert ("# HELP t_counter A counter\n# TYPE t_counter counter\n"
            't_counter{a="q\\"uote",z="last"} 2023\n') in text
    assert "# HELP t_gauge A gauge\n# TYPE t_gauge gauge\nt_gauge -18.5\n" in text
    assert ("# HELP t_hist A histogram\n# TYPE t_hist histogram\n"
            't_hist_count{m="x"} 3\nt_hist_sum{m="x"} 7.55\n'
            't_hist_bucket{m="x",le="0.1"} 1\nt_hist_bucket{m="x",le="1"} 1\n'
            't_hist_bucket{m="x",le="2.5"} 2\nt_hist_bucket{m="x",le="5"} 2\n'
            't_hist_bucket{m="x",le="10"} 3\nt_hist_bucket{m="x",le="+Inf"} 3\n') in text
    # the model's own counter from initialize, one per request so far
    assert 'api_requests_total{model="api"}' in text
    assert run(server, "self.gm.set(999.9); result = self.gm.value()") == 999.9


def test_metric_updates_unanswered_are_applied_before_the_response(server):
    # increment/set/observe that cannot fail go without an answer: the
    # server applies them in order, before the response that follows them
    assert run(server, textwrap.dedent("""
        c = pb_utils.MetricFamily(name="t_burst", description="Burst",
                                  kind=pb_utils.MetricFamily.COUNTER)
        g = pb_utils.MetricFamily(name="t_burst_g", description="Burst gauge",
                                  kind=pb_utils.MetricFamily.GAUGE)
        h = pb_utils.MetricFamily(name="t_burst_h", description="Burst histogram",
                                  kind=pb_utils.MetricFamily.HISTOGRAM)
        self.burst = (c, g, h, c.Metric(), g.Metric(), h.Metric(buckets=[1.0]))
        for i in range(500):
            self.burst[3].increment(2)
            self.burst[4].set(i)
            self.burst[5].observe(0.5)
        self.burst[4].increment(0.5)
        result = 1
    """)) == 1
    text = metrics(server)
    assert "\nt_burst 1000\n" in text and "\nt_burst_g 499.5\n" in text
    assert "\nt_burst_h_count 500\n" in text
    # the ones that can fail still wait for the server's answer
    res = run(server, "self.burst[3].increment(-1)")
    assert "can only be incremented monotonically" in res["error"]
    res = run(server, "self.burst[5].set(1)")
    assert "Failed to set metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not" in \
        res["error"]
    assert run(server, "result = self.burst[3].value()") == 1000


@pytest.mark.parametrize("code, text", [
    ("self.cm.increment(-1)", "TritonModelException: Failed to increment metric value: "
     "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative "
     "values."),
    ("self.cm.set(1)", "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not "
     "support Set"),
    ("self.gm.observe(1)", "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does "
     "not support Observe"),
    ("self.hm.value()", "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
     "support Value"),
    ("self.hm.increment(1)", "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"),
    ("self.fams[2].Metric(labels={})", "Failed to create metric. Missing required buckets."),
    ("self.fams[0].Metric(buckets=[1.0])", "Failed to create metric. Unexpected buckets found."),
    ("self.fams[2].Metric(buckets=[2.5, 0.1])", "Error when creating Metric: Bucket Boundaries "
     "must be strictly sorted"),
    ("self.fams[2].Metric(buckets=[1, 1])", "Bucket Boundaries must be strictly sorted"),
    ("self.fams[0].Metric(labels=[1])", "Failed to create metric. Labels must be a dictionary."),
    ("self.fams[0].Metric(labels={'a': 1})", "label values must be strings"),
    ("self.fams[0].Metric(labels={'__x': 'v'})", "Invalid label name"),
    ("pb_utils.MetricFamily(name='t_counter', description='', kind=pb_utils.MetricFamily.GAUGE)",
     "Error when creating MetricFamily: Family name already exists with different type"),
    ("pb_utils.MetricFamily(name='9no', description='', kind=pb_utils.MetricFamily.GAUGE)",
     "Invalid metric name"),
    ("pb_utils.MetricFamily(name='k', description='', kind=7)", "Unknown metric kind"),
])
def test_metric_errors_are_triton_model_exceptions(server, code, text):
    run(server, textwrap.dedent("""
        if not hasattr(self, "fams"):
            c = pb_utils.MetricFamily(name="t_counter", description="A counter",
                                      kind=pb_utils.MetricFamily.COUNTER)
            g = pb_utils.MetricFamily(name="t_gauge", description="A gauge",
                                      kind=pb_utils.MetricFamily.GAUGE)
            h = pb_utils.MetricFamily(name="t_hist", description="A histogram",
                                      kind=pb_utils.MetricFamily.HISTOGRAM)
            self.cm, self.gm = c.Metric(), g.Metric()
            self.hm = h.Metric(buckets=[1.0])
            self.fams = (c, g, h)
    """))
    res = run(server, code)
    assert "error" in res and res["error"].startswith("TritonModelException: "), res
    assert text in res["error"]


def test_duplicates_share_and_lifetimes(server):
    assert run(server, textwrap.dedent("""
        f1 = pb_utils.MetricFamily(name="t_dup", description="first",
                                   kind=pb_utils.MetricFamily.COUNTER)
        f2 = pb_utils.MetricFamily(name="t_dup", description="second",
                                   kind=pb_utils.MetricFamily.COUNTER)
        m1 = f1.Metric(labels={"k": "v"})
        self.dup = f2.Metric(labels={"k": "v"})
        m1.increment(7.5)
        result = self.dup.value()
        del m1, f1
    """)) == 7.5
    text = metrics(server)
    assert '# HELP t_dup first\n# TYPE t_dup counter\nt_dup{k="v"} 7.5\n' in text
    # a family deleted before its metric: the metric is unusable, as in Triton
    res = run(server, textwrap.dedent("""
        fam = pb_utils.MetricFamily(name="t_gone", description="d",
                                    kind=pb_utils.MetricFamily.GAUGE)
        m = fam.Metric(labels={"x": "y"})
        del fam
        m.set(10)
    """))
    assert "Invalid metric operation as the corresponding 'MetricFamily' has been deleted." \
        in res["error"]
    # deleted objects leave the page (with the next call the worker makes)
    run(server, "del self.dup")
    run(server, "result = 1")
    text = metrics(server)
    assert "t_dup" not in text and "t_gone" not in text


def test_metrics_of_an_unloaded_model_leave_the_page(server):
    before = metrics(server)
    assert 'api_requests_total{model="api"}' in before
    r = requests.post(server.http_url + "/v2/repository/models/api/unload", timeout=60)
    assert r.status_code == 200
    assert "api_requests_total" not in metrics(server)
    r = requests.post(server.http_url + "/v2/repository/models/api/load", timeout=60)
    assert r.status_code == 200
    run(server, "result = 1")
    assert 'api_requests_total{model="api"} 1\n' in metrics(server)


# ---- model control ----

def test_load_with_config_and_files_then_unload(server):
    code = textwrap.dedent(f"""
        pb_utils.load_model("loaded", config={json.dumps(json.dumps(LOADED_CONFIG))},
                            files={{"file:/1/model.py": {LOADED!r}.encode()}})
        result = [pb_utils.is_model_ready("loaded"), pb_utils.is_model_ready("loaded", "1"),
                  pb_utils.is_model_ready("loaded", "2"), pb_utils.is_model_ready("nope")]
    """)
    assert run(server, code) == [True, True, False, False]
    body, headers = build_infer([{"name": "X", "datatype": "INT32",
                                  "data": np.array([4], np.int32)}])
    r = infer(server, "loaded", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert output_array(doc, raw, "Y").tolist() == [40]
    assert run(server, 'pb_utils.unload_model("loaded"); '
                       'result = pb_utils.is_model_ready("loaded")') is False
    assert requests.get(server.http_url + "/v2/models/loaded/ready", timeout=10).status_code != 200
    # a model that is on disk loads by name; unload_dependents is accepted
    assert run(server, 'pb_utils.load_model("on_disk"); '
                       'result = pb_utils.is_model_ready("on_disk")') is True
    assert run(server, 'pb_utils.unload_model("on_disk", unload_dependents=True); '
                       'result = pb_utils.is_model_ready("on_disk")') is False


@pytest.mark.parametrize("code, text", [
    ('pb_utils.load_model("bad", config="{not json")', "Failed to load model: "),
    ('pb_utils.load_model("x", files=[1])',
     "failed to load model 'x', files should be a dictionary of file paths and file contents"),
    ('pb_utils.load_model("x", config="{}", files={"1/model.py": b""})',
     "Unrecognized load parameter '1/model.py'."),
    ('pb_utils.is_model_ready("api", "-3")', "failed to get model version from specified "
     "version string '-3', version should be an integral value > 0"),
    ('pb_utils.load_model("no_such_model")', "Failed to load model: "),
])
def test_model_control_errors(server, code, text):
    res = run(server, code)
    assert text in res["error"], res


def test_model_control_refused_unless_explicit(tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "api", API_CONFIG, API)
    s = Server(repo, [], "http")
    try:
        for code in ('pb_utils.load_model("api")', 'pb_utils.unload_model("api")'):
            res = run(s, code)
            assert res["error"].endswith(
                "explicit model load / unload is not allowed if polling is enabled"), res
        assert run(s, 'result = pb_utils.is_model_ready("api")') is True
    finally:
        assert s.stop() == 0


# ---- requested outputs and response parameters ----

def test_only_requested_outputs_reach_the_client(server):
    body, headers = build_infer([{"name": "X", "datatype": "INT32",
                                  "data": np.array([[5]], np.int32)}],
                                outputs=[{"name": "A"}, {"name": "NAMES"}])
    r = infer(server, "outs", body, headers)
    assert r.status_code == 200, r.text
    doc, raw = split_response(r)
    assert sorted(o["name"] for o in doc["outputs"]) == ["A", "NAMES"]
    assert json.loads(output_array(doc, raw, "NAMES")[0]) == ["A", "NAMES"]
    assert doc["parameters"] == {"p_str": "hello", "p_int": 42, "p_bool": True}
    # no outputs named: all of them
    body, headers = build_infer([{"name": "X", "datatype": "INT32",
                                  "data": np.array([[5]], np.int32)}])
    doc, raw = split_response(infer(server, "outs", body, headers))
    assert json.loads(output_array(doc, raw, "NAMES")[0]) == ["A", "B", "NAMES"]


def test_requested_outputs_are_per_request_in_a_batch(server):
    import concurrent.futures as cf

    def one(outputs):
        body, headers = build_infer([{"name": "X", "datatype": "INT32",
                                      "data": np.array([[1]], np.int32)}], outputs=outputs)
        doc, raw = split_response(infer(server, "outs", body, headers))
        return (sorted(o["name"] for o in doc["outputs"]),
                json.loads(output_array(doc, raw, "NAMES")[0]))

    with cf.ThreadPoolExecutor(2) as ex:
        a = ex.submit(one, [{"name": "A"}, {"name": "NAMES"}])
        b = ex.submit(one, [{"name": "B"}, {"name": "NAMES"}])
        assert a.result() == (["A", "NAMES"], ["A", "NAMES"])
        assert b.result() == (["B", "NAMES"], ["B", "NAMES"])


def test_response_parameters_over_grpc_and_decoupled(server):
    req = pb.ModelInferRequest(model_name="outs")
    t = req.inputs.add()
    t.name, t.datatype = "X", "INT32"
    t.shape.extend([1, 1])
    req.raw_input_contents.append(np.array([3], np.int32).tobytes())
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        resp = stub.ModelInfer(req, timeout=30)
        p = resp.parameters
        assert p["p_str"].string_param == "hello"
        assert p["p_int"].int64_param == 42
        assert p["p_bool"].bool_param is True
        dreq = pb.ModelInferRequest(model_name="dec")
        t = dreq.inputs.add()
        t.name, t.datatype = "X", "INT32"
        t.shape.extend([1])
        dreq.raw_input_contents.append(np.array([3], np.int32).tobytes())
        got = list(stub.ModelStreamInfer(iter([dreq]), timeout=30))
    params = [(r.infer_response.parameters["index"].int64_param,
               r.infer_response.parameters["last"].bool_param) for r in got
              if r.infer_response.outputs]
    assert params == [(0, False), (1, True)]


# ---- Python-based backends ----

BACKEND_MODEL = """
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_input({"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.op = json.load(f)["operation"]

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUTPUT", a + b if self.op == "add" else a - b)]))
        return out
"""


def test_python_based_backend(tmp_path):
    backends = tmp_path / "backends"
    backends.mkdir()
    for f in ("libnereid_python.so", "python"):
        os.symlink(os.path.join(BUILD, "backends", f), backends / f)
    (backends / "add_sub").mkdir()
    (backends / "add_sub" / "model.py").write_text(textwrap.dedent(BACKEND_MODEL))
    repo = tmp_path / "models"
    for name, op, extra in (("add", "add", ""), ("sub", "sub", 'runtime: "model.py"\n'),
                            ("missing", "add", 'runtime: "model.py"\n')):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.json").write_text(json.dumps({"operation": op}))
        backend = "no_such_backend" if name == "missing" else "add_sub"
        (repo / name / "config.pbtxt").write_text(f'backend: "{backend}"\n{extra}')
    s = Server(str(repo), [f"--backend-directory={backends}", "--model-control-mode=explicit",
                           "--load-model=add", "--load-model=sub"], "http")
    try:
        a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
        for name, want in (("add", a + b), ("sub", a - b)):
            body, headers = build_infer([{"name": "INPUT0", "datatype": "FP32", "data": a},
                                         {"name": "INPUT1", "datatype": "FP32", "data": b}])
            r = infer(s, name, body, headers)
            assert r.status_code == 200, r.text
            doc, raw = split_response(r)
            assert output_array(doc, raw, "OUTPUT").tolist() == want.tolist()
        cfg = requests.get(s.http_url + "/v2/models/add/config", timeout=10).json()
        assert cfg["backend"] == "add_sub"
        assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
        r = requests.post(s.http_url + "/v2/repository/models/missing/load", timeout=60)
        assert r.status_code == 400
        assert ("unable to find Python backend based backend library 'model.py' for model "
                f"'missing', searched: '{backends}/no_such_backend/model.py'") in r.json()["error"]
    finally:
        assert s.stop() == 0
