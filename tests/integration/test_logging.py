"""Triton's logging extension (/v2/logging, LogSettings). Trace settings are
in test_trace.py."""
import json
import os
import re
import subprocess

import grpc
import pytest
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import stubs

pb, pbg, _, _ = stubs()

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}

@pytest.fixture
def server(nereid_server):
    return nereid_server(EXAMPLES, "--model-control-mode=explicit")


def post(s, path, body):
    return requests.post(s.http_url + path, json=body, timeout=10)


def load(s, model):
    r = requests.post(f"{s.http_url}/v2/repository/models/{model}/load", timeout=60)
    assert r.status_code == 200, r.text


def test_http_get_and_metadata(server):
    r = requests.get(server.http_url + "/v2/logging", timeout=10)
    assert r.status_code == 200
    assert r.json() == DEFAULTS
    assert list(r.json()) == list(DEFAULTS)  # Triton's key order
    assert "logging" in requests.get(server.http_url + "/v2", timeout=10).json()["extensions"]


def test_http_set_partial_and_null_means_no_change(server):
    r = post(server, "/v2/logging", {"log_warning": False, "log_verbose_level": 2,
                                     "log_info": None, "log_file": None})
    assert r.status_code == 200, r.text
    want = dict(DEFAULTS, log_warning=False, log_verbose_level=2)
    assert r.json() == want
    assert requests.get(server.http_url + "/v2/logging", timeout=10).json() == want


def test_log_info_false_silences_info_lines(server):
    assert post(server, "/v2/logging", {"log_info": False}).status_code == 200
    load(server, "add_sub")
    assert "successfully loaded 'add_sub'" not in server.output()
    assert post(server, "/v2/logging", {"log_info": True}).status_code == 200
    load(server, "identity_fp32")
    assert "successfully loaded 'identity_fp32'" in server.output()


def test_iso8601_format_applies_at_runtime(server):
    r = post(server, "/v2/logging", {"log_format": "ISO8601"})
    assert r.status_code == 200 and r.json()["log_format"] == "ISO8601"
    load(server, "add_sub")
    line = [ln for ln in server.output().splitlines() if "successfully loaded 'add_sub'" in ln]
    assert len(line) == 1
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ ", line[0]), line[0]


@pytest.mark.parametrize("body,status,text", [
    ({"log_file": "/tmp/x.log"}, 501,
     "log file location can not be updated through network protocol"),
    ({"log_format": "json"}, 503, "invalid argument for --log_format, got: json"),
    ({"log_info": "yes"}, 400, "log_info"),
    ({"log_verbose_level": -1}, 400, "log_verbose_level"),
    ({"log_verbose_level": 1.5}, 400, "log_verbose_level"),
    ({"log_format": 3}, 400, "log_format"),
    ([1, 2], 400, "JSON object"),
])
def test_http_errors_change_nothing(server, body, status, text):
    r = post(server, "/v2/logging", body)
    assert r.status_code == status, r.text
    assert text in r.json()["error"]
    assert requests.get(server.http_url + "/v2/logging", timeout=10).json() == DEFAULTS


def test_http_bad_json_and_method(server):
    r = requests.post(server.http_url + "/v2/logging", data=b"{nope", timeout=10)
    # Same as the other JSON bodies (parse_body_json in http_handlers.c).
    assert r.status_code in (400, 500) and "failed to parse" in r.json()["error"]
    r = requests.post(server.http_url + "/v2/logging", data=b"", timeout=10)
    assert r.status_code == 400 and "JSON object" in r.json()["error"]
    r = requests.put(server.http_url + "/v2/logging", data=b"{}", timeout=10)
    assert r.status_code == 405


def _sv(**kw):
    return pb.LogSettingsRequest.SettingValue(**kw)


def test_grpc_log_settings(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        r = stub.LogSettings(pb.LogSettingsRequest())
        got = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.settings.items()}
        assert got == DEFAULTS
        req = pb.LogSettingsRequest()
        req.settings["log_error"].CopyFrom(_sv(bool_param=False))
        req.settings["log_verbose_level"].CopyFrom(_sv(uint32_param=3))
        req.settings["log_format"].CopyFrom(_sv(string_param="ISO8601"))
        req.settings["log_info"].CopyFrom(_sv())  # no value: no change
        r = stub.LogSettings(req)
        got = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in r.settings.items()}
        assert got == dict(DEFAULTS, log_error=False, log_verbose_level=3, log_format="ISO8601")
        # Shared with HTTP: one process-wide log.
        assert requests.get(server.http_url + "/v2/logging", timeout=10).json() == got
        cases = [("log_file", _sv(string_param="/tmp/x"), grpc.StatusCode.UNIMPLEMENTED,
                  "log file location can not be updated through network protocol"),
                 ("log_format", _sv(string_param="xml"), grpc.StatusCode.UNAVAILABLE,
                  "invalid argument for --log_format, got: xml"),
                 ("log_info", _sv(uint32_param=1), grpc.StatusCode.INVALID_ARGUMENT, "log_info")]
        for key, val, code, text in cases:
            req = pb.LogSettingsRequest()
            req.settings[key].CopyFrom(val)
            with pytest.raises(grpc.RpcError) as e:
                stub.LogSettings(req)
            assert e.value.code() == code and text in e.value.details()


def test_cli_log_format(nereid_server):
    s = nereid_server(EXAMPLES, "--log-format=ISO8601", "--model-control-mode=explicit",
                      "--load-model=add_sub")
    assert requests.get(s.http_url + "/v2/logging", timeout=10).json()["log_format"] == "ISO8601"
    line = [ln for ln in s.output().splitlines() if "successfully loaded 'add_sub'" in ln]
    assert line and re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I ", line[0]), line
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}", "--log-format=xml"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert "invalid argument for --log_format, got: xml" in p.stderr


RECORD = re.compile(r"^(?P<level>[IWE])(?P<month>\d{2})(?P<day>\d{2}) "
                    r"\d{2}:\d{2}:\d{2}\.\d{6} (?P<pid>\d+) (?P<file>[\w\.]+):(?P<line>\d+)\] "
                    r"(?P<message>.*)$")
FORGED = 'I0205 18:34:18.707423 1 file.cc:123] "THIS ENTRY WAS INJECTED"'


def _forge_attempt(s):
    # Triton's L0_logging log_format_test: a client-chosen input name that
    # carries a whole log record after a newline.
    body = {"inputs": [{"name": f"\n{FORGED}\n{FORGED}", "datatype": "FP32", "shape": [1],
                        "data": [1.0]}]}
    r = requests.post(f"{s.http_url}/v2/models/identity_fp32/infer", json=body, timeout=10)
    assert r.status_code == 400


def test_log_file_records_in_triton_format(nereid_server, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", raising=False)
    log = tmp_path / "server.log"
    s = nereid_server(EXAMPLES, f"--log-file={log}", "--log-verbose=1",
                      "--model-control-mode=explicit", "--load-model=identity_fp32")
    assert requests.get(s.http_url + "/v2/logging", timeout=10).json()["log_file"] == str(log)
    _forge_attempt(s)
    assert "successfully loaded" not in s.output()  # records go to the file only
    assert s.stop() == 0
    lines = log.read_text().splitlines()
    assert any("successfully loaded 'identity_fp32'" in ln for ln in lines)
    assert any("Started HTTPService at" in ln for ln in lines)
    assert any("Infer failed: " in ln for ln in lines)  # verbose, as Triton's HTTP frontend
    for ln in lines:  # one record per line, its message a JSON string
        if ln.startswith(("+", "|")):
            continue  # Triton's startup model table, unescaped (every line '+' or '|')
        m = RECORD.match(ln)
        assert m, ln
        if m.group("file") == "model_table.c":
            assert m.group("message") == "", ln  # the table follows on the next lines
            continue
        assert isinstance(json.loads(m.group("message")), str), ln
    assert FORGED not in lines


def test_unescaped_log_messages(nereid_server, tmp_path, monkeypatch):
    # TRITON_SERVER_ESCAPE_LOG_MESSAGES=0: messages as they are (Triton's
    # switch; a forged record then shows up as a line of its own).
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    log = tmp_path / "server.log"
    s = nereid_server(EXAMPLES, f"--log-file={log}", "--log-verbose=1", "--log-format=ISO8601",
                      "--model-control-mode=explicit", "--load-model=identity_fp32")
    _forge_attempt(s)
    assert s.stop() == 0
    lines = log.read_text().splitlines()
    loaded = [ln for ln in lines if "successfully loaded 'identity_fp32'" in ln]
    assert len(loaded) == 1
    # Triton's OnLoadFinal line: one per load, no version
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ [\w\.]+:\d+\] successfully loaded "
                    r"'identity_fp32'$", loaded[0]), loaded[0]
    assert FORGED in lines


def test_log_file_that_can_not_be_opened(tmp_path):
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}",
                        f"--log-file={tmp_path}/no/such/dir/x.log"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert f"failed to open log file '{tmp_path}/no/such/dir/x.log'" in p.stderr
