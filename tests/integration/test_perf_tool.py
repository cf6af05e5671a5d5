"""build/nereid-perf, the load tool (tools/perf/), against a real server: every
level sends exactly the requests asked for (count windows), the server's
statistics grow by exactly those requests, the CSV parses, JSON and binary
inputs, batches, request-rate mode, inputs from files, and clear errors.
No timing is asserted."""
import csv
import os
import socket
import subprocess
import time

import pytest
import requests

from conftest import BUILD

PERF = os.path.join(BUILD, "nereid-perf")


def perf(*args, timeout=120):
    return subprocess.run([PERF, *args], capture_output=True, text=True, timeout=timeout)


def run_csv(server, tmp_path, *args, protocol="http"):
    out = tmp_path / "out.csv"
    url = server.http_url if protocol == "http" else server.grpc_addr
    r = perf("-u", url, "-i", protocol, "--measurement-mode", "count_windows", "-f", str(out), *args)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out, newline="") as f:
        return list(csv.DictReader(f)), r.stdout


@pytest.fixture
def server(nereid_server, model_repo):
    """A server with the two models the tests drive, both ports open."""
    model_repo.add("add_sub")
    model_repo.add("identity_fp32")
    model_repo.add("accumulator_direct")
    s = nereid_server(model_repo.path)
    wait_grpc(s)
    return s


def wait_grpc(server):
    deadline = time.time() + 30  # the gRPC port opens a moment after the HTTP one
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", server.grpc_port)) == 0:
                return
        assert time.time() < deadline, server.output()
        time.sleep(0.02)


def stats(server, model):
    r = requests.get(f"{server.http_url}/v2/models/{model}/stats", timeout=10)
    return r.json()["model_stats"][0]["inference_stats"]["success"]["count"]


@pytest.mark.parametrize("protocol,fmt", [("http", "binary"), ("http", "json"),
                                          ("grpc", "binary")])
def test_concurrency_sweep_counts(server, tmp_path, protocol, fmt):
    s = server
    before = stats(s, "add_sub")
    rows, out = run_csv(s, tmp_path, "-m", "add_sub", "--concurrency-range", "1:5:2",
                        "--measurement-request-count", "30", "--input-tensor-format", fmt,
                        "--output-tensor-format", fmt, protocol=protocol)
    assert [row["Concurrency"] for row in rows] == ["1", "3", "5"]
    for row in rows:
        assert row["Client Requests"] == "30" and row["Client Failures"] == "0"
        # the delta of the statistics extension over the level
        assert row["Server Requests"] == "30" and row["Server Failures"] == "0"
        assert row["Server Inferences"] == "30"
        for col in ("Inferences/Second", "p50 latency", "p90 latency", "p99 latency",
                    "Avg latency", "Server Queue", "Server Compute Infer"):
            assert float(row[col]) >= 0
        assert float(row["p50 latency"]) <= float(row["p90 latency"]) <= float(row["p99 latency"])
    assert stats(s, "add_sub") == before + 90
    assert "Concurrency: 5" in out and "p99" in out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_and_variable_dims(server, tmp_path, protocol):
    s = server
    rows, _ = run_csv(s, tmp_path, "-m", "identity_fp32", "-b", "4", "--shape", "INPUT0:7",
                      "--measurement-request-count", "25", protocol=protocol)
    assert rows[0]["Server Requests"] == "25"
    assert rows[0]["Server Inferences"] == "100"  # 25 requests of batch 4
    r = perf("-u", s.http_url, "-m", "identity_fp32")
    assert r.returncode != 0
    assert "input 'INPUT0' has a variable dimension; give its shape with --shape INPUT0:" in r.stderr


def test_request_rate_mode(server, tmp_path):
    s = server
    rows, out = run_csv(s, tmp_path, "-m", "add_sub", "--request-rate-range", "200:400:200",
                        "--measurement-request-count", "20", "--max-threads", "4")
    assert [row["Request Rate"] for row in rows] == ["200", "400"]
    assert all(row["Client Requests"] == row["Server Requests"] == "20" for row in rows)
    assert "Request rate: 400" in out


def test_inputs_from_files(server, tmp_path):
    import numpy as np
    s = server
    data = tmp_path / "data"
    data.mkdir()
    np.arange(16, dtype=np.float32).tofile(data / "INPUT0")
    np.ones(16, dtype=np.float32).tofile(data / "INPUT1")
    rows, _ = run_csv(s, tmp_path, "-m", "add_sub", "-b", "2", "--input-data", str(data),
                      "--measurement-request-count", "10")
    assert rows[0]["Server Inferences"] == "20"
    np.ones(5, dtype=np.float32).tofile(data / "INPUT1")
    r = perf("-u", s.http_url, "-m", "add_sub", "--input-data", str(data))
    assert r.returncode != 0
    assert "INPUT1 holds 5 elements; input 'INPUT1' needs 16 per batch item" in r.stderr


def test_server_errors_are_counted(server, tmp_path):
    s = server
    out = tmp_path / "out.csv"
    # add_sub's max_batch_size is 8: the server rejects every request
    r = perf("-u", s.http_url, "-m", "add_sub", "-b", "9", "--measurement-mode", "count_windows",
             "--measurement-request-count", "6", "-f", str(out))
    assert r.returncode != 0
    assert "6 failed requests, first: HTTP 400" in r.stderr, r.stderr
    with open(out, newline="") as f:
        row = next(csv.DictReader(f))
    assert row["Client Requests"] == row["Client Failures"] == "6"
    assert row["Server Requests"] == "0"


def test_server_errors_are_counted_grpc(server):
    s = server
    r = perf("-u", s.grpc_addr, "-i", "grpc", "-m", "add_sub", "-b", "9", "--measurement-mode",
             "count_windows", "--measurement-request-count", "4")
    assert r.returncode != 0
    assert "4 failed requests, first: gRPC status 3: " in r.stderr, r.stderr
    assert "batch-size must be <= 8 for 'add_sub'" in r.stderr


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sequences(server, tmp_path, protocol):
    # a stateful model: requests go in sequences of 4 (START first, END last);
    # a sequence open when a level's count is reached is still ended, so
    # every level sends whole sequences, all of them accepted
    rows, out = run_csv(server, tmp_path, "-m", "accumulator_direct", "--concurrency-range", "1:3:2",
                        "--measurement-request-count", "10", "--sequence-length", "4",
                        "--sequence-id-range", "100:199", "--sequence-header", protocol=protocol)
    assert "sequences of 4 requests (ids also in headers)" in out
    for row in rows:
        n = int(row["Client Requests"])
        assert row["Client Failures"] == "0" and n >= 10 and n % 4 == 0, row
        assert row["Server Requests"] == row["Client Requests"]


def test_unknown_model(server):
    s = server
    r = perf("-u", s.http_url, "-m", "nope")
    assert r.returncode != 0
    assert "model 'nope' metadata: HTTP 404" in r.stderr, r.stderr
    r = perf("-u", s.grpc_addr, "-i", "grpc", "-m", "nope")
    assert r.returncode != 0
    assert "model 'nope' metadata: gRPC status 5: " in r.stderr, r.stderr
