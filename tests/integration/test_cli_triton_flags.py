"""Triton flags that change behaviour are honoured or refused, never accepted
and ignored: --model-load-retry-count, --model-namespacing (off here;
test_model_namespacing.py covers on), --reuse-http-port/--reuse-grpc-port, the gRPC keepalive flags and
--grpc-infer-response-compression-level."""
import json
import os
import subprocess
import time

import grpc
import numpy as np
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import infer_request, stubs


def flaky_config(attempts, path):
    return f"""backend: "testing" max_batch_size: 8
parameters {{ key: "fail_model_init_attempts" value {{ string_value: "{attempts}" }} }}
parameters {{ key: "init_attempts_file" value {{ string_value: "{path}" }} }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
"""


def write_model(repo, name, config):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)


def n_attempts(path):
    with open(path) as f:
        return len(f.read().splitlines())


def test_model_load_retry_count_retries_a_failed_load(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    ok_log, bad_log = str(tmp_path / "ok.log"), str(tmp_path / "bad.log")
    write_model(repo, "flaky_ok", flaky_config(2, ok_log))   # loads on the 3rd attempt
    write_model(repo, "flaky_bad", flaky_config(5, bad_log))  # still failing after 3
    s = nereid_server(repo, "--model-load-retry-count=2", "--exit-on-error=false",
                      "--strict-readiness=false")
    ready = requests.get(f"{s.http_url}/v2/models/flaky_ok/ready", timeout=10)
    assert ready.status_code == 200
    assert n_attempts(ok_log) == 3
    assert requests.get(f"{s.http_url}/v2/models/flaky_bad/ready", timeout=10).status_code == 400
    assert n_attempts(bad_log) == 3
    index = requests.post(f"{s.http_url}/v2/repository/index", timeout=10).json()
    bad = [m for m in index if m["name"] == "flaky_bad"][0]
    assert bad["state"] == "UNAVAILABLE"
    assert "model init attempt 3 failed" in bad["reason"]
    assert "retrying load of 'flaky_ok' version 1 (1 of 2)" in s.output()


def test_model_load_retry_count_default_is_no_retry(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    log = str(tmp_path / "a.log")
    write_model(repo, "flaky", flaky_config(1, log))
    s = nereid_server(repo, "--exit-on-error=false", "--strict-readiness=false")
    assert requests.get(f"{s.http_url}/v2/models/flaky/ready", timeout=10).status_code == 400
    assert n_attempts(log) == 1


def run(*args):
    return subprocess.run([NEREID, *args], capture_output=True, text=True, timeout=60)


def test_model_namespacing_off_is_accepted(nereid_server):
    s = nereid_server(EXAMPLES, "--model-namespacing=false")
    assert requests.get(s.http_url + "/v2/health/ready", timeout=10).status_code == 200
    assert "model-namespacing" not in s.output()


def start_second(http_port, grpc_port, *args):
    """A second server on the given ports; returns (process, output) once it
    is ready or has exited."""
    log = open(os.path.join(os.path.dirname(NEREID), f"second-{http_port}.log"), "w+")
    p = subprocess.Popen([NEREID, f"--model-repository={EXAMPLES}", "--allow-metrics=false",
                          "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          f"--http-port={http_port}", f"--grpc-port={grpc_port}", *args],
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while p.poll() is None and time.time() < deadline:
        log.seek(0)
        if "nereid ready" in log.read():
            break
        time.sleep(0.05)
    log.seek(0)
    return p, log.read()


def stop(p):
    if p.poll() is None:
        p.terminate()
        p.wait(timeout=60)


def test_reuse_ports(nereid_server):
    s = nereid_server(EXAMPLES, "--reuse-http-port=true", "--reuse-grpc-port=true")
    # Without the flags a second server fails on the taken port...
    p, out = start_second(s.http_port, s.grpc_port)
    try:
        assert p.wait(timeout=60) != 0, out
    finally:
        stop(p)
    # ...with them it serves the same ports.
    p, out = start_second(s.http_port, s.grpc_port, "--reuse-http-port=true",
                          "--reuse-grpc-port=true")
    try:
        assert p.poll() is None and "nereid ready" in out, out
    finally:
        stop(p)


def test_grpc_socket_flags_are_taken(nereid_server):
    s = nereid_server(EXAMPLES, "--grpc-keepalive-time=10000", "--grpc-keepalive-timeout=5000",
                      "--grpc-keepalive-permit-without-calls=true",
                      "--grpc-http2-max-pings-without-data=0",
                      "--grpc-http2-min-recv-ping-interval-without-data=1000",
                      "--grpc-http2-max-ping-strikes=0",
                      "--grpc-infer-response-compression-level=high", wait_port="grpc")
    assert "has no effect" not in s.output()
    pb, pb_grpc, _, _ = stubs()
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        vals = np.arange(64, dtype=np.float32)
        reply = stub.ModelInfer(
            infer_request(pb, "identity_fp32", [("INPUT0", "FP32", [1, 64], vals)]), timeout=30)
        out = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32)
        assert list(out) == list(vals)


def test_bad_compression_level_is_refused():
    r = run("--model-repository", EXAMPLES, "--grpc-infer-response-compression-level=max")
    assert r.returncode == 2
    assert "invalid argument for --grpc_infer_response_compression_level" in r.stderr


def onnx_auto_repo(tmp_path):
    """One ONNX add/sub model that can batch (first dimension variable) and
    a config.pbtxt naming only the platform: auto-complete fills the rest."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "make_models", os.path.join(os.path.dirname(EXAMPLES), "..", "scripts", "make_models.py"))
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    repo = str(tmp_path / "models")
    os.makedirs(os.path.join(repo, "auto_batch", "1"))
    with open(os.path.join(repo, "auto_batch", "1", "model.onnx"), "wb") as f:
        f.write(mm.add_sub((-1, 16)).SerializeToString())
    with open(os.path.join(repo, "auto_batch", "config.pbtxt"), "w") as f:
        f.write('platform: "onnxruntime_onnx"\n')
    return repo


def test_backend_config_default_max_batch_size_drives_auto_complete(nereid_server, tmp_path):
    """Triton's L0_backend_config: the ONNX Runtime auto-complete gives a
    batchable model default-max-batch-size (4 unless set, per backend or
    global), with a dynamic batcher when it is above 1; 0 leaves it unbatched."""
    repo = onnx_auto_repo(tmp_path)
    for args, want in (((), 4), (("--backend-config=onnxruntime,default-max-batch-size=5",), 5),
                       (("--backend-config=default-max-batch-size=6",), 6),
                       (("--backend-config=default-max-batch-size=6",
                         "--backend-config=onnxruntime,default-max-batch-size=2"), 2),
                       (("--backend-config=onnxruntime,default-max-batch-size=0",), 0)):
        s = nereid_server(repo, *args)
        cfg = requests.get(f"{s.http_url}/v2/models/auto_batch/config", timeout=10).json()
        assert cfg["max_batch_size"] == want, (args, cfg)
        assert ("dynamic_batching" in cfg) == (want > 1), (args, cfg)
        assert s.stop() == 0


def test_grpc_infer_thread_count_range():
    """Triton's range for --grpc-infer-thread-count (L0_sequence_stress):
    2 to 128, else start-up fails with its text."""
    for bad in ("-1", "0", "1", "129"):
        r = run("--model-repository", EXAMPLES, f"--grpc-infer-thread-count={bad}")
        assert r.returncode == 2, bad
        assert ("invalid argument for --grpc_infer_thread_count. Must be in the range 2 to 128."
                in r.stderr)


def test_grpc_infer_thread_count_128_is_accepted(nereid_server):
    s = nereid_server(EXAMPLES, "--grpc-infer-thread-count=128")
    assert requests.get(s.http_url + "/v2/health/live", timeout=10).status_code == 200


def test_backend_config_log_lines(nereid_server, tmp_path):
    """The lines L0_backend_config reads back from the log (--log-verbose=1):
    Triton's SetBackendConfigDefaults line, the backend's resolved
    configuration as JSON, and the dynamic batcher's start line."""
    repo = onnx_auto_repo(tmp_path)
    for args, line in (((), "Adding default backend config setting: default-max-batch-size,4"),
                       (("--backend-config=default-max-batch-size=7",
                         "--backend-config=default-max-batch-size=8"),
                        "Found overwritten default setting: default-max-batch-size,8")):
        s = nereid_server(repo, "--log-verbose=1", "--backend-config=onnxruntime,a=0", *args)
        out = s.output()
        assert s.stop() == 0
        assert f'] "{line}"' in out, out
        assert "Starting dynamic-batcher thread for auto_batch at nice 0..." in out
        conf = [ln for ln in out.splitlines() if '] "backend configuration:\\n' in ln]
        assert len(conf) == 1, out
        cmdline = json.loads(json.loads(conf[0].split("] ", 1)[1]).split("\n", 1)[1])["cmdline"]
        assert cmdline["a"] == "0" and cmdline["min-compute-capability"] == "6.000000"
