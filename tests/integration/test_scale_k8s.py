"""deploy/k8s/*.yaml, checked offline (no cluster runs here): every document
validates against its Kubernetes schema (deploy/k8s/validate, installed by
scripts/setup.sh), the validator does reject broken manifests, and the
Deployment's and the KServe ServingRuntime's arguments really start Nereid on
the model repository the manifests describe."""
import glob
import os
import re
import shutil
import subprocess
import time

import pytest
import requests
import yaml

from conftest import NEREID, ROOT, free_port

K8S = os.path.join(ROOT, "deploy", "k8s")
VALIDATOR = os.path.join(K8S, "validate")
NODE = shutil.which("node")
MANIFESTS = sorted(glob.glob(os.path.join(K8S, "*.yaml")))


def validate(*files):
    if NODE is None:
        pytest.skip("node is not installed (scripts/setup.sh installs npm and node)")
    assert os.path.isdir(os.path.join(VALIDATOR, "node_modules")), \
        "the deploy/k8s validator is not installed: run scripts/setup.sh"
    return subprocess.run([NODE, os.path.join(VALIDATOR, "validate.mjs"), *files],
                          capture_output=True, text=True, timeout=120)


def docs(name):
    with open(os.path.join(K8S, name)) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def test_manifests_validate():
    r = validate(*MANIFESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    kinds = {line.split()[2].split("/")[0] for line in lines}
    assert all(line.startswith("ok ") for line in lines), r.stdout
    assert {"Deployment", "Service", "ConfigMap", "PodMonitor", "ServiceMonitor",
            "HorizontalPodAutoscaler", "ServingRuntime"} <= kinds, r.stdout


def test_validator_rejects_broken_manifests(tmp_path):
    dep = docs("nereid.yaml")["Deployment"]
    dep["spec"]["replicas"] = "three"
    rt = docs("kserve-servingruntime.yaml")["ServingRuntime"]
    rt["spec"]["protocolVersion"] = ["v2"]  # misspelt field
    hpa = docs("autoscaling.yaml")["HorizontalPodAutoscaler"]
    del hpa["spec"]["scaleTargetRef"]
    proto = docs("kserve-servingruntime.yaml")["ServingRuntime"]
    proto["spec"]["protocolVersions"] = ["v2", "grpc-v3"]
    fmt = docs("kserve-servingruntime.yaml")["ServingRuntime"]
    fmt["spec"]["supportedModelFormats"][0]["priority"] = 0
    port = docs("kserve-servingruntime.yaml")["ServingRuntime"]
    port["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([dep, rt, hpa, proto, fmt, port]))
    r = validate(str(bad))
    assert r.returncode == 1
    out = r.stdout.splitlines()
    assert len(out) == 6 and all(line.startswith("error ") for line in out), r.stdout
    assert "spec/replicas must be integer" in out[0]
    assert "must NOT have additional properties" in out[1]
    assert "scaleTargetRef" in out[2]
    assert "spec/protocolVersions/1 must be equal to one of the allowed values" in out[3]
    assert "spec/supportedModelFormats/0/priority must be >= 1" in out[4]
    # containers are checked as Kubernetes Containers
    assert "spec/containers/0/ports/0/containerPort must be integer" in out[5]


def test_deployment_matches_the_server():
    d = docs("nereid.yaml")
    spec = d["Deployment"]["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = dict(a[2:].split("=", 1) for a in c["args"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert spec["terminationGracePeriodSeconds"] > int(args["exit-timeout-secs"]) + pre_stop
    assert args["http-max-input-size"] == str(64 << 20)
    ports = {p["name"]: p["port"] for p in d["Service"]["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    rt = docs("kserve-servingruntime.yaml")["ServingRuntime"]["spec"]
    assert rt["protocolVersions"] == ["v2", "grpc-v2"]
    rargs = rt["containers"][0]["args"]
    for a in ("--model-store=/mnt/models", "--http-port=8080", "--grpc-port=9000"):
        assert a in rargs


def start(args, tmp_path):
    """Runs nereid with args, local ports swapped in; returns (proc, http url)."""
    http = free_port()
    ports = {"http-port": http, "grpc-port": free_port(), "metrics-port": free_port()}
    out = []
    for a in args:
        m = re.match(r"--([a-z-]+)=(.*)", a)
        if m and m.group(1) in ports:
            a = f"--{m.group(1)}={ports[m.group(1)]}"
        out.append(a)
    log = open(tmp_path / f"nereid-{http}.log", "w+")
    proc = subprocess.Popen([NEREID, *out, "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}"
    deadline = time.time() + 60
    while True:
        try:
            if requests.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            log.seek(0)
            pytest.fail(f"nereid did not become ready with {out}:\n{log.read()}")
        time.sleep(0.05)


def stop(proc):
    proc.terminate()  # Kubernetes stops a pod with SIGTERM
    assert proc.wait(timeout=60) == 0


def test_manifest_arguments_start_nereid(tmp_path):
    # lay out the repository as the init container does, from the ConfigMap
    d = docs("nereid.yaml")
    repo = tmp_path / "models"
    for key, text in d["ConfigMap"]["data"].items():
        model = key.split(".", 1)[0]
        (repo / model / "1").mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(text)
    args = d["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [a.replace("=/models", f"={repo}") for a in args]
    proc, url = start(args, tmp_path)
    r = requests.post(f"{url}/v2/models/identity_fp32/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.5]}]}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [1.5, 2.5]
    stop(proc)
    # the ServingRuntime's arguments, with /mnt/models pointing at the same repository
    rt = docs("kserve-servingruntime.yaml")["ServingRuntime"]["spec"]["containers"][0]["args"]
    proc, url = start([a.replace("=/mnt/models", f"={repo}") for a in rt], tmp_path)
    assert requests.get(f"{url}/v2/models/identity_fp32/ready", timeout=10).status_code == 200
    stop(proc)
