"""Command-line behaviour of the real binary: Triton's flags, clear failures."""
import subprocess

import requests

from conftest import EXAMPLES, NEREID


def run(*args):
    return subprocess.run([NEREID, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_triton_flags():
    r = run("--help")
    assert r.returncode == 0
    for flag in ("--model-repository", "--http-port", "--grpc-port", "--metrics-port",
                 "--model-control-mode", "--load-model", "--repository-poll-secs",
                 "--strict-model-config", "--exit-on-error", "--log-verbose",
                 "--backend-directory", "--allow-http", "--allow-grpc", "--allow-metrics"):
        assert flag in r.stdout, flag


def test_unknown_flag_fails_clearly():
    r = run("--model-repository", EXAMPLES, "--no-such-flag=1")
    assert r.returncode == 2
    assert "unrecognized flag '--no-such-flag'" in r.stderr


def test_bad_values_fail_clearly():
    r = run("--model-repository", EXAMPLES, "--http-port=eighty")
    assert r.returncode == 2 and "invalid argument for --http-port: 'eighty'" in r.stderr
    r = run("--model-repository", EXAMPLES, "--model-control-mode=sometimes")
    assert r.returncode == 2 and "invalid argument for --model-control-mode" in r.stderr
    r = run("--model-repository", EXAMPLES, "--exit-on-error=maybe")
    assert r.returncode == 2
    r = run("--model-repository")
    assert r.returncode == 2 and "needs a value" in r.stderr


def test_repository_is_required():
    r = run("--http-port=0")
    assert r.returncode == 2 and "--model-repository must be specified" in r.stderr


def test_missing_repository_fails_startup(tmp_path):
    r = run(f"--model-repository={tmp_path}/absent", "--allow-grpc=false")
    assert r.returncode == 1 and "failed to open model repository" in r.stderr


def test_missing_repository_without_exit_on_error_stays_up(nereid_server, tmp_path):
    """Triton (L0_lifecycle test_parse_error_noexit): the server keeps serving
    health and metadata, neither live nor ready, whatever the readiness mode;
    one missing repository among several fails them all."""
    good = tmp_path / "models"
    good.mkdir()
    for repos, strict in (([str(tmp_path / "absent")], "true"),
                          ([str(tmp_path / "absent")], "false"),
                          ([str(tmp_path / "absent"), str(good)], "true")):
        s = nereid_server(repos, f"--strict-readiness={strict}", "--exit-on-error=false")
        assert requests.get(s.http_url + "/v2/health/live").status_code == 400
        assert requests.get(s.http_url + "/v2/health/ready").status_code == 400
        md = requests.get(s.http_url + "/v2").json()
        assert md["name"] == "triton"
        assert "failed to open model repository" in s.output()


def test_model_config_name(nereid_server, tmp_path):
    """--model-config-name=<name>: configs/<name>.pbtxt when the model has it,
    else config.pbtxt (Triton's L0_custom_model_config)."""
    model = tmp_path / "models" / "m"
    for d in ("1", "2", "configs"):
        (model / d).mkdir(parents=True)
    base = ('name: "m"\nbackend: "identity"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    (model / "config.pbtxt").write_text(base + "version_policy: { all { } }\n")
    (model / "configs" / "h100.pbtxt").write_text(
        base + "version_policy: { specific: { versions: [1] } }\n")
    repo = str(tmp_path / "models")
    for flag, want in (("h100", {"specific": {"versions": [1]}}),
                       ("h200", {"all": {}})):
        s = nereid_server(repo, f"--model-config-name={flag}")
        cfg = requests.get(s.http_url + "/v2/models/m/config").json()
        assert cfg["version_policy"] == want
        ready2 = requests.get(s.http_url + "/v2/models/m/versions/2/ready").status_code
        assert ready2 == (400 if flag == "h100" else 200)
    r = run(f"--model-repository={repo}", "--model-config-name=")
    assert r.returncode == 2 and "Error: empty argument for --model-config-name" in r.stderr
    r = run(f"--model-repository={repo}", "--model-config-name=../x")
    assert r.returncode == 2 and "must not contain '/'" in r.stderr


def test_unsupported_flags_are_refused():
    r = run("--model-repository", EXAMPLES, "--host-policy=gpu0,numa-node=0")
    assert r.returncode == 2 and "--host-policy is not supported" in r.stderr


def test_ignored_tuning_flags_warn_and_serve(nereid_server):
    s = nereid_server(EXAMPLES, "--buffer-manager-thread-count=2", "--log-info=false")
    assert requests.get(s.http_url + "/v2/health/live").status_code == 200
    out = s.output()
    assert "--buffer-manager-thread-count is accepted for Triton compatibility" in out
    assert "successfully loaded" not in out  # --log-info=false silences info lines


def test_backend_config_reaches_the_backend(nereid_server, tmp_path):
    # Triton's resolution: global settings, the backend's own over them,
    # sorted by setting, then default-max-batch-size when unset; the server
    # adds auto-complete-config, min-compute-capability, backend-directory.
    (tmp_path / "show" / "1").mkdir(parents=True)
    (tmp_path / "show" / "config.pbtxt").write_text(
        'backend: "testing" max_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
        'parameters { key: "show_backend_config" value { string_value: "true" } }\n')
    s = nereid_server(str(tmp_path), "--exit-on-error=false", "--strict-readiness=false",
                      "--backend-config=zeta=global", "--backend-config=testing,alpha=1",
                      "--backend-config=testing,zeta=own", "--backend-config=other,beta=2",
                      "--backend-config=testing,x=a=b")
    index = requests.post(s.http_url + "/v2/repository/index").json()
    reason = [m for m in index if m["name"] == "show"][0]["reason"]
    prefix = 'backend config {"cmdline":{"alpha":"1","auto-complete-config":"true",'
    assert prefix in reason, reason
    assert '"min-compute-capability":"6.000000","x":"a=b","zeta":"own",' \
           '"default-max-batch-size":"4"}}' in reason, reason
    assert '"backend-directory":"' in reason and "beta" not in reason


def test_backend_config_format_errors():
    r = run("--model-repository", EXAMPLES, "--backend-config=,a=b")
    assert r.returncode == 2 and "No backend specified. --backend-config option format is " \
        "<backend name>,<setting>=<value> or <setting>=<value>. Got ,a=b" in r.stderr
    for bad in ("onnxruntime,novalue", "onnxruntime,a=", "onnxruntime,=1", "plain"):
        r = run("--model-repository", EXAMPLES, f"--backend-config={bad}")
        assert r.returncode == 2 and "--backend-config option format is '<backend name>," \
            f"<setting>=<value>'. Got {bad}" in r.stderr, bad


def test_strict_model_config_deprecation_warnings(tmp_path):
    # Triton's texts (its L0_model_config cli_messages cases); a model
    # without config.pbtxt then fails to load under the strict setting.
    (tmp_path / "m" / "1").mkdir(parents=True)
    r = run(f"--model-repository={tmp_path}", "--strict-model-config=true", "--allow-grpc=false",
            "--http-port=0", "--allow-metrics=false")
    assert r.returncode == 1
    assert ("Warning: '--strict-model-config' has been deprecated! Please use "
            "'--disable-auto-complete-config' instead.") in r.stderr
    r = run(f"--model-repository={tmp_path}", "--disable-auto-complete-config",
            "--strict-model-config=false", "--allow-grpc=false", "--http-port=0",
            "--allow-metrics=false")
    assert r.returncode == 1
    assert ("Warning: Overriding deprecated '--strict-model-config' from False to True in favor "
            "of '--disable-auto-complete-config'!") in r.stderr
    # Triton's ReadTextProto text (L0_lifecycle greps it)
    assert (f"failed to open text file for read {tmp_path}/m/config.pbtxt: No such file or "
            "directory") in r.stderr


def test_port_collision_texts(nereid_server, tmp_path):
    """Triton's L0_lifecycle port collision checks: the second server logs
    "failed to start <X> service: Unavailable - Socket '<addr>:<port>' already
    in use" and exits."""
    a = nereid_server(EXAMPLES, "--model-control-mode=explicit")
    for flag, name, port in (("--grpc-port", "GRPC", a.grpc_port),
                             ("--http-port", "HTTP", a.http_port),
                             ("--metrics-port", "Metrics", a.metrics_port)):
        free = {"--grpc-port": 0, "--http-port": 0, "--metrics-port": 0}
        args = [f"--model-repository={EXAMPLES}", "--model-control-mode=explicit",
                "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                "--metrics-address=127.0.0.1"]
        for f in free:
            args.append(f"{f}={port}" if f == flag else f"{f}=0")
        r = run(*args)
        assert r.returncode == 1, r.stderr
        assert (f"failed to start {name} service: Unavailable - Socket '127.0.0.1:{port}' "
                "already in use") in r.stdout + r.stderr
