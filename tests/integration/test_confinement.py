"""Files a model configuration names are read only from inside the model's
directory, only when regular and within a size bound: label_filename,
initial_state data_file, warmup input_data_file, default_model_filename and
runtime, sent through the repository load API (config and file: overrides)
or found in the repository; refused loads answer 400 and leave their reason
in the repository index."""
import base64
import json
import os

import requests

F4 = {"data_type": "TYPE_FP32", "dims": [4]}
SECRET = b"root:x:0:0:TOPSECRET\n"
UP = "../" * 12  # more than enough to climb from any model directory to /


def plain_config(**extra):
    cfg = {"backend": "testing", "max_batch_size": 8,
           "input": [{"name": "INPUT0", **F4}],
           "output": [{"name": "OUTPUT0", **F4}]}
    cfg.update(extra)
    return cfg


def labelled(label_filename):
    return plain_config(output=[{"name": "OUTPUT0", **F4, "label_filename": label_filename}])


def state_config(data_file):
    return {"backend": "accumulator", "max_batch_size": 4,
            "parameters": {"mode": {"string_value": "state"}},
            "input": [{"name": "INPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "OUTPUT", "data_type": "TYPE_INT32", "dims": [1]}],
            "sequence_batching": {"state": [{
                "input_name": "INPUT_STATE", "output_name": "OUTPUT_STATE",
                "data_type": "TYPE_INT32", "dims": [-1],
                "initial_state": [{"data_type": "TYPE_INT32", "dims": [1],
                                  "data_file": data_file, "name": "seed"}]}]}}


def warmup_config(input_data_file):
    return plain_config(model_warmup=[{
        "name": "w", "batch_size": 1,
        "inputs": {"INPUT0": {**F4, "input_data_file": input_data_file}}}])


def make_repo(tmp_path):
    """A repository with one empty model directory 'm' and a secret outside it."""
    repo = tmp_path / "models"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "config.pbtxt").write_text(
        'backend: "testing" max_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    return str(repo), str(secret)


def load(s, cfg, name="m", **files):
    params = {"config": json.dumps(cfg)}
    for rel, data in files.items():
        params["file:" + rel] = base64.b64encode(data).decode()
    return requests.post(f"{s.http_url}/v2/repository/models/{name}/load",
                         json={"parameters": params}, timeout=20)


def index_row(s, name="m"):
    r = requests.post(f"{s.http_url}/v2/repository/index", timeout=10)
    return next(m for m in r.json() if m["name"] == name)


def row_state(s, name="m"):
    return index_row(s, name)["state"]


def refused(s, cfg, want, name="m", **files):
    r = load(s, cfg, name, **files)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert want in err, err
    assert "TOPSECRET" not in err
    return err


def test_label_file_escapes_refused(nereid_server, tmp_path):
    repo, secret = make_repo(tmp_path)
    os.symlink(secret, os.path.join(repo, "m", "abs_link.txt"))
    os.symlink("../../secret.txt", os.path.join(repo, "m", "rel_link.txt"))
    os.symlink("/dev/zero", os.path.join(repo, "m", "zero"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    err = refused(s, labelled(UP + secret.lstrip("/")), "is outside model directory")
    assert err.startswith("load failed for model 'm': version 1 is at UNAVAILABLE state: "
                          "Unsupported: label file path '")
    assert "for output 'OUTPUT0' in model 'm' is outside model directory" in err
    row = index_row(s)
    assert row["state"] == "UNAVAILABLE" and "is outside model directory" in row["reason"]
    refused(s, labelled(secret), "is outside model directory")
    refused(s, labelled("abs_link.txt"), "is outside model directory")
    refused(s, labelled("rel_link.txt"), "is outside model directory")
    refused(s, labelled("1/../../secret.txt"), "is outside model directory")
    refused(s, labelled("zero"), "is outside model directory")
    refused(s, labelled(UP + "dev/zero"), "is outside model directory")
    # the same through a file: override (a temporary model directory)
    refused(s, labelled(UP + secret.lstrip("/")), "is outside model directory",
            **{"1/x": b""})
    # Triton's rule (core #465) is about where the path ends: a '..' that
    # stays inside the model directory is fine.
    with open(os.path.join(repo, "m", "labels.txt"), "w") as f:
        f.write("a\nb\nc\nd\n")
    r = load(s, labelled("1/../labels.txt"))
    assert r.status_code == 200, r.text


def test_label_file_non_regular_large_or_nul_refused(nereid_server, tmp_path):
    repo, _ = make_repo(tmp_path)
    mdir = os.path.join(repo, "m")
    os.mkfifo(os.path.join(mdir, "fifo"))
    os.mkdir(os.path.join(mdir, "adir"))
    with open(os.path.join(mdir, "huge.txt"), "wb") as f:
        f.truncate((4 << 20) + 1)  # sparse: one byte over the 4 MiB bound
    with open(os.path.join(mdir, "nul.txt"), "wb") as f:
        f.write(b"cat\ndog\x00junk\n")
    with open(os.path.join(mdir, "labels.txt"), "w") as f:
        f.write("cat\r\ndog\n\nbird")
    os.symlink("labels.txt", os.path.join(mdir, "link.txt"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    refused(s, labelled("huge.txt"), "is 4194305 bytes, more than the limit of 4194304 bytes")
    refused(s, labelled("nul.txt"), "contains a NUL byte")
    refused(s, labelled("fifo"), "is not a regular file")
    refused(s, labelled("adir"), "is not a regular file")
    refused(s, labelled("missing.txt"), "No such file or directory")
    # files inside the model directory, symlinks among them, still work
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                        "data": [0, 1, 2, 3]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 4}}]}
    for name in ("labels.txt", "link.txt", "1/../labels.txt"):
        r = load(s, labelled(name))
        assert r.status_code == 200, r.text
        r = requests.post(f"{s.http_url}/v2/models/m/infer", json=body, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == ["3.000000:3:bird", "2.000000:2:",
                                                  "1.000000:1:dog", "0.000000:0:cat"]
    r = load(s, labelled("labels.txt"), **{"labels.txt": b"a\nb\nc\nd\n", "1/x": b""})
    assert r.status_code == 200, r.text


def make_data_dir(tmp_path, folder, data):
    """make_repo with m/<folder>/ holding 'link' (to the secret), 'fifo' and 'data'."""
    repo, secret = make_repo(tmp_path)
    d = os.path.join(repo, "m", folder)
    os.mkdir(d)
    os.symlink(secret, os.path.join(d, "link"))
    os.mkfifo(os.path.join(d, "fifo"))
    with open(os.path.join(d, "data"), "wb") as f:
        f.write(data)
    return repo, secret


def test_initial_state_data_file_confined(nereid_server, tmp_path):
    repo, secret = make_data_dir(tmp_path, "initial_state",
                                 (1000).to_bytes(4, "little") + b"\xff" * 4096)
    s = nereid_server(repo, "--model-control-mode=explicit")
    err = refused(s, state_config(UP + secret.lstrip("/")), "is outside model directory")
    assert "initial_state data_file '" in err and "for state 'INPUT_STATE' in model 'm'" in err
    refused(s, state_config("link"), "is outside model directory")
    refused(s, state_config("fifo"), "is not a regular file")
    # a file larger than the state is read up to the state's size (as Triton)
    r = load(s, state_config("data"))
    assert r.status_code == 200, r.text
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
            "parameters": {"sequence_id": 7, "sequence_start": True, "sequence_end": True}}
    r = requests.post(f"{s.http_url}/v2/models/m/infer", json=body, timeout=10)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1001], r.text


def test_warmup_data_file_confined(nereid_server, tmp_path):
    repo, secret = make_data_dir(tmp_path, "warmup", b"\0" * 64)
    s = nereid_server(repo, "--model-control-mode=explicit")
    err = refused(s, warmup_config("link"), "is outside model directory")
    assert "warmup input_data_file '" in err and "for input 'INPUT0' in model 'm'" in err
    refused(s, warmup_config("fifo"), "is not a regular file")
    refused(s, warmup_config(UP + secret.lstrip("/")), "is outside model directory")
    assert load(s, warmup_config("data")).status_code == 200


def test_model_filename_and_runtime_confined(nereid_server, tmp_path):
    repo, secret = make_repo(tmp_path)
    mdir = os.path.join(repo, "m")
    os.mkdir(os.path.join(mdir, "dummy_runtime"))
    open(os.path.join(mdir, "dummy_runtime", "libtriton_identity.so"), "w").close()
    os.symlink(secret, os.path.join(mdir, "1", "model.link"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    refused(s, plain_config(default_model_filename=UP + secret.lstrip("/")),
            "default_model_filename '" + UP)
    refused(s, plain_config(default_model_filename="model.link"),
            "default_model_filename 'model.link' for model 'm' is outside model directory")
    refused(s, plain_config(cc_model_filenames={"7.5": "../../x"}),
            "cc_model_filenames '../../x' for model 'm' is outside model directory")
    refused(s, plain_config(runtime="../dummy_runtime/libtriton_identity.so"),
            "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend "
            f"directory '{mdir}/1', for model 'm', check model config runtime field")
    # a runtime climbing out is refused the same way whether its target exists or not
    for target in ("etc/passwd", "etc/no_such_file_here"):
        refused(s, plain_config(runtime=UP + target),
                f"escapes backend directory '{mdir}/1', for model 'm'")
    refused(s, plain_config(runtime="__invalid_runtime__"),
            "unable to find backend library '__invalid_runtime__' for model 'm'")
    assert load(s, plain_config(runtime="libtriton_testing.so")).status_code == 200
    assert load(s, plain_config(default_model_filename="model.bin")).status_code == 200


def test_instance_count_bounds(nereid_server, tmp_path):
    repo, _ = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")

    def groups(*counts):
        return plain_config(instance_group=[{"count": n, "kind": "KIND_CPU"} for n in counts])

    for count in (-1, 100000, 2**31 - 1):
        err = refused(s, groups(count), f"instance group m_0 of model m has count {count}, "
                                        "expected a count from 1 to 256")
        assert row_state(s) == "UNAVAILABLE", err
    refused(s, groups(200, 57), "instance group m_1 of model m brings the model to 257 "
                                "instances, more than the limit of 256")
    r = load(s, groups(0))  # 0 is proto3's unset: the default count
    assert r.status_code == 200, r.text
    cfg = requests.get(f"{s.http_url}/v2/models/m/config", timeout=10).json()
    assert cfg["instance_group"][0]["count"] == 1


def test_sequence_tensor_named_like_an_input_refused(nereid_server, tmp_path):
    repo, _ = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    start = {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START",
                                           "int32_false_true": [0, 1]}]}
    cfg = state_config("seed")
    del cfg["sequence_batching"]["state"][0]["initial_state"]
    cfg["input"].append({"name": "START", "data_type": "TYPE_INT32", "dims": [1]})
    cfg["sequence_batching"]["control_input"] = [start]
    refused(s, cfg, "sequence batching control tensor 'START' has the name of a model input "
                    "for m; control tensors are set by the sequence batcher")
    cfg["input"][1]["name"] = "INPUT_STATE"
    refused(s, cfg, "sequence batching state input name 'INPUT_STATE' has the name of a model "
                    "input for m")
    del cfg["input"][1]
    assert load(s, cfg).status_code == 200


def test_onnx_autofill_leaves_sequence_tensors_out_of_inputs(nereid_server, tmp_path):
    """Autofill lists only the inputs a client sends: control and state
    tensors, which the sequence batcher sets, stay out of 'input'."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_models
    repo, _ = make_repo(tmp_path)
    mdir = os.path.join(repo, "acc")
    os.makedirs(os.path.join(mdir, "1"))
    with open(os.path.join(mdir, "1", "model.onnx"), "wb") as f:
        f.write(make_models.accumulator().SerializeToString())
    with open(os.path.join(mdir, "config.pbtxt"), "w") as f:
        f.write('platform: "onnxruntime_onnx" max_batch_size: 8\n'
                'sequence_batching { control_input [ { name: "START" control [ {\n'
                '  kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]\n'
                '  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE"\n'
                '            data_type: TYPE_INT32 dims: [ -1 ] } ] }\n')
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=acc")
    cfg = requests.get(f"{s.http_url}/v2/models/acc/config", timeout=10).json()
    assert [i["name"] for i in cfg["input"]] == ["INPUT"]
    body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [5]}],
            "parameters": {"sequence_id": 3, "sequence_start": True}}
    for want in ([5], [10]):
        r = requests.post(f"{s.http_url}/v2/models/acc/infer", json=body, timeout=10)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == want, r.text
        body["parameters"]["sequence_start"] = False


def test_server_made_tensors_bounded(nereid_server, tmp_path):
    """Warmup inputs and sequence states the server allocates itself are
    bounded (1 GiB): absurd dims fail the load instead of the server."""
    repo, _ = make_repo(tmp_path)
    s = nereid_server(repo, "--model-control-mode=explicit")
    cfg = warmup_config("unused")
    cfg["model_warmup"][0]["inputs"]["INPUT0"] = {"data_type": "TYPE_FP32",
                                                  "dims": [4000000000000], "zero_data": True}
    refused(s, cfg, "model warmup input 'INPUT0' of setting 'w' needs more than the limit of "
                    "1073741824 bytes for m")
    cfg = state_config("unused")
    cfg["sequence_batching"]["state"][0]["initial_state"][0].update(
        {"dims": [2**40], "zero_data": True})
    del cfg["sequence_batching"]["state"][0]["initial_state"][0]["data_file"]
    refused(s, cfg, "initial state 'seed' needs more than the limit of 1073741824 bytes for m")
    del cfg["sequence_batching"]["state"][0]["initial_state"]
    cfg["sequence_batching"]["state"][0]["dims"] = [2**31, 2**31]
    refused(s, cfg, "sequence batching state 'INPUT_STATE' needs more than the limit")
    assert requests.get(f"{s.http_url}/v2/health/live", timeout=10).status_code == 200


def test_backend_name_is_not_a_path(nereid_server, tmp_path):
    """A backend name with '/' could point the loader at any library, e.g.
    one uploaded with a model: it is refused like an unknown backend."""
    import shutil
    from conftest import BUILD
    repo, _ = make_repo(tmp_path)
    mdir = os.path.join(repo, "m")
    os.makedirs(os.path.join(mdir, "x", "libnereid_.."))
    shutil.copy(os.path.join(BUILD, "backends", "libnereid_identity.so"),
                os.path.join(mdir, "x.so"))
    s = nereid_server(repo, "--model-control-mode=explicit")
    name = UP + mdir.lstrip("/") + "/x"
    cfg = plain_config(backend=name)
    refused(s, cfg, f"unable to find backend library for backend '{name}', try specifying "
                    "runtime on the model configuration.")
    for name in ("..", ".", "identity/../identity"):
        refused(s, plain_config(backend=name), "unable to find backend library for backend")
