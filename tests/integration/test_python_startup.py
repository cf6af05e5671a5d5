"""Python backend start-up through the real binary: the zygote that forks
one worker per model instance, and the fresh interpreter it falls back to.

Each worker answers with its pid, its parent's pid and its open fds, so the
tests see who started it and what it holds.
"""
import json
import os
import signal
import time

import numpy as np
import pytest

from conftest import BUILD, Server
from http_helpers import build_infer, infer
from test_python_backend import write

WHO = """
import os
import signal
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for r in requests:
            mode = int(r.inputs()[0].as_numpy()[0])
            if mode == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == 2:
                os._exit(3)
            fds = [int(f) for f in os.listdir("/proc/self/fd")  # less listdir's own
                   if os.path.exists(f"/proc/self/fd/{f}")  # and spin-wait's: its page
                   and "nereid-python-spin" not in os.readlink(f"/proc/self/fd/{f}")
                   and os.readlink(f"/proc/self/fd/{f}") != "/proc/loadavg"]  # its load check
            info = np.array([os.getpid(), os.getppid(), len(fds), max(fds)], np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]))
        return out

    def finalize(self):
        print(f"who finalize {self.name} {os.getpid()}", flush=True)
"""

WHO_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "INFO" data_type: TYPE_INT64 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""


def who(server, model="who", mode=0):
    body, headers = build_infer([{"name": "MODE", "datatype": "INT32",
                                  "data": np.array([mode], np.int32)}])
    r = infer(server, model, body, headers)
    if r.status_code != 200:
        return r
    return r.json()["outputs"][0]["data"]


def ppid(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def zygotes(server_pid):
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_zygote(int(p), server_pid)]


def _is_zygote(pid, server_pid):
    try:
        return ppid(pid) == server_pid and b"nereid_python_zygote" in cmdline(pid)
    except OSError:
        return False


def gone(pid, timeout=30):
    deadline = time.time() + timeout
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.02)
    return not os.path.exists(f"/proc/{pid}")


@pytest.fixture
def repo(tmp_path):
    path = str(tmp_path / "models")
    write(path, "who", WHO_CONFIG.format(name="who", count=2, extra=""), WHO)
    write(path, "who1", WHO_CONFIG.format(name="who1", count=1, extra=""), WHO)
    return path


def output(s):
    with open(s.log_path) as f:
        return f.read()


def test_workers_are_forked_by_one_zygote(repo):
    s = Server(repo, [], "http")
    try:
        zs = zygotes(s.proc.pid)
        assert len(zs) == 1, zs
        pid, parent, n_fds, max_fd = who(s)
        assert parent == zs[0]
        # the worker holds stdin/out/err and its socket, nothing of the
        # zygote's or the server's
        assert (n_fds, max_fd) == (4, 3)
        stub = os.path.join(BUILD, "backends", "python", "nereid_python_stub.py").encode()
        assert stub in cmdline(zs[0])
        # it reads like a spawned worker's (pgrep -f triton_python_backend_stub)
        assert cmdline(pid)[2:4] == [stub, b"triton_python_backend_stub"]
        assert cmdline(pid)[4] in (b"who_0_0", b"who_0_1")
    finally:
        assert s.stop() == 0, output(s)
    out = output(s)
    # finalize ran in both forked instances; nothing outlives the server
    assert "who finalize who_0_0" in out and "who finalize who_0_1" in out
    assert gone(zs[0]) and gone(pid)


@pytest.mark.parametrize("mode", [1, 2], ids=["sigkill", "exit"])
def test_crash_of_a_forked_worker_is_contained(repo, mode):
    s = Server(repo, [], "http")
    try:
        z = zygotes(s.proc.pid)[0]
        old = who(s, "who1")[0]
        r = who(s, "who1", mode)
        assert r.status_code == 500
        assert r.json()["error"].startswith("Stub process 'who1_0_0'")
        pid, parent, _, _ = who(s, "who1")
        # the dead worker was reaped (no zombie) and a new one forked by the
        # same zygote serves the instance
        assert parent == z
        assert gone(old)
        fds = len(os.listdir(f"/proc/{s.proc.pid}/fd"))
        zfds = len(os.listdir(f"/proc/{z}/fd"))
        pids = {pid}
        for _ in range(6):
            assert who(s, "who1", mode).status_code == 500
            pids.add(who(s, "who1")[0])
        # neither the server nor the zygote gains fds with restarts
        assert len(os.listdir(f"/proc/{s.proc.pid}/fd")) <= fds + 3
        assert len(os.listdir(f"/proc/{z}/fd")) == zfds
        # only the current worker is left: the others were reaped, not zombies
        assert [p for p in pids if os.path.exists(f"/proc/{p}")] == [who(s, "who1")[0]]
        assert "restarted the worker of 'who1_0_0'" in s.output()
    finally:
        assert s.stop() == 0, output(s)
    assert gone(z)


def test_killing_the_servers_children_ends_the_workers(repo):
    """Triton's L0_backend_python/restart kills the server's child processes
    (kill -9 $(pgrep --parent $SERVER_PID)): the forked workers die with the
    zygote, and the next request is served by a worker of a new zygote
    (started when the death is seen)."""
    s = Server(repo, [], "http")
    try:
        z = zygotes(s.proc.pid)[0]
        old = who(s, "who1")[0]
        for p in os.listdir("/proc"):
            if p.isdigit() and os.path.exists(f"/proc/{p}") and _ppid_or_0(int(p)) == s.proc.pid:
                os.kill(int(p), signal.SIGKILL)
        assert gone(old)
        pid, parent, _, _ = who(s, "who1")
        assert pid != old
        assert gone(z)
        assert zygotes(s.proc.pid) == [parent] and parent != z
        assert "restarted the worker of 'who1_0_0'" in output(s)
    finally:
        assert s.stop() == 0, output(s)


def _ppid_or_0(pid):
    try:
        return ppid(pid)
    except OSError:
        return 0


def test_zygote_false_starts_fresh_interpreters(repo):
    s = Server(repo, ["--backend-config=python,zygote=false"], "http")
    try:
        assert zygotes(s.proc.pid) == []
        pid, parent, n_fds, max_fd = who(s)
        assert parent == s.proc.pid
        assert (n_fds, max_fd) == (4, 3)
    finally:
        assert s.stop() == 0, output(s)
    assert "who finalize who_0_0" in output(s)
    assert gone(pid)


def test_zygote_flag_value_is_checked(repo):
    s = Server(repo, ["--backend-config=python,zygote=sometimes", "--exit-on-error=false"],
               "http")
    try:
        r = who(s)
        assert r.status_code != 200
        assert "zygote must be 'true' or 'false', got 'sometimes'" in s.output()
    finally:
        s.stop()


def test_execution_env_path_is_not_forked(repo, tmp_path):
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", env / "bin" / "python3")
    extra = ('parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }' % env)
    write(repo, "who_env", WHO_CONFIG.format(name="who_env", count=1, extra=extra), WHO)
    s = Server(repo, [], "http")
    try:
        pid, parent, _, _ = who(s, "who_env")
        assert parent == s.proc.pid  # another interpreter: a fresh process
        assert cmdline(pid)[0] == str(env / "bin" / "python3").encode()
        assert ppid(who(s)[0]) in zygotes(s.proc.pid)  # the other model still forks
    finally:
        assert s.stop() == 0, output(s)


PREFAULTED = """
import json
import os
import sys
import numpy as np

INITS = 0


class TritonPythonModel:
    def initialize(self, args):
        global INITS
        INITS += 1
        import nereid_stub as stub
        page = os.sysconf("SC_PAGE_SIZE")
        written = [r for r in stub._prefaulted if r[2] == 23]  # MADV_POPULATE_WRITE
        pages = own = 0
        with open("/proc/self/pagemap", "rb") as f:
            for addr, length, _ in written:
                f.seek(addr // page * 8)
                pm = np.frombuffer(f.read(length // page * 8), np.uint64)
                pages += pm.size
                # present, anonymous, mapped only here: this worker's copy
                own += int(np.count_nonzero((pm >> np.uint64(63)) & (pm >> np.uint64(56)) & 1
                                            & ~(pm >> np.uint64(61)) & 1))
        out = json.loads(args["model_config"])["parameters"]["OUT"]["string_value"]
        name = args["model_instance_name"]
        with open(os.path.join(out, name), "w") as f:
            json.dump({"ranges": len(stub._prefaulted), "pages": pages, "own": own,
                       "cleared": stub._prefault is None, "inits": INITS,
                       "pid": os.getpid()}, f)

    def execute(self, requests):
        raise NotImplementedError
"""


def write_prefaulted(path, name, count, out):
    extra = 'parameters { key: "OUT" value: { string_value: "%s" } }' % out
    write(path, name, WHO_CONFIG.format(name=name, count=count, extra=extra), PREFAULTED)


def prefault_infos(out):
    infos = {}
    for name in os.listdir(out):
        with open(os.path.join(out, name)) as f:
            infos[name] = json.load(f)
    return infos


def _kernel_at_least(major, minor):
    v = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    return v >= (major, minor)


def forked_infos(tmp_path):
    """What each instance of a 2-instance PREFAULTED model saw in
    initialize; each was forked by the zygote, and initialize ran once in
    each with that instance's args."""
    path, out = str(tmp_path / "models"), tmp_path / "out"
    out.mkdir()
    write_prefaulted(path, "pf", 2, out)
    s = Server(path, [], "http")
    try:
        infos = prefault_infos(out)
        assert sorted(infos) == ["pf_0_0", "pf_0_1"]
        for info in infos.values():
            assert info["inits"] == 1
            assert ppid(info["pid"]) in zygotes(s.proc.pid)
    finally:
        assert s.stop() == 0, output(s)
    return infos.values()


@pytest.mark.skipif(not _kernel_at_least(5, 14), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_forked_workers_are_prefaulted(tmp_path):
    """The zygote learns from a probe worker which pages a worker writes and
    each forked worker copies them in one madvise per run: every page of
    those runs is the worker's own when the model initializes, and a fork
    of the model's own does not repeat it."""
    for info in forked_infos(tmp_path):
        assert info["ranges"] > 0 and info["pages"] > 0
        assert info["own"] == info["pages"]
        assert info["cleared"]


def test_prefault_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("NEREID_PYTHON_PREFAULT", "0")
    for info in forked_infos(tmp_path):
        assert (info["ranges"], info["pages"]) == (0, 0)
