"""What the top-level part of Triton's qa/L0_backend_python/test.sh checks,
through the real binary, for the points Nereid once got wrong.

* A model repository named through a symbolic link keeps the path as given
  (Triton's init_args model compares args["model_repository"] with
  /opt/tritonserver/qa/..., and the missing-model.py error names the file
  under the path the user wrote).
* DLPack: a BF16 tensor goes out as DLPack's bfloat16 and comes back as BF16
  (Triton's identity_bf16 model hands its input to torch through DLPack),
  and a small input (read-only message bytes in the worker) still exports.
* EXECUTION_ENV_PATH naming a conda-pack archive (the env sub-suite): it is
  extracted once, again when its mtime changes, removed at shutdown, and an
  archive whose members would land outside its directory is refused with
  Triton's (libarchive's) texts.
"""
import io
import os
import tarfile
import time

import numpy as np
import pytest

from conftest import Server
import requests

from http_helpers import build_infer, infer
from test_python_backend import write

def stop(server):
    """Stops the server; a clean exit only (sanitizer reports exit non-zero)."""
    rc = server.stop()
    with open(server.log_path) as f:
        assert rc == 0, f.read()


ARGS_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.repo = args["model_repository"]

    def execute(self, requests):
        out = np.array([self.repo.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPO", out)]) for _ in requests]
"""

ARGS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "REPO" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


def model_repository_arg(server, name):
    body, headers = build_infer([{"name": "IN", "datatype": "INT32",
                                  "data": np.array([1], np.int32)}])
    r = infer(server, name, body, headers)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][0]


@pytest.fixture
def linked_repo(tmp_path):
    real = tmp_path / "real" / "models"
    real.mkdir(parents=True)
    write(str(real), "args", ARGS_CONFIG.format(name="args"), ARGS_MODEL)
    link = tmp_path / "opt"
    link.symlink_to(tmp_path / "real")
    return str(real), str(link / "models")


@pytest.mark.parametrize("suffix", ["", "//"])
def test_model_repository_arg_keeps_the_path_as_given(linked_repo, suffix):
    """Through the symbolic link, less trailing slashes."""
    _, linked = linked_repo
    server = Server(linked + suffix, [])
    try:
        assert model_repository_arg(server, "args") == linked + "/args"
    finally:
        stop(server)


def test_missing_model_file_error_names_the_path_as_given(linked_repo):
    real, linked = linked_repo
    os.makedirs(os.path.join(real, "no_file", "1"))
    with open(os.path.join(real, "no_file", "config.pbtxt"), "w") as f:
        f.write(ARGS_CONFIG.format(name="no_file"))
    server = Server(linked, ["--exit-on-error=false", "--strict-readiness=false"])
    try:
        expected = ("Failed to preinitialize Python stub: Python model file not found in '"
                    + linked + "/no_file/1/model.py'")
        assert expected in server.output()
        assert "failed to load 'no_file'" in server.output()
    finally:
        stop(server)


DLPACK_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils
try:
    import torch
    import torch.utils.dlpack
except ImportError:
    torch = None

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "INPUT0")
            mode = pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0]
            if mode == 0:  # through numpy's DLPack import only
                res = pb_utils.Tensor.from_dlpack("OUTPUT0", t.to_dlpack())
            else:  # through torch, which reads the element type: doubled
                x = torch.utils.dlpack.from_dlpack(t.to_dlpack())
                assert x.dtype == {dtypes}[t.triton_dtype()], x.dtype
                res = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(x * 2))
            out.append(pb_utils.InferenceResponse([res]))
        return out
"""

DLPACK_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ -1 ] }},
        {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ -1 ] }} ]
"""

TORCH_DTYPES = "({14: torch.bfloat16, 11: torch.float32} if torch else {})"


@pytest.fixture(scope="module")
def dlpack_server(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("dlpack") / "models")
    for name, dtype in (("dl_bf16", "TYPE_BF16"), ("dl_fp32", "TYPE_FP32")):
        write(repo, name, DLPACK_CONFIG.format(name=name, dtype=dtype),
              DLPACK_MODEL.replace("{dtypes}", TORCH_DTYPES))
    server = Server(repo, [])
    yield server
    stop(server)


def dlpack_infer(server, model, datatype, words, mode):
    body, headers = build_infer(
        [{"name": "INPUT0", "datatype": datatype, "data": words, "binary": True},
         {"name": "MODE", "datatype": "INT32", "data": np.array([mode], np.int32)}],
        outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}}])
    r = infer(server, model, body, headers)
    assert r.status_code == 200, r.text
    header_len = int(r.headers["Inference-Header-Content-Length"])
    return np.frombuffer(r.content[header_len:], words.dtype)


# 4 elements arrive in the message itself, 1 Mi elements in a shared region
@pytest.mark.parametrize("n", [4, 1 << 20])
def test_dlpack_round_trip_keeps_bf16_and_small_inputs(dlpack_server, n):
    bf16_words = (np.arange(n) % 512 + 0x3F00).astype(np.uint16)
    out = dlpack_infer(dlpack_server, "dl_bf16", "BF16", bf16_words, 0)
    assert np.array_equal(out, bf16_words)
    fp32 = np.arange(n, dtype=np.float32)
    assert np.array_equal(dlpack_infer(dlpack_server, "dl_fp32", "FP32", fp32, 0), fp32)


@pytest.mark.parametrize("n", [4, 1 << 20])
def test_dlpack_bf16_reaches_torch_as_bfloat16(dlpack_server, n):
    torch = pytest.importorskip("torch")
    values = torch.tensor([1.5, -2.25, 3.0, 0.125] * (n // 4), dtype=torch.bfloat16)
    words = values.view(torch.int16).numpy().view(np.uint16)
    out = dlpack_infer(dlpack_server, "dl_bf16", "BF16", words, 1)
    doubled = (values * 2).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(out, doubled)
    fp32 = np.arange(n, dtype=np.float32)
    assert np.array_equal(dlpack_infer(dlpack_server, "dl_fp32", "FP32", fp32, 1), fp32 * 2)


ENV_MODEL = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = np.array([sys.executable.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPO", out)]) for _ in requests]
"""

ENV_PARAM = ('parameters { key: "EXECUTION_ENV_PATH" '
             'value { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')


def write_archive(path, members):
    """members: (name, kind, payload): "file" with bytes, "symlink" or
    "hardlink" with a target."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = payload
                tar.addfile(info)
            else:
                info.size, info.mode = len(payload), 0o644
                tar.addfile(info, io.BytesIO(payload))


def extractions(server):
    return server.output().count("Extracting Python execution env ")


def test_conda_pack_archive_is_extracted_once_and_again_when_changed(tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "env_tar", ARGS_CONFIG.format(name="env_tar") + ENV_PARAM, ENV_MODEL)
    archive = os.path.join(repo, "env_tar", "env.tar.gz")
    write_archive(archive, [("bin/python3", "symlink", "/usr/bin/python3"),
                            ("lib/README", "file", b"packed")])
    # another Python model keeps the backend (and its extractions) loaded
    # while env_tar is unloaded
    write(repo, "args", ARGS_CONFIG.format(name="args"), ARGS_MODEL)
    server = Server(repo, ["--log-verbose=1", "--model-control-mode=explicit",
                           "--load-model=env_tar", "--load-model=args"])
    try:
        python = model_repository_arg(server, "env_tar")
        env_dir = os.path.dirname(os.path.dirname(python))
        assert python.endswith("/bin/python3") and os.path.basename(
            os.path.dirname(env_dir)).startswith("python_env_"), python
        assert open(os.path.join(env_dir, "lib", "README"), "rb").read() == b"packed"
        assert f"Extracting Python execution env {archive}" in server.output()
        base = server.http_url + "/v2/repository/models/env_tar/"
        for touch, expected in ((False, 1), (True, 2)):
            if touch:
                later = time.time() + 5
                os.utime(archive, (later, later))
            assert requests.post(base + "unload", timeout=60).status_code == 200
            assert requests.post(base + "load", timeout=60).status_code == 200
            assert extractions(server) == expected
        assert model_repository_arg(server, "env_tar") == python
    finally:
        stop(server)
    assert not os.path.exists(os.path.dirname(env_dir))


@pytest.mark.parametrize("members,text", [
    ([("../zipslip_marker", "file")], "Path contains '..'"),
    ([("{tmp}/zipslip_marker", "file")], "Path is absolute"),
    ([("out", "symlink"), ("out/zipslip_marker", "file")], "Cannot extract through symlink"),
    ([("lib/x", "hardlink")], "Path is absolute"),  # a link to /etc/hostname
], ids=["dotdot", "absolute", "through_symlink", "absolute_hardlink"])
def test_conda_pack_archive_members_stay_inside(tmp_path, members, text):
    repo = str(tmp_path / "models")
    write(repo, "zipslip", ARGS_CONFIG.format(name="zipslip") + ENV_PARAM, ENV_MODEL)
    listed = [("bin/python3", "symlink", "/usr/bin/python3")]
    for name, kind in members:
        payload = {"file": b"escaped", "symlink": str(tmp_path), "hardlink": "/etc/hostname"}
        listed.append((name.format(tmp=tmp_path), kind, payload[kind]))
    write_archive(os.path.join(repo, "zipslip", "env.tar.gz"), listed)
    server = Server(repo, ["--exit-on-error=false", "--strict-readiness=false"])
    try:
        r = requests.get(server.http_url + "/v2/models/zipslip/ready", timeout=30)
        assert r.status_code != 200
        assert text in server.output(), server.output()
        assert not os.path.exists(tmp_path / "zipslip_marker")
        assert not [p for p in os.listdir("/tmp") if p == "zipslip_marker"]
    finally:
        stop(server)
