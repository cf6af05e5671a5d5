"""What the top-level part of Triton's qa/L0_backend_python/test.sh checks,
through the real binary, for the points Nereid once got wrong.

* A model repository named through a symbolic link keeps the path as given
  (Triton's init_args model compares args["model_repository"] with
  /opt/tritonserver/qa/..., and the missing-model.py error names the file
  under the path the user wrote).
"""
import os

import numpy as np
import pytest

from conftest import Server
from http_helpers import build_infer, infer
from test_python_backend import write

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
        server.stop()


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
        server.stop()
