"""Helpers for the HTTP frontend tests: scratch model repositories on the C
identity/add_sub backends, a module-scoped server, and the binary tensor
extension (request building, response splitting) written with numpy."""
import json
import os
import struct

import numpy as np
import pytest
import requests

from conftest import Server

# protocol name -> (numpy dtype or None, config name)
DATATYPES = {
    "BOOL": (np.bool_, "TYPE_BOOL"),
    "UINT8": (np.uint8, "TYPE_UINT8"),
    "UINT16": (np.uint16, "TYPE_UINT16"),
    "UINT32": (np.uint32, "TYPE_UINT32"),
    "UINT64": (np.uint64, "TYPE_UINT64"),
    "INT8": (np.int8, "TYPE_INT8"),
    "INT16": (np.int16, "TYPE_INT16"),
    "INT32": (np.int32, "TYPE_INT32"),
    "INT64": (np.int64, "TYPE_INT64"),
    "FP16": (np.float16, "TYPE_FP16"),
    "FP32": (np.float32, "TYPE_FP32"),
    "FP64": (np.float64, "TYPE_FP64"),
    "BYTES": (np.object_, "TYPE_STRING"),
    "BF16": (None, "TYPE_BF16"),
}

LABELS = ["cat", "dog", "bird", "fish"]


def write_model(repo, name, config, files=None):
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config)
    for rel, text in (files or {}).items():
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)


def identity_config(name, dt_cfg, dims="[ -1 ]", max_batch=8, extra_out=""):
    return f"""name: "{name}"
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: {dt_cfg} dims: {dims} }} ]
output [ {{ name: "OUTPUT0" data_type: {dt_cfg} dims: {dims} {extra_out} }} ]
"""


def make_repo(root):
    """A repository with one identity model per datatype plus a few shapes."""
    repo = os.path.join(str(root), "models")
    os.makedirs(repo, exist_ok=True)
    for dt, (_, cfg) in DATATYPES.items():
        write_model(repo, f"id_{dt.lower()}", identity_config(f"id_{dt.lower()}", cfg))
    write_model(repo, "id_nobatch", identity_config("id_nobatch", "TYPE_FP32", "[ 4 ]", 0))
    write_model(repo, "id_var2", identity_config("id_var2", "TYPE_FP32", "[ -1, -1 ]", 0))
    write_model(repo, "id_labels",
                identity_config("id_labels", "TYPE_FP32", "[ 4 ]", 8,
                                'label_filename: "labels.txt"'),
                {"labels.txt": "\n".join(LABELS) + "\n"})
    write_model(repo, "id_multi", """name: "id_multi"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "INPUT2" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "OUTPUT2" data_type: TYPE_STRING dims: [ -1 ] } ]
""")
    write_model(repo, "add_sub", """name: "add_sub"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
""")
    return repo


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """One server for a whole test module on a scratch repository."""
    repo = make_repo(tmp_path_factory.mktemp("http"))
    s = Server(repo, [])
    yield s
    rc = s.stop()
    assert rc == 0, f"nereid exited with {rc}:\n{s.output()}"


# ---- binary tensor extension ----------------------------------------------


def serialize_bytes(values):
    out = b""
    for v in values:
        b = v if isinstance(v, bytes) else str(v).encode()
        out += struct.pack("<I", len(b)) + b
    return out


def deserialize_bytes(raw):
    items, off = [], 0
    while off < len(raw):
        (n,) = struct.unpack_from("<I", raw, off)
        items.append(raw[off + 4:off + 4 + n])
        off += 4 + n
    return items


def tensor_bytes(datatype, array):
    if datatype == "BYTES":
        return serialize_bytes(list(np.asarray(array, dtype=object).flatten()))
    if datatype == "BF16":
        return np.asarray(array, dtype=np.uint16).tobytes()
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype][0]).astype(
        np.dtype(DATATYPES[datatype][0]).newbyteorder("<")).tobytes()


def json_data(datatype, array):
    a = np.asarray(array, dtype=object if datatype == "BYTES" else None)
    flat = a.flatten().tolist()
    if datatype == "BYTES":
        return [x.decode() if isinstance(x, bytes) else x for x in flat]
    return flat


def build_infer(inputs, outputs=None, parameters=None, request_id=None):
    """inputs: dicts with name, datatype, data (numpy array), binary (bool).
    Returns (body, headers)."""
    doc, tail = {}, b""
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    doc["inputs"] = []
    for i in inputs:
        arr = np.asarray(i["data"], dtype=object if i["datatype"] == "BYTES" else None)
        entry = {"name": i["name"], "datatype": i["datatype"],
                 "shape": list(i.get("shape", arr.shape))}
        if i.get("binary"):
            raw = tensor_bytes(i["datatype"], arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            entry["data"] = json_data(i["datatype"], arr)
        doc["inputs"].append(entry)
    if outputs is not None:
        doc["outputs"] = outputs
    header = json.dumps(doc).encode()
    headers = {}
    if tail:
        headers["Inference-Header-Content-Length"] = str(len(header))
        headers["Content-Type"] = "application/octet-stream"
    return header + tail, headers


def split_response(resp):
    """Returns (json document, {output name: raw bytes}) of an infer reply."""
    ihcl = resp.headers.get("Inference-Header-Content-Length")
    body = resp.content
    if ihcl is None:
        return json.loads(body), {}
    n = int(ihcl)
    doc = json.loads(body[:n])
    raw, off = {}, n
    for o in doc["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            raw[o["name"]] = body[off:off + size]
            off += size
    assert off == len(body), "binary tail longer than the declared outputs"
    return doc, raw


def output_array(doc, raw, name):
    out = next(o for o in doc["outputs"] if o["name"] == name)
    dt = out["datatype"]
    if name in raw:
        if dt == "BYTES":
            return np.array(deserialize_bytes(raw[name]), dtype=object).reshape(out["shape"])
        if dt == "BF16":
            return np.frombuffer(raw[name], dtype="<u2").reshape(out["shape"])
        return np.frombuffer(raw[name], dtype=np.dtype(DATATYPES[dt][0]).newbyteorder("<")
                             ).reshape(out["shape"])
    if dt == "BYTES":
        return np.array([s.encode() for s in out["data"]], dtype=object).reshape(out["shape"])
    return np.array(out["data"], dtype=DATATYPES[dt][0]).reshape(out["shape"])


def infer(server, model, body, headers=None, version=None):
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return requests.post(server.http_url + path, data=body, headers=headers or {}, timeout=30)


def read_head(sock):
    """Reads a raw socket up to the end of one reply's header block (or until
    the peer closes) and returns what arrived."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def pending_requests(server, model, version="1"):
    """The nv_inference_pending_request_count gauge of one model version, or
    None when the metric line is missing."""
    text = requests.get(f"{server.metrics_url}/metrics", timeout=10).text
    prefix = f'nv_inference_pending_request_count{{model="{model}",version="{version}"}}'
    for line in text.splitlines():
        if line.startswith(prefix):
            return int(float(line.split()[-1]))
    return None
