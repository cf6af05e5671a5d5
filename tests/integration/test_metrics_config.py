"""--metrics-config as Triton reads it: counter_latencies=false drops the
latency counters, histogram_latencies=true adds
nv_inference_first_response_histogram_ms (Triton's buckets 100, 500, 2000 and
5000 ms), summary_latencies=true is refused, malformed settings get Triton's
format error."""
import json
import os
import shutil
import subprocess

import requests

from conftest import EXAMPLES, NEREID

LATENCY_COUNTERS = ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                    "nv_inference_compute_input_duration_us",
                    "nv_inference_compute_infer_duration_us",
                    "nv_inference_compute_output_duration_us")
HIST = "nv_inference_first_response_histogram_ms"


BUCKETS = """
model_metrics {
  metric_control: [ {
    metric_identifier { family: "nv_inference_first_response_histogram_ms" }
    histogram_options { buckets: [ 1, 2.5, 4, 8 ] }
  }, {
    metric_identifier { family: "nv_no_such_family" }
    histogram_options { buckets: [ 1 ] }
  } ]
}
"""


def repo(tmp_path):
    path = str(tmp_path / "models")
    for name in ("repeat_int32", "identity_fp32"):
        shutil.copytree(os.path.join(EXAMPLES, name), os.path.join(path, name))
    # identity_fp32 with its own buckets (Triton's model_metrics).
    shutil.copytree(os.path.join(EXAMPLES, "identity_fp32"), os.path.join(path, "id_buckets"))
    cfg = os.path.join(path, "id_buckets", "config.pbtxt")
    with open(cfg) as f:
        text = f.read().replace('name: "identity_fp32"', 'name: "id_buckets"')
    with open(cfg, "w") as f:
        f.write(text + BUCKETS)
    return path


def metrics(s):
    return requests.get(s.metrics_url + "/metrics", timeout=10).text


def infer_fp32(s):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    r = requests.post(f"{s.http_url}/v2/models/identity_fp32/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text


def test_defaults_counters_no_histogram(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path))
    infer_fp32(s)
    text = metrics(s)
    for family in LATENCY_COUNTERS:
        assert f"# TYPE {family} counter" in text
    assert HIST not in text


def test_counter_latencies_false_histogram_true(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path), "--metrics-config=counter_latencies=false",
                      "--metrics-config=histogram_latencies=true")
    infer_fp32(s)
    infer_fp32(s)
    # A decoupled model's first of 3 responses (generate_stream carries all).
    r = requests.post(f"{s.http_url}/v2/models/repeat_int32/generate_stream",
                      data=json.dumps({"IN": [1, 2, 3], "DELAY": [0, 0, 0], "WAIT": 0}),
                      timeout=30)
    assert r.text.count("data: ") == 3
    text = metrics(s)
    for family in LATENCY_COUNTERS:
        assert family not in text
    assert "nv_inference_request_success" in text  # the other counters stay
    assert (f"# HELP {HIST} Duration from request to first response in milliseconds\n"
            f"# TYPE {HIST} histogram\n") in text
    lab = 'model="identity_fp32",version="1"'
    assert f"{HIST}_count{{{lab}}} 2\n" in text
    assert f'{HIST}_bucket{{{lab},le="+Inf"}} 2\n' in text
    for le in ("100", "500", "2000", "5000"):
        assert f'{HIST}_bucket{{{lab},le="{le}"}} ' in text
    lab = 'model="repeat_int32",version="1"'
    assert f"{HIST}_count{{{lab}}} 1\n" in text  # one request, three responses
    # model_metrics buckets replace the defaults for that model.
    lab = 'model="id_buckets",version="1"'
    buckets = [line.split("{")[1].split("}")[0] for line in text.splitlines()
               if line.startswith(f"{HIST}_bucket{{{lab}")]
    assert buckets == [f'{lab},le="{le}"' for le in ("1", "2.5", "4", "8", "+Inf")]
    assert ("Metric family 'nv_no_such_family' in 'metric_identifier' is not a customizable "
            "metric in Triton core.") in s.output()


def run(*args):
    return subprocess.run([NEREID, "--model-repository", EXAMPLES, *args], capture_output=True,
                          text=True, timeout=60)


def test_refused_and_malformed():
    r = run("--metrics-config=summary_latencies=true")
    assert r.returncode == 2 and "summary_latencies=true is not supported" in r.stderr
    for bad in ("counter_latencies", "=true", "counter_latencies=", "a,b=c"):
        r = run(f"--metrics-config={bad}")
        assert r.returncode == 2, bad
        assert f"--metrics-config option format is <setting>=<value>. Got {bad}" in r.stderr
