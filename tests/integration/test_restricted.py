"""Restricted API groups (--http-restricted-api, --grpc-restricted-protocol)
with Triton's rules: a restricted HTTP route answers 403 {"error": "This API
is restricted, expecting header '<key>'"} before any other check (even the
method) unless the header carries exactly the value; a restricted RPC
(unary or stream) finishes UNAVAILABLE "This protocol is restricted,
expecting header 'triton-grpc-protocol-<key>'"; bad flag values are refused
with Triton's texts."""
import subprocess

import grpc
import numpy as np
import pytest
import requests

from conftest import EXAMPLES, NEREID
from grpc_util import identity_repo, infer_request, stubs

pb, pbg, hpb, hpbg = stubs()

INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]}


def forbidden(r, header):
    assert r.status_code == 403, r.text
    assert r.json() == {"error": f"This API is restricted, expecting header '{header}'"}


@pytest.fixture
def server(nereid_server, tmp_path):
    return nereid_server(identity_repo(str(tmp_path / "models")),
                         "--http-restricted-api=model-repository,statistics:admin-key=s3cret",
                         "--http-restricted-api=inference:infer-key=abc",
                         "--grpc-restricted-protocol=model-repository,health:admin-key=s3cret",
                         "--grpc-restricted-protocol=inference:infer-key=abc")


def test_http_restricted_groups(server):
    url = server.http_url
    ok = {"admin-key": "s3cret"}
    # restricted: refused without the header, with a wrong value, or another case of value
    for headers in ({}, {"admin-key": "wrong"}, {"admin-key": "S3CRET"}, {"infer-key": "s3cret"}):
        forbidden(requests.post(url + "/v2/repository/index", headers=headers), "admin-key")
        forbidden(requests.get(url + "/v2/models/stats", headers=headers), "admin-key")
        forbidden(requests.get(url + "/v2/models/id_fp32/stats", headers=headers), "admin-key")
    # allowed with the exact value; the header name is case-insensitive
    assert requests.post(url + "/v2/repository/index", headers=ok).status_code == 200
    assert requests.get(url + "/v2/models/stats", headers={"Admin-Key": "s3cret"}).status_code == 200
    # the restriction comes before the method check (Triton's order) and the body
    forbidden(requests.get(url + "/v2/repository/index"), "admin-key")
    assert requests.get(url + "/v2/repository/index", headers=ok).status_code == 405
    forbidden(requests.post(url + "/v2/repository/models/nosuch/load", data=b"{bad json"),
              "admin-key")
    # other groups stay open
    assert requests.get(url + "/v2/health/ready").status_code == 200
    assert requests.get(url + "/v2/models/id_fp32/config").status_code == 200
    assert requests.get(url + "/v2").status_code == 200
    # inference has its own key
    infer = url + "/v2/models/id_fp32/infer"
    forbidden(requests.post(infer, json=INFER), "infer-key")
    forbidden(requests.post(infer, json=INFER, headers=ok), "infer-key")
    r = requests.post(infer, json=INFER, headers={"infer-key": "abc"})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1, 2, 3]
    # the connection stays usable after a 403 with a body
    with requests.Session() as s:
        forbidden(s.post(infer, json=INFER), "infer-key")
        assert s.post(infer, json=INFER, headers={"infer-key": "abc"}).status_code == 200
    # unknown paths are still 404
    assert requests.get(url + "/v2/nothing").status_code == 404


def grpc_error(fn, *args, **kw):
    with pytest.raises(grpc.RpcError) as e:
        fn(*args, timeout=10, **kw)
    return e.value


def test_grpc_restricted_groups(server):
    admin = [("triton-grpc-protocol-admin-key", "s3cret")]
    with grpc.insecure_channel(server.grpc_addr) as ch:
        stub = pbg.GRPCInferenceServiceStub(ch)
        msg = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        for md in ([], [("admin-key", "s3cret")], [("triton-grpc-protocol-admin-key", "x")]):
            for call in (lambda: stub.ServerLive(pb.ServerLiveRequest(), metadata=md, timeout=10),
                         lambda: stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md,
                                                      timeout=10),
                         lambda: hpbg.HealthStub(ch).Check(hpb.HealthCheckRequest(), metadata=md,
                                                           timeout=10)):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert e.value.details() == msg
        assert stub.ServerLive(pb.ServerLiveRequest(), metadata=admin).live
        assert stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=admin).models
        # open groups
        assert stub.ServerMetadata(pb.ServerMetadataRequest()).name == "triton"
        assert stub.ModelStatistics(pb.ModelStatisticsRequest(name="id_fp32")).model_stats
        # inference: unary and stream
        req = infer_request(pb, "id_fp32", [("INPUT0", "FP32", [3], np.ones(3, np.float32))])
        e = grpc_error(stub.ModelInfer, req, metadata=admin)
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert e.details() == ("This protocol is restricted, expecting header "
                               "'triton-grpc-protocol-infer-key'")
        infer_md = [("triton-grpc-protocol-infer-key", "abc")]
        assert stub.ModelInfer(req, metadata=infer_md, timeout=10).model_name == "id_fp32"
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ModelStreamInfer(iter([req]), metadata=admin, timeout=10))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "triton-grpc-protocol-infer-key" in e.value.details()
        replies = list(stub.ModelStreamInfer(iter([req]), metadata=infer_md, timeout=10))
        assert len(replies) == 1 and replies[0].error_message == ""


@pytest.mark.parametrize("flag,message", [
    ("--http-restricted-api=health:k",
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health:k"),
    ("--http-restricted-api=:k=v",
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got :k=v"),
    ("--http-restricted-api=health:=v",
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health:=v"),
    ("--http-restricted-api=health:k=",
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health:k="),
    ("--grpc-restricted-protocol=health",
     "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health"),
    ("--http-restricted-api=health,bogus:k=v", "unknown restricted api 'bogus' "),
    ("--http-restricted-api=health,:k=v", "unknown restricted api '' "),
    ("--grpc-restricted-protocol=Health:k=v", "unknown restricted protocol 'Health' "),
    ("--http-restricted-api=health,health:k=v",
     "restricted api 'health' can not be specified in multiple config groups"),
])
def test_bad_flags(flag, message):
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}", flag],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert message + "\n" in p.stderr


def test_group_in_two_flags():
    p = subprocess.run([NEREID, f"--model-repository={EXAMPLES}",
                        "--grpc-restricted-protocol=trace,logging:a=1",
                        "--grpc-restricted-protocol=metadata,logging:b=2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "restricted protocol 'logging' can not be specified in multiple config groups\n" \
        in p.stderr


def test_value_may_hold_separators(nereid_server, tmp_path):
    s = nereid_server(identity_repo(str(tmp_path / "models")),
                      "--http-restricted-api=health,metadata:k=a:b=c,d")
    forbidden(requests.get(s.http_url + "/v2/health/live"), "k")
    assert requests.get(s.http_url + "/v2/health/live", headers={"k": "a:b=c,d"}).status_code == 200
    forbidden(requests.get(s.http_url + "/v2/models/id_fp32"), "k")
