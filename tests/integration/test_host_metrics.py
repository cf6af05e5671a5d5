"""Host metrics and the model load gauge on the metrics port, as Triton
serves them: nv_cpu_utilization, nv_cpu_memory_total_bytes and
nv_cpu_memory_used_bytes (gauges refreshed every --metrics-interval-ms,
left out with --allow-cpu-metrics=false) and nv_model_load_duration_secs
per backend model."""
import re
import time

import requests

from http_helpers import write_model

SLOW = """name: "slow"
backend: "testing"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "model_init_delay_ms" value: { string_value: "400" } }
"""

ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "slow" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""


def make_repo(tmp_path):
    repo = str(tmp_path / "models")
    write_model(repo, "slow", SLOW)
    write_model(repo, "ens", ENSEMBLE)
    return repo


def samples(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def meminfo_total_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def metrics(s):
    r = requests.get(s.metrics_url + "/metrics", timeout=10)
    assert r.status_code == 200
    return r.text


def test_cpu_metrics_polled(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path), "--metrics-interval-ms=50")
    deadline = time.time() + 30
    while True:  # the gauges read 0 until the first poll (interval / 2)
        v = samples(metrics(s))
        if v["nv_cpu_memory_total_bytes"] > 0 or time.time() > deadline:
            break
        time.sleep(0.05)
    text = metrics(s)
    for name, help_text in [("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]"),
                            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes"),
                            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes")]:
        assert f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name} " in text
    v = samples(text)
    assert v["nv_cpu_memory_total_bytes"] == meminfo_total_bytes()
    assert 0 < v["nv_cpu_memory_used_bytes"] <= v["nv_cpu_memory_total_bytes"]
    assert 0.0 <= v["nv_cpu_utilization"] <= 1.0


def test_cpu_metrics_wait_for_the_interval(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path), "--metrics-interval-ms=3600000")
    v = samples(metrics(s))
    assert v["nv_cpu_memory_total_bytes"] == 0
    assert v["nv_cpu_memory_used_bytes"] == 0
    assert v["nv_cpu_utilization"] == 0


def test_cpu_metrics_off(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path), "--allow-cpu-metrics=false")
    text = metrics(s)
    assert "nv_inference_count" in text
    assert "nv_cpu_" not in text


def test_model_load_duration(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path))
    text = metrics(s)
    assert ("# HELP nv_model_load_duration_secs Model load time in seconds\n"
            "# TYPE nv_model_load_duration_secs gauge\n") in text
    loads = {k: val for k, val in samples(text).items()
             if k.startswith("nv_model_load_duration_secs")}
    # a backend model only (Triton times backend models; an ensemble has none)
    assert list(loads) == ['nv_model_load_duration_secs{model="slow",version="1"}']
    assert 0.4 <= loads['nv_model_load_duration_secs{model="slow",version="1"}'] < 60


def test_metrics_flags_are_no_longer_ignored(nereid_server, tmp_path):
    s = nereid_server(make_repo(tmp_path), "--allow-cpu-metrics=true",
                      "--metrics-interval-ms=1000")
    assert "has no effect" not in s.output()
