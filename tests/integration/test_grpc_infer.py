"""gRPC ModelInfer: every datatype typed and raw, large tensors, parameters,
classification, error texts, malformed requests, deadlines, cancellation."""
import concurrent.futures
import time

import grpc
import numpy as np
import pytest

from grpc_util import DATATYPES, identity_repo, infer_request, model_name, raw_bytes, sample, stubs

pb, pbg, _, _ = stubs()
MAX_MSG = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@pytest.fixture
def server(nereid_server, tmp_path):
    return nereid_server(identity_repo(str(tmp_path / "models")), wait_port="grpc")


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.grpc_addr, options=MAX_MSG) as ch:
        yield ch


@pytest.fixture
def stub(channel):
    return pbg.GRPCInferenceServiceStub(channel)


def rpc_error(fn, req, timeout=10):
    with pytest.raises(grpc.RpcError) as e:
        fn(req, timeout=timeout)
    return e.value


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_every_datatype(stub, raw):
    for dt, (_, _, field) in DATATYPES.items():
        if not raw and field is None:
            continue  # FP16/BF16 only have the raw form
        values = sample(dt, 7)
        req = infer_request(pb, model_name(dt), [("INPUT0", dt, [7], values)], raw=raw, id=dt)
        r = stub.ModelInfer(req, timeout=10)
        assert (r.model_name, r.model_version, r.id) == (model_name(dt), "1", dt)
        assert [(o.name, o.datatype, list(o.shape)) for o in r.outputs] == [("OUTPUT0", dt, [7])]
        assert list(r.raw_output_contents) == [raw_bytes(dt, values)], dt
        assert not r.outputs[0].HasField("contents")


def test_empty_and_multi_dim(stub):
    r = stub.ModelInfer(infer_request(pb, "id_batch", [("INPUT0", "FP32", [3, 0], [])]))
    assert list(r.outputs[0].shape) == [3, 0] and r.raw_output_contents[0] == b""
    x = np.arange(24, dtype=np.float32)
    r = stub.ModelInfer(infer_request(pb, "id_batch", [("INPUT0", "FP32", [4, 6], x)], raw=False))
    assert list(r.outputs[0].shape) == [4, 6]
    assert np.array_equal(np.frombuffer(r.raw_output_contents[0], np.float32), x)


def test_64mib_tensor(stub):
    n = 16 * 1024 * 1024
    x = np.arange(n, dtype=np.float32)
    r = stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [n], x)]), timeout=60)
    assert len(r.raw_output_contents[0]) == 64 * 1024 * 1024
    assert np.array_equal(np.frombuffer(r.raw_output_contents[0], np.float32), x)


def test_typed_and_raw_errors(stub):
    ints = np.arange(4, dtype=np.int32)
    req = infer_request(pb, "id_int32", [("INPUT0", "INT32", [4], ints)], raw=False)
    req.inputs[0].contents.fp32_contents.extend([1.0])
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == ("unexpected explicit tensor data for input tensor 'INPUT0' for "
                           "model 'id_int32', binary data was already supplied.")

    req = infer_request(pb, "id_int32", [("INPUT0", "INT32", [4], [])], raw=False)
    req.inputs[0].contents.fp32_contents.extend([1.0] * 4)
    e = rpc_error(stub.ModelInfer, req)
    assert e.details() == ("unexpected explicit tensor data for input tensor 'INPUT0' for "
                           "model 'id_int32' of type 'FP32', expected datatype 'INT32'")

    req = infer_request(pb, "id_int32", [("INPUT0", "INT32", [4], ints)], raw=False)
    req.raw_input_contents.append(ints.tobytes())
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == ("contents field must not be specified when using raw_input_contents "
                           "for 'INPUT0' for model 'id_int32'")

    req = pb.ModelInferRequest(model_name="id_int32")
    t = req.inputs.add()
    t.name, t.datatype = "INPUT0", "INT32"
    t.shape.append(4)
    e = rpc_error(stub.ModelInfer, req)
    assert e.details() == ("unable to find data for input tensor 'INPUT0' for model 'id_int32' "
                           "in request.")

    e = rpc_error(stub.ModelInfer,
                  infer_request(pb, "id_int32", [("INPUT0", "INT32", [5], ints)]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "byte size" in e.details()

    # BYTES element counts: Triton's texts (L0_input_validation)
    e = rpc_error(stub.ModelInfer,
                  infer_request(pb, "id_bytes", [("INPUT0", "BYTES", [4], [b"a", b"bc"])]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == ("[request id: <id_unknown>] expected 4 string elements for inference "
                           "input 'INPUT0' for model 'id_bytes', got 2")
    e = rpc_error(stub.ModelInfer,
                  infer_request(pb, "id_bytes", [("INPUT0", "BYTES", [2], [b"a", b"", b"c"])]))
    assert e.details() == ("[request id: <id_unknown>] unexpected number of string elements 3 "
                           "for inference input 'INPUT0' for model 'id_bytes', expecting 2")
    req = infer_request(pb, "id_bytes", [("INPUT0", "BYTES", [2], [b"a"])])
    req.raw_input_contents[0] += b"\x01\x00"
    e = rpc_error(stub.ModelInfer, req)
    assert e.details() == ("[request id: <id_unknown>] incomplete string length indicator for "
                           "inference input 'INPUT0' for model 'id_bytes', expecting 4 bytes but "
                           "only 2 bytes available. Please make sure the string length indicator "
                           "is in one buffer.")
    req = infer_request(pb, "id_bytes", [("INPUT0", "BYTES", [1], [b"abc"])])
    req.raw_input_contents[0] = req.raw_input_contents[0][:-1]  # last element cut short
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "incomplete string element 1 for inference input 'INPUT0'" in e.details()

    e = rpc_error(stub.ModelInfer, infer_request(pb, "nope", [("INPUT0", "INT32", [4], ints)]))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert e.details() == "Request for unknown model: 'nope' is not found"

    e = rpc_error(stub.ModelInfer, infer_request(pb, "id_int32", [("INPUT0", "INT32", [4], ints)],
                                                 version="abc"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "version string 'abc'" in e.details()


def test_id_and_parameters(stub):
    x = np.ones(3, np.float32)

    def req(**params):
        r = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], x)], id="req-42")
        for k, (kind, v) in params.items():
            setattr(r.parameters[k], kind, v)
        return r

    ok = req(sequence_id=("int64_param", 5), sequence_start=("bool_param", True),
             sequence_end=("bool_param", True), priority=("uint64_param", 1),
             timeout=("int64_param", 1000000), custom_s=("string_param", "v"),
             custom_i=("int64_param", 3), custom_b=("bool_param", True),
             custom_d=("double_param", 0.5), triton_enable_empty_final_response=("bool_param", True))
    assert stub.ModelInfer(ok, timeout=10).id == "req-42"
    assert stub.ModelInfer(req(sequence_id=("string_param", "abc")), timeout=10).id == "req-42"

    cases = [
        (req(sequence_id=("bool_param", True)),
         "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
        (req(sequence_start=("int64_param", 1)),
         "invalid value type for 'sequence_start' parameter, expected bool_param."),
        (req(priority=("int64_param", -1)), "invalid value for 'priority', expected value >= 0."),
        (req(priority=("string_param", "x")),
         "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
        (req(timeout=("bool_param", True)),
         "invalid value type for 'timeout' parameter, expected int64_param."),
        (req(triton_x=("bool_param", True)),
         "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
         "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
        (req(custom=("uint64_param", 1)),
         "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
         "string_param."),
    ]
    for r, text in cases:
        e = rpc_error(stub.ModelInfer, r)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details() == text


def test_requested_outputs_and_classification(stub):
    x = np.array([0.5, 3.0, -1.0, 2.0], np.float32)
    r = stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [4], x)],
                                      outputs=["OUTPUT0"]), timeout=10)
    assert [o.name for o in r.outputs] == ["OUTPUT0"]
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [4], x)], outputs=["OUTPUT0"])
    req.outputs[0].parameters["classification"].int64_param = 2
    r = stub.ModelInfer(req, timeout=10)
    out = r.outputs[0]
    assert out.datatype == "BYTES" and list(out.shape) == [2]
    raw = r.raw_output_contents[0]
    items, pos = [], 0
    while pos < len(raw):
        n = int.from_bytes(raw[pos:pos + 4], "little")
        items.append(raw[pos + 4:pos + 4 + n].decode())
        pos += 4 + n
    assert [i.split(":")[1] for i in items] == ["1", "3"]
    assert float(items[0].split(":")[0]) == 3.0
    req.outputs[0].parameters["classification"].string_param = "2"
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    e = rpc_error(stub.ModelInfer, infer_request(pb, "id_fp32", [("INPUT0", "FP32", [4], x)],
                                                 outputs=["NOPE"]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "NOPE" in e.details()


def test_classification_output_size_guard(stub):
    """Triton's TopkClassifications guard (server #8603): more than
    1,000,000 elements is INVALID_ARG, the limit itself is ranked."""
    for n, ok in ((1_000_001, False), (1_000_000, True)):
        req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [n], np.ones(n, np.float32))],
                            outputs=["OUTPUT0"])
        req.outputs[0].parameters["classification"].int64_param = 3
        if ok:
            assert list(stub.ModelInfer(req, timeout=30).outputs[0].shape) == [3]
        else:
            e = rpc_error(stub.ModelInfer, req, timeout=30)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.details() == "classification output tensor too large"


def malformed_bodies():
    good = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], np.ones(2, np.float32))])
    wire = good.SerializeToString()
    return [
        b"\xff",                                  # truncated tag
        b"\x0a",                                  # length missing
        b"\x0a\x05ab",                            # string shorter than its length
        b"\x0a\xff\xff\xff\xff\x0f",               # 4 GiB string length
        b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # varint too long
        b"\x0b",                                  # start group wire type
        b"\x0f",                                  # invalid wire type 7
        b"\x2a\x03\x0a\x01",                      # nested input truncated
        b"\x3a\x10" + b"\x00" * 4,                # raw contents truncated
        wire[:-3],                                # cut serialized request
        wire + b"\x2a",                           # trailing partial field
        b"\x00\x00\x00",                          # field number 0
        b"\x08" + b"\xff" * 20,                   # runaway varint
        b"\x2a\x02\x1a\xff",                      # packed shape with bad length
    ]


def malformed_messages():
    x = np.ones(2, np.float32)
    shape_neg = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [-2], x)])
    bad_dt = infer_request(pb, "id_fp32", [("INPUT0", "FP99", [2], x)])
    no_model = infer_request(pb, "", [("INPUT0", "FP32", [2], x)])
    huge_shape = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2**62, 2**62], x)])
    bad_bytes = infer_request(pb, "id_bytes", [("INPUT0", "BYTES", [2], [b"a"])])
    bad_bytes.raw_input_contents[0] = b"\xff\xff\xff\x7fab"
    dup = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], x), ("INPUT0", "FP32", [2], x)])
    return [shape_neg, bad_dt, no_model, huge_shape, bad_bytes, dup]


def test_malformed_requests_server_survives(server, channel, stub):
    raw_call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    bodies = malformed_bodies()
    messages = malformed_messages()
    assert len(bodies) + len(messages) >= 20
    for body in bodies:
        with pytest.raises(grpc.RpcError) as e:
            raw_call(body, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body
    for m in messages:
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(m, timeout=10)
        assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    for path in ("ModelMetadata", "ModelConfig", "ModelStatistics", "RepositoryModelLoad"):
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(f"/inference.GRPCInferenceService/{path}")(b"\x0a\x09ab",
                                                                         timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    r = stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], np.ones(2, np.float32))]))
    assert len(r.raw_output_contents[0]) == 8
    assert server.proc.poll() is None


def slow_request(ms, id=""):
    req = infer_request(pb, "slow", [("INPUT0", "FP32", [1], np.ones(1, np.float32))], id=id)
    req.parameters["delay_ms"].int64_param = ms
    return req


def test_deadline_and_unary_cancel(server, stub):
    e = rpc_error(stub.ModelInfer, slow_request(600), timeout=0.1)
    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    futures = [stub.ModelInfer.future(slow_request(300)) for _ in range(8)]
    time.sleep(0.05)
    for f in futures:
        f.cancel()
    for f in futures:
        assert f.cancelled() or f.exception() is not None or f.result() is not None
    # The in-flight work finishes on the backend without a client; the server carries on.
    assert stub.ModelInfer(slow_request(1, id="after"), timeout=10).id == "after"
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


def test_64_in_flight(stub):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        def one(i):
            x = np.full(5, i, np.float32)
            r = stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [5], x)], id=str(i)),
                                timeout=30)
            return r.id, np.frombuffer(r.raw_output_contents[0], np.float32)
        futures = [stub.ModelInfer.future(slow_request(20, id=f"s{i}")) for i in range(32)]
        results = list(pool.map(one, range(32)))
    for i, (rid, out) in enumerate(results):
        assert rid == str(i) and np.all(out == i)
    assert sorted(f.result().id for f in futures) == sorted(f"s{i}" for i in range(32))


def test_gzip_compressed_request(server):
    with grpc.insecure_channel(server.grpc_addr, compression=grpc.Compression.Gzip) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        x = np.zeros(100000, np.float32)
        r = stub.ModelInfer(infer_request(pb, "id_fp32", [("INPUT0", "FP32", [x.size], x)]),
                            timeout=30, compression=grpc.Compression.Gzip)
        assert r.raw_output_contents[0] == x.tobytes()


def test_extra_raw_input_contents_refused(stub):
    x = np.arange(3, dtype=np.float32)
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], x)])
    assert np.array_equal(np.frombuffer(stub.ModelInfer(req).raw_output_contents[0], np.float32), x)
    # one raw buffer more than there are inputs
    req.raw_input_contents.append(x.tobytes())
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == "unexpected additional input data for model 'id_fp32'"
    # a raw buffer with no input at all
    req = pb.ModelInferRequest(model_name="id_fp32")
    req.raw_input_contents.append(x.tobytes())
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    # typed contents for the only input plus a stray raw buffer: Triton's text
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], x)], raw=False)
    req.raw_input_contents.append(x.tobytes())
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details().startswith("contents field must not be specified when using raw_input_contents")
    # the server still answers
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], x)])
    assert len(stub.ModelInfer(req).raw_output_contents) == 1


def test_duplicate_input_and_output_names(stub):
    """Triton's texts (L0_grpc test_duplicate_output_names_rejected)."""
    x = np.ones(2, np.float32)
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], x)], outputs=["OUTPUT0", "OUTPUT0"])
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"
    req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [2], x), ("INPUT0", "FP32", [2], x)],
                        id="r7")
    e = rpc_error(stub.ModelInfer, req)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details() == "[request id: r7] input 'INPUT0' already exists in request"
