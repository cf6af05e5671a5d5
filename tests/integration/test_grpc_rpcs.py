"""gRPC frontend: every non-inference RPC, unknown methods, start-up flags."""
import os
import socket
import subprocess
import time

import grpc
import pytest

from conftest import NEREID, free_port
from grpc_util import identity_repo, infer_request, stubs

pb, pbg, hpb, hpbg = stubs()


@pytest.fixture
def server(nereid_server, tmp_path):
    return nereid_server(identity_repo(str(tmp_path / "models")), wait_port="grpc")


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        yield pbg.GRPCInferenceServiceStub(ch)


def rpc_error(fn, *args, **kw):
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, timeout=10, **kw)
    return e.value


def test_health(server, stub):
    assert stub.ServerLive(pb.ServerLiveRequest()).live is True
    assert stub.ServerReady(pb.ServerReadyRequest()).ready is True
    with grpc.insecure_channel(server.grpc_addr) as ch:
        r = hpbg.HealthStub(ch).Check(hpb.HealthCheckRequest())
        assert r.status == hpb.HealthCheckResponse.SERVING


def test_server_metadata(stub):
    r = stub.ServerMetadata(pb.ServerMetadataRequest())
    assert r.name == "triton"
    assert r.version
    assert "statistics" in r.extensions and "model_repository" in r.extensions


def test_model_metadata(stub):
    r = stub.ModelMetadata(pb.ModelMetadataRequest(name="id_batch"))
    assert r.name == "id_batch" and list(r.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in r.inputs] == [("INPUT0", "FP32", [-1, -1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in r.outputs] == [("OUTPUT0", "FP32", [-1, -1])]
    r = stub.ModelMetadata(pb.ModelMetadataRequest(name="id_bytes", version="1"))
    assert r.inputs[0].datatype == "BYTES"
    e = rpc_error(stub.ModelMetadata, pb.ModelMetadataRequest(name="nope"))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert e.details() == "Request for unknown model: 'nope' is not found"
    e = rpc_error(stub.ModelMetadata, pb.ModelMetadataRequest(name="id_fp32", version="x"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == ("failed to get model version from specified version string 'x' "
                           "(details: stol), version should be an integral value > 0")


def test_model_ready(stub):
    assert stub.ModelReady(pb.ModelReadyRequest(name="id_fp32")).ready is True
    assert stub.ModelReady(pb.ModelReadyRequest(name="id_fp32", version="1")).ready is True
    # an unknown model or a version the model does not have: not ready, no
    # error (Triton's L0_server_status, L0_lifecycle, model-control examples)
    assert stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="id_fp32", version="7")).ready is False
    assert stub.ModelReady(pb.ModelReadyRequest(name="nope", version="1")).ready is False
    e = rpc_error(stub.ModelReady, pb.ModelReadyRequest(name="id_fp32", version="x"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_model_config(stub):
    c = stub.ModelConfig(pb.ModelConfigRequest(name="id_batch")).config
    assert c.name == "id_batch" and c.backend == "identity" and c.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in c.input] == [("INPUT0", [-1])]
    assert c.input[0].data_type == c.output[0].data_type != 0
    c = stub.ModelConfig(pb.ModelConfigRequest(name="id_bytes", version="1")).config
    assert c.name == "id_bytes"
    e = rpc_error(stub.ModelConfig, pb.ModelConfigRequest(name="nope"))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_model_statistics(stub):
    import numpy as np
    for _ in range(3):
        stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], np.ones(2, np.float32))]))
    r = stub.ModelStatistics(pb.ModelStatisticsRequest(name="id_fp32"))
    assert len(r.model_stats) == 1
    m = r.model_stats[0]
    assert (m.name, m.version) == ("id_fp32", "1")
    assert m.inference_count == 3 and m.execution_count == 3
    assert m.inference_stats.success.count == 3 and m.inference_stats.success.ns > 0
    assert m.inference_stats.queue.count == 3 and m.inference_stats.fail.count == 0
    assert m.last_inference > 1_600_000_000_000
    assert [b.batch_size for b in m.batch_stats] == [1]
    assert list(m.response_stats) == ["0"]
    assert m.response_stats["0"].success.count == 3 and m.response_stats["0"].fail.count == 0
    everything = stub.ModelStatistics(pb.ModelStatisticsRequest())
    names = {s.name for s in everything.model_stats}
    assert {"id_fp32", "id_bytes", "id_batch", "slow"} <= names
    e = rpc_error(stub.ModelStatistics, pb.ModelStatisticsRequest(name="nope"))
    assert e.code() != grpc.StatusCode.OK and e.details()


def test_repository(stub):
    r = stub.RepositoryIndex(pb.RepositoryIndexRequest())
    index = {(m.name, m.version, m.state) for m in r.models}
    assert ("id_fp32", "1", "READY") in index and ("slow", "1", "READY") in index
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert len(ready.models) == len(r.models)
    for call, req in ((stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="id_fp32")),
                      (stub.RepositoryModelUnload,
                       pb.RepositoryModelUnloadRequest(model_name="id_int8"))):
        e = rpc_error(call, req)
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert e.details() == ("explicit model load / unload is not allowed if polling is "
                               "enabled")
    bad = pb.RepositoryModelLoadRequest(model_name="id_fp32")
    bad.parameters["config"].int64_param = 3
    e = rpc_error(stub.RepositoryModelLoad, bad)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_repository_explicit_load_unload(nereid_server, tmp_path):
    repo = identity_repo(str(tmp_path / "models"))
    s = nereid_server(repo, "--model-control-mode=explicit", "--load-model=id_fp32",
                      wait_port="grpc")
    with grpc.insecure_channel(s.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ModelReady(pb.ModelReadyRequest(name="id_fp32")).ready
        ready = {m.name for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True)).models}
        assert ready == {"id_fp32"}
        try:
            stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="id_int8"),
                                     timeout=30)
        except grpc.RpcError as e:  # the core answers UNSUPPORTED until model control lands
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                pytest.skip(f"core: {e.details()}")
            raise
        assert stub.ModelReady(pb.ModelReadyRequest(name="id_int8")).ready
        unload = pb.RepositoryModelUnloadRequest(model_name="id_int8")
        unload.parameters["unload_dependents"].bool_param = False
        stub.RepositoryModelUnload(unload, timeout=30)
        # unloaded: not ready, no error (Triton's simple_grpc_model_control.py)
        assert not stub.ModelReady(pb.ModelReadyRequest(name="id_int8"), timeout=10).ready
        e = rpc_error(stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="nope"))
        assert e.code() != grpc.StatusCode.OK and "nope" in e.details()


def test_shared_memory_rpcs_with_client_shm_off(stub):
    # Triton's default since 26.05: status answers (empty), changes are refused
    disabled = ("Client shared memory is disabled. Start the server with "
                "'--allow-client-shm=true' to enable.")
    assert len(stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions) == 0
    assert len(stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest()).regions) == 0
    calls = [
        (stub.SystemSharedMemoryRegister, pb.SystemSharedMemoryRegisterRequest(name="r", key="/k")),
        (stub.SystemSharedMemoryUnregister, pb.SystemSharedMemoryUnregisterRequest()),
        (stub.CudaSharedMemoryUnregister, pb.CudaSharedMemoryUnregisterRequest()),
    ]
    for call, req in calls:
        e = rpc_error(call, req)
        assert (e.code(), e.details()) == (grpc.StatusCode.UNIMPLEMENTED, disabled)
    e = rpc_error(stub.CudaSharedMemoryRegister, pb.CudaSharedMemoryRegisterRequest(name="r"))
    assert (e.code(), e.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "failed to register CUDA shared memory region: 'r', GPUs not supported")


def test_unknown_methods_get_unimplemented(server):
    with grpc.insecure_channel(server.grpc_addr) as ch:
        for path in ("/inference.GRPCInferenceService/NoSuchRpc", "/foo.Bar/Baz"):
            t0 = time.time()
            with pytest.raises(grpc.RpcError) as e:
                ch.unary_unary(path)(b"", timeout=20)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert time.time() - t0 < 5
            with pytest.raises(grpc.RpcError) as e:
                list(ch.stream_stream(path)(iter([b"x", b"y"]), timeout=20))
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        stub = pbg.GRPCInferenceServiceStub(ch)
        assert stub.ServerLive(pb.ServerLiveRequest()).live


def test_port_clash_fails_startup(server, tmp_path):
    proc = subprocess.run(
        [NEREID, f"--model-repository={tmp_path / 'models'}", f"--http-port={free_port()}",
         f"--metrics-port={free_port()}", "--grpc-address=127.0.0.1",
         f"--grpc-port={server.grpc_port}"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"127.0.0.1:{server.grpc_port}" in proc.stderr
    with grpc.insecure_channel(server.grpc_addr) as ch:
        assert pbg.GRPCInferenceServiceStub(ch).ServerLive(pb.ServerLiveRequest()).live


def test_started_message_and_disable(nereid_server, tmp_path):
    repo = identity_repo(str(tmp_path / "models"))
    s = nereid_server(repo, wait_port="grpc")
    # The port accepts before the line is logged: wait for it.
    started = f"Started GRPCInferenceService at 127.0.0.1:{s.grpc_port}"
    deadline = time.time() + 30
    while started not in s.output():
        assert s.proc.poll() is None and time.time() < deadline, s.output()
        time.sleep(0.02)
    off = nereid_server(repo, "--allow-grpc=false", wait_port=None)
    deadline = time.time() + 30
    while "nereid ready" not in off.output():
        assert off.proc.poll() is None and time.time() < deadline, off.output()
        time.sleep(0.02)
    assert "GRPCInferenceService" not in off.output()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", off.grpc_port)) != 0
