"""--metrics-config as Triton reads it: counter_latencies=false drops the
latency counters, histogram_latencies=true adds
nv_inference_first_response_histogram_ms (Triton's buckets 100, 500, 2000 and
5000 ms), summary_latencies=true adds Triton's latency summaries (its names,
default or summary_quantiles quantiles), malformed settings get Triton's
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
# The phase histograms of Triton's core PR #474, with its default buckets.
PHASES = {
    "nv_inference_request_duration_histogram_us": ("1000", "5000", "25000", "50000", "100000"),
    "nv_inference_queue_duration_histogram_us": ("100", "1000", "5000", "10000", "50000"),
    "nv_inference_compute_input_duration_histogram_us": ("100", "500", "1000", "5000", "10000"),
    "nv_inference_compute_infer_duration_histogram_us": ("1000", "5000", "25000", "50000",
                                                          "100000"),
    "nv_inference_compute_output_duration_histogram_us": ("100", "500", "1000", "5000",
                                                           "10000"),
}


BUCKETS = """
model_metrics {
  metric_control: [ {
    metric_identifier { family: "nv_inference_first_response_histogram_ms" }
    histogram_options { buckets: [ 1, 2.5, 4, 8 ] }
  }, {
    metric_identifier { family: "nv_inference_queue_duration_histogram_us" }
    histogram_options { buckets: [ 10, 20 ] }
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
    for family in PHASES:
        assert family not in text


def series(text, name, lab):
    """{suffix-and-labels: value} of one model's lines of a histogram."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "_") and "{" + lab in line:
            key, value = line.rsplit(" ", 1)
            out[key[len(name):]] = int(value)
    return out


def test_phase_histograms(nereid_server, tmp_path):
    s = nereid_server(repo(tmp_path), "--metrics-config=histogram_latencies=true")
    for _ in range(3):
        infer_fp32(s)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    r = requests.post(f"{s.http_url}/v2/models/id_buckets/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    text = metrics(s)
    lab = 'model="identity_fp32",version="1"'
    for name, les in PHASES.items():
        assert f"# TYPE {name} histogram\n" in text
        got = series(text, name, lab)
        assert got[f"_count{{{lab}}}"] == 3, (name, got)
        buckets = [got[f'_bucket{{{lab},le="{le}"}}'] for le in les + ("+Inf",)]
        assert buckets == sorted(buckets), (name, buckets)  # cumulative
        assert buckets[-1] == 3
        assert len(got) == len(les) + 3  # _count, _sum, the buckets and +Inf
    # The request histogram's sum is the successes' share of the counter.
    hsum = series(text, "nv_inference_request_duration_histogram_us", lab)[f"_sum{{{lab}}}"]
    counter = [int(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(f"nv_inference_request_duration_us{{{lab}}}")][0]
    assert counter - 3 <= hsum <= counter
    # model_metrics replaces one family's buckets for that model only.
    lab = 'model="id_buckets",version="1"'
    got = series(text, "nv_inference_queue_duration_histogram_us", lab)
    assert sorted(k for k in got if k.startswith("_bucket")) == sorted(
        f'_bucket{{{lab},le="{le}"}}' for le in ("10", "20", "+Inf"))
    assert got[f"_count{{{lab}}}"] == 1
    out = s.output()
    assert "nv_inference_queue_duration_histogram_us' in 'metric_identifier' is not" not in out


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


SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")


def summary_lines(s, name):
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    return [line for line in text.splitlines() if line.startswith(name)]


def test_summary_latencies(nereid_server):
    s = nereid_server(EXAMPLES, "--metrics-config=summary_latencies=true",
                      "--metrics-config=counter_latencies=false")
    lab = 'model="add_sub",version="1"'
    # before any request: every quantile is Nan (prometheus-cpp), count 0
    lines = summary_lines(s, "nv_inference_request_summary_us")
    assert f'nv_inference_request_summary_us{{{lab},quantile="0.5"}} Nan' in lines
    assert f"nv_inference_request_summary_us_count{{{lab}}} 0" in lines
    body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    for _ in range(3):
        r = requests.post(f"{s.http_url}/v2/models/add_sub/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    for name in SUMMARIES:
        assert f"# TYPE {name} summary" in text, name
        qs = [line.split('quantile="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith(f"{name}{{{lab},quantile=")]
        assert qs == ["0.5", "0.9", "0.95", "0.99", "0.999"], name
        assert f"{name}_count{{{lab}}} 3" in text, name
    q50 = [line for line in text.splitlines()
           if line.startswith(f'nv_inference_request_summary_us{{{lab},quantile="0.5"}}')][0]
    assert float(q50.split()[-1]) >= 0
    assert "nv_inference_request_duration_us" not in text  # counters off
    assert "nv_cache_hit_summary_per_model" not in text  # no cached model


def test_summary_quantiles(nereid_server):
    # Triton's L0_metrics value: "0.0.1" parses as 0.0 (std::stod), bad pairs are skipped
    s = nereid_server(EXAMPLES, "--metrics-config=summary_latencies=true",
                      "--metrics-config=summary_quantiles=0.1:0.0.1,0.7:0.01,bad,0.75:0.01")
    lines = summary_lines(s, 'nv_inference_queue_summary_us{model="add_sub"')
    assert [line.split('quantile="')[1].split('"')[0] for line in lines] == ["0.1", "0.7", "0.75"]
    assert "Invalid option: [bad]. No ':' delimiter found." in s.output()


def test_malformed():
    for bad in ("counter_latencies", "=true", "counter_latencies=", "a,b=c"):
        r = run(f"--metrics-config={bad}")
        assert r.returncode == 2, bad
        assert f"--metrics-config option format is <setting>=<value>. Got {bad}" in r.stderr


def test_backend_custom_counter(nereid_server, tmp_path):
    # The identity backend counts its requests' input bytes in a counter of
    # its own (the custom metrics registry, nereid_metric_*), as Triton's identity backend does
    # (L0_backend_identity: input_byte_size_counter{model=...,version=...}).
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(EXAMPLES, "identity_fp32"), repo / "identity_fp32")
    s = nereid_server(str(repo))
    for n in (4, 12):
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n],
                            "data": [1.0] * n}]}
        r = requests.post(f"{s.http_url}/v2/models/identity_fp32/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
    text = requests.get(f"{s.metrics_url}/metrics", timeout=10).text
    assert ("# HELP input_byte_size_counter Cumulative input byte size of all requests "
            "received by the model\n# TYPE input_byte_size_counter counter\n"
            'input_byte_size_counter{model="identity_fp32",version="1"} 64\n') in text
