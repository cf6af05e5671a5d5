"""Graceful exit on SIGTERM/SIGINT (issue 39 item 1, Triton 25.05+'s drain):
readiness turns false at once while live stays true, new connections and
calls are refused, and everything already accepted is served to the end:
HTTP requests in flight and those arriving on live keep-alive connections
(each reply then says Connection: close, unless a sequence goes on), gRPC
unary calls, gRPC streams (their open requests finish, then the stream ends
with OK) and sequences already started. The log counts down Triton's
"Timeout <n>: Found ..." lines; at --exit-timeout-secs the rest fails."""
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import EXAMPLES, Server
from grpc_util import identity_repo, infer_request, stubs

pb, pbg, _, _ = stubs()


def make_repo(tmp_path):
    repo = identity_repo(str(tmp_path / "models"))
    shutil.copytree(os.path.join(EXAMPLES, "accumulator_direct"),
                    os.path.join(repo, "accumulator_direct"))
    return repo


def start(tmp_path, *args):
    return Server(make_repo(tmp_path), list(args), "grpc")


def connect(s):
    c = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=30)
    c.connect()
    return c


def slow_body(ms, value=1.0):
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [value]}],
                       "parameters": {"delay_ms": ms}})


def post(c, path, body):
    c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.getheader("Connection"), r.read()


def get(c, path):
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.getheader("Connection"), r.read()


def seq_body(value, seq_id, start=False, end=False):
    return json.dumps({"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1],
                                   "data": [value]}],
                       "parameters": {"sequence_id": seq_id, "sequence_start": start,
                                      "sequence_end": end}})


def output(raw, name):
    return [o for o in json.loads(raw)["outputs"] if o["name"] == name][0]["data"]


def wait_for(pred, what, timeout=10):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def refused(s):
    try:
        socket.create_connection(("127.0.0.1", s.http_port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


def grpc_refused(call):
    """Whether call fails to connect (Triton's L0_lifecycle text: "failed to
    connect to all addresses ... Connection refused"). A call that reached
    the server just as its shutdown began is CANCELLED by gRPC core (as with
    Triton), and one made a moment before the drain started succeeds: False
    then, try again."""
    try:
        call()
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED:
            return False
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert "Connection refused" in e.details(), e.details()
        return True
    return False


def stop(s):
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()
    s.log.close()


def test_http_drain(tmp_path):
    s = start(tmp_path, "--exit-timeout-secs=30")
    try:
        busy, idle, probe, live, seq = (connect(s) for _ in range(5))
        # A sequence started before the signal.
        st, _, raw = post(seq, "/v2/models/accumulator_direct/infer", seq_body(5, 42, start=True))
        assert st == 200 and output(raw, "OUTPUT") == [5]
        assert get(probe, "/v2/health/ready")[0] == 200
        result = {}

        def long_request():
            result["reply"] = post(busy, "/v2/models/slow/infer", slow_body(3000, 7.0))
            result["at"] = time.time()

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.3)  # the request reaches the server (if not, its live connection is served)
        s.proc.send_signal(signal.SIGTERM)
        # Readiness turns false while the long request still executes (it
        # answers "Connection: close": reopened, the probe would be refused).
        ready = []

        def not_ready():
            nonlocal probe
            status, conn, _ = get(probe, "/v2/health/ready")
            ready.append((status, conn, "reply" in result))
            if conn == "close":
                probe.close()
                probe = None
            return status != 200 or probe is None

        wait_for(not_ready, "readiness to turn false", timeout=5)
        assert ready[-1][0] == 400 and ready[-1][2] is False, ready
        # live stays true until exit
        status, conn, _ = get(live, "/v2/health/live")
        assert status == 200 and conn == "close"
        wait_for(lambda: refused(s), "the listener to close")
        # A request arriving on a live keep-alive connection is served
        # (Triton's L0_lifecycle test_shutdown_with_live_connection).
        st, conn, raw = post(idle, "/v2/models/slow/infer", slow_body(0, 3.0))
        assert st == 200 and output(raw, "OUTPUT0") == [3.0] and conn == "close"
        # The rest of the sequence is accepted, on a connection kept open.
        st, conn, raw = post(seq, "/v2/models/accumulator_direct/infer", seq_body(2, 42))
        assert st == 200 and output(raw, "OUTPUT") == [7] and conn != "close"
        st, conn, raw = post(seq, "/v2/models/accumulator_direct/infer",
                             seq_body(1, 42, end=True))
        assert st == 200 and output(raw, "OUTPUT") == [8] and conn == "close"
        t.join(30)
        st, conn, raw = result["reply"]
        assert st == 200 and output(raw, "OUTPUT0") == [7.0] and conn == "close"
        for c in (busy, idle, live, seq):
            c.close()
        # Every connection is closed: the server exits without waiting the 30 s.
        rc = s.proc.wait(timeout=15)
        assert rc == 0
        log = s.output()
        assert "Timeout 30: Found " in log and " HTTP service connections" in log
        assert "Waiting for in-flight requests to complete." in log
        assert "Found 0 model versions that have in-flight inferences" in log
        assert "live models and 0 in-flight non-inference requests" in log
        assert "Exit timeout" not in log
        assert log.count("Timeout 30: ") == 1  # one countdown (L0_lifecycle step 56)
    finally:
        stop(s)


def stream_seq(value, seq_id, id, start=False, end=False):
    r = infer_request(pb, "accumulator_direct",
                      [("INPUT", "INT32", [1, 1], np.array([[value]], np.int32))], id=id)
    r.parameters["sequence_id"].int64_param = seq_id
    r.parameters["sequence_start"].bool_param = start
    r.parameters["sequence_end"].bool_param = end
    return r


def slow(ms, id):
    r = infer_request(pb, "slow", [("INPUT0", "FP32", [1], np.ones(1, np.float32))], id=id)
    r.parameters["delay_ms"].int64_param = ms
    return r


def test_grpc_drain(tmp_path):
    s = start(tmp_path, "--exit-timeout-secs=30")
    try:
        probe = connect(s)
        ch = grpc.insecure_channel(s.grpc_addr)
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        # stream 1: two slow requests, never half-closed by the client
        hold1 = threading.Event()

        def reqs1():
            yield slow(2000, "a")
            yield slow(2000, "b")
            hold1.wait(60)

        stream1 = stub.ModelStreamInfer(reqs1(), timeout=60)
        # stream 2: a sequence started before the signal, continued after it
        q2 = queue.Queue()
        q2.put(stream_seq(5, 77, "s0", start=True))

        def reqs2():
            while True:
                r = q2.get()
                if r is None:
                    return
                yield r

        stream2 = stub.ModelStreamInfer(reqs2(), timeout=60)
        first = next(stream2)
        assert first.error_message == ""
        unary = stub.ModelInfer.future(slow(2000, "u"), timeout=60)
        time.sleep(0.3)  # the calls reach the server
        s.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: get(probe, "/v2/health/ready")[0] == 400, "readiness to turn false")
        probe.close()
        # New calls are refused (the listener is closed).
        def live_refused():
            with grpc.insecure_channel(s.grpc_addr) as ch2:
                return grpc_refused(
                    lambda: pbg.GRPCInferenceServiceStub(ch2).ServerLive(pb.ServerLiveRequest(),
                                                                         timeout=5))

        wait_for(live_refused, "a new gRPC call to be refused")
        # On the open stream: a new request is refused with Triton's text,
        # the rest of the sequence is served.
        q2.put(slow(0, "new"))
        q2.put(stream_seq(2, 77, "s1"))
        q2.put(stream_seq(1, 77, "s2", end=True))
        got2 = list(stream2)  # the stream ends with OK once the sequence ended
        by_id = {r.infer_response.id or r.error_message: r for r in got2}
        refusal = [r for r in got2 if r.error_message]
        assert len(refusal) == 1 and refusal[0].error_message == (
            "GRPC server is shutting down and has stopped accepting new requests.")
        assert np.frombuffer(by_id["s1"].infer_response.raw_output_contents[0],
                             np.int32).tolist() == [7]
        assert np.frombuffer(by_id["s2"].infer_response.raw_output_contents[0],
                             np.int32).tolist() == [8]
        # Stream 1's open requests finish, then it ends with OK although the
        # client never half-closed it.
        got1 = list(stream1)
        assert sorted(r.infer_response.id for r in got1) == ["a", "b"]
        assert all(r.error_message == "" for r in got1)
        assert unary.result(timeout=30).id == "u"
        q2.put(None)
        hold1.set()
        ch.close()
        rc = s.proc.wait(timeout=15)
        assert rc == 0
        log = s.output()
        assert " gRPC service connections and inference handlers" in log
        assert "Waiting for in-flight requests to complete." in log
        assert "Exit timeout" not in log
    finally:
        stop(s)


def test_exit_timeout_expires(tmp_path):
    """An idle keep-alive connection holds the drain (as in Triton) until
    --exit-timeout-secs; the countdown is logged once a second, then the
    server exits and what is still queued fails."""
    s = start(tmp_path, "--exit-timeout-secs=2")
    try:
        idle = connect(s)
        assert get(idle, "/v2/health/live")[0] == 200
        t0 = time.time()
        s.proc.send_signal(signal.SIGINT)
        rc = s.proc.wait(timeout=20)
        took = time.time() - t0
        assert rc == 0
        assert took >= 1.5, took
        log = s.output()
        assert "Timeout 2: Found 1 HTTP service connections" in log
        assert "Timeout 1: Found 1 HTTP service connections" in log
        assert "Exit timeout (2 s) expired" in log
        idle.close()
    finally:
        stop(s)


def test_idle_keepalive_connections_closed_after_grace(tmp_path):
    """Better than Triton, which waits on an idle keep-alive connection until
    the exit timeout: once nothing else holds the drain, idle connections are
    closed after a 5 s grace (for requests their clients may still send), so
    a proxy's pooled connections do not hold a replica for the full 30 s."""
    s = start(tmp_path, "--exit-timeout-secs=30")
    try:
        idle = connect(s)
        assert get(idle, "/v2/health/live")[0] == 200
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(timeout=25)
        took = time.time() - t0
        assert rc == 0
        assert took >= 4.5, took
        log = s.output()
        assert "Timeout 30: Found 1 HTTP service connections" in log
        assert "Exit timeout" not in log
        idle.close()
    finally:
        stop(s)


def test_grpc_unary_calls_drain_on_one_channel(tmp_path):
    """Triton's L0_lifecycle test_shutdown_dynamic: calls queued on a dynamic
    batcher complete after SIGINT; a new call on the same channel fails to
    connect; the log counts the calls left down to "Found 1 gRPC ..."."""
    repo = make_repo(tmp_path)
    os.makedirs(os.path.join(repo, "one_at_a_time", "1"))
    with open(os.path.join(repo, "one_at_a_time", "config.pbtxt"), "w") as f:
        f.write("""
name: "one_at_a_time"
backend: "testing"
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters [ { key: "execute_delay_ms" value: { string_value: "2000" } } ]
""")
    s = Server(repo, ["--exit-timeout-secs=30"], "grpc")
    try:
        probe = connect(s)
        with grpc.insecure_channel(s.grpc_addr) as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)

            def req(i):
                return infer_request(pb, "one_at_a_time", [
                    ("INPUT0", "FP32", [1, 1], np.full((1, 1), i, np.float32))], id=f"c{i}")

            calls = [stub.ModelInfer.future(req(i), timeout=60) for i in range(3)]
            time.sleep(0.5)  # the calls reach the server
            s.proc.send_signal(signal.SIGINT)
            wait_for(lambda: get(probe, "/v2/health/ready")[0] == 400, "readiness to turn false")
            probe.close()
            wait_for(lambda: grpc_refused(lambda: stub.ModelInfer(req(9), timeout=10)),
                     "a new call on the channel to be refused")
            for i, c in enumerate(calls):
                r = c.result(timeout=30)
                assert np.frombuffer(r.raw_output_contents[0], np.float32).tolist() == [i]
        assert s.proc.wait(timeout=15) == 0
        log = s.output()
        assert "Found 1 gRPC service connections and inference handlers" in log
        assert "Exit timeout" not in log
    finally:
        stop(s)


def repeat_request(values, delay_ms, id):
    req = pb.ModelInferRequest(model_name="repeat_int32", id=id)
    for name, dt, arr in (("IN", "INT32", np.array(values, np.int32)),
                          ("DELAY", "UINT32", np.full(len(values), delay_ms, np.uint32)),
                          ("WAIT", "UINT32", np.array([0], np.uint32))):
        t = req.inputs.add()
        t.name, t.datatype = name, dt
        t.shape.extend([len(arr)])
        req.raw_input_contents.append(arr.tobytes())
    return req


def test_decoupled_stream_drains(tmp_path):
    """A decoupled request whose responses are still coming when SIGTERM
    arrives sends all of them; then the stream ends with OK."""
    repo = make_repo(tmp_path)
    shutil.copytree(os.path.join(EXAMPLES, "repeat_int32"), os.path.join(repo, "repeat_int32"))
    s = Server(repo, ["--exit-timeout-secs=30"], "grpc")
    try:
        probe = connect(s)
        hold = threading.Event()

        def reqs():
            yield repeat_request(list(range(6)), 400, "d")  # 6 responses over ~2.4 s
            hold.wait(60)

        with grpc.insecure_channel(s.grpc_addr) as ch:
            stream = pbg.GRPCInferenceServiceStub(ch).ModelStreamInfer(reqs(), timeout=60)
            first = next(stream)
            assert first.error_message == ""
            s.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: get(probe, "/v2/health/ready")[0] == 400, "readiness to turn false")
            probe.close()
            rest = list(stream)  # ends with OK without a half-close
            hold.set()
        got = [first] + rest
        assert all(r.error_message == "" for r in got)
        outs = [np.frombuffer(r.infer_response.raw_output_contents[0], np.int32).tolist()
                for r in got if r.infer_response.raw_output_contents]
        assert outs == [[i] for i in range(6)]
        assert s.proc.wait(timeout=15) == 0
        assert "Exit timeout" not in s.output()
    finally:
        stop(s)


def test_live_sequences_are_in_flight_at_exit(tmp_path):
    """Triton counts a sequence batcher's live sequences (those holding a
    slot) as its in-flight inferences: the exit logs them and waits until
    they end or their idle timeout releases them (L0_lifecycle
    test_shutdown_sequence greps "Model 'custom_sequence_int32' (version 1)
    has 2 in-flight inferences")."""
    s = start(tmp_path, "--exit-timeout-secs=30")
    try:
        c = connect(s)
        for seq_id in (1, 2):  # started, never ended
            st, _, raw = post(c, "/v2/models/accumulator_direct/infer",
                              seq_body(seq_id, seq_id, start=True))
            assert st == 200 and output(raw, "OUTPUT") == [seq_id]
        c.close()
        s.proc.send_signal(signal.SIGINT)
        rc = s.proc.wait(timeout=20)  # the 1 s default idle timeout ends them
        assert rc == 0
        log = s.output()
        assert "Model 'accumulator_direct' (version 1) has 2 in-flight inferences" in log
        assert "Found 1 model versions that have in-flight inferences" in log
        assert "Found 0 model versions that have in-flight inferences" in log
        assert "Exit timeout" not in log
    finally:
        stop(s)
