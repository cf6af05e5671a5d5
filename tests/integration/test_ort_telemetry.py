"""The ONNX Runtime library Nereid ships (the onnxruntime-node build) carries
Microsoft's telemetry client, which resolves its collector's host name a few
seconds after the library is loaded. The server turns it off with
ORT_DISABLE_TELEMETRY=1 unless the user set that variable; the server's
children (Python model workers) inherit its environment, which shows it.
"""
import os
import shutil

from conftest import EXAMPLES, Server


def worker_environ(server):
    """The environment of one of the server's child processes."""
    with open(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children") as f:
        kids = f.read().split()
    assert kids, "no Python worker process"
    with open(f"/proc/{kids[0]}/environ", "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)


def repo(tmp_path):
    path = str(tmp_path / "models")
    os.makedirs(path)
    for name in ("add_sub_onnx", "add_sub_python"):
        shutil.copytree(os.path.join(EXAMPLES, name), os.path.join(path, name))
    return path


def test_onnx_runtime_telemetry_is_off(tmp_path, monkeypatch):
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    s = Server(repo(tmp_path), [], "http")
    try:
        assert worker_environ(s).get(b"ORT_DISABLE_TELEMETRY") == b"1"
    finally:
        assert s.stop() == 0, s.output()


def test_the_users_setting_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ORT_DISABLE_TELEMETRY", "0")
    s = Server(repo(tmp_path), [], "http")
    try:
        assert worker_environ(s).get(b"ORT_DISABLE_TELEMETRY") == b"0"
    finally:
        assert s.stop() == 0, s.output()
