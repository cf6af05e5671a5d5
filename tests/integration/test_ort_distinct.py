"""Many *distinct* small ONNX models (issue 42) through the real binary: a
model's instances run on one ONNX Runtime session (unless share-sessions=0),
and a tiny model whose config leaves them to the backend gets the basic
graph optimizations and no memory arena of its own, while a config that
sets optimization.graph or enable_mem_arena still gets what it asks for.
The sessions are not visible from outside: each test compares the server's
resident memory between two settings with a margin far below what a session
costs. Times are measured by bench/bench_scale_distinct.py, not asserted."""
import concurrent.futures
import os

import numpy as np
import requests

KIB = 1 << 10


def mlp_bytes(seed):
    """OUTPUT0 = Relu(INPUT0 @ W1 + B1) @ W2 + B2, 16 -> 64 -> 4, weights of its own."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    inits = [numpy_helper.from_array(w(16, 64), "W1"), numpy_helper.from_array(w(64), "B1"),
             numpy_helper.from_array(w(64, 4), "W2"), numpy_helper.from_array(w(4), "B2")]
    nodes = [helper.make_node("MatMul", ["INPUT0", "W1"], ["h0"]),
             helper.make_node("Add", ["h0", "B1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
             helper.make_node("Add", ["o0", "B2"], ["OUTPUT0"])]
    graph = helper.make_graph(nodes, f"mlp_{seed}",
                              [helper.make_tensor_value_info("INPUT0", 1, [None, 16])],
                              [helper.make_tensor_value_info("OUTPUT0", 1, [None, 4])],
                              initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m.SerializeToString(), inits


def expected(inits, x):
    w1, b1, w2, b2 = (np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in inits)
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def make_repo(root, n, instances=1, extra="", sibling=False):
    """n MLPs under root; with sibling, a file beside each model file (where
    ONNX external data could be)."""
    weights = {}
    for i in range(n):
        name = f"mlp_{i:04d}"
        os.makedirs(os.path.join(root, name, "1"))
        data, weights[name] = mlp_bytes(i)
        with open(os.path.join(root, name, "1", "model.onnx"), "wb") as f:
            f.write(data)
        if sibling:
            with open(os.path.join(root, name, "1", "notes.txt"), "w") as f:
                f.write("not the model's weights, but the server cannot know\n")
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write(f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                    'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                    'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                    f'instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n' + extra)
    return weights


def check(server, name, inits, seed=0):
    x = np.random.default_rng(seed).standard_normal((1, 16)).astype(np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                        "data": x.ravel().tolist()}]}
    r = requests.post(f"{server.http_url}/v2/models/{name}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array(r.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(got, expected(inits, x).ravel(), rtol=1e-4, atol=1e-4)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * KIB
    return 0


def serve_all(nereid_server, repo, weights, *flags):
    """Starts a server on repo, sends one request to each model and returns
    the RSS after them."""
    s = nereid_server(repo, *flags)
    for name, inits in weights.items():
        check(s, name, inits)
    used = rss(s.proc.pid)
    s.stop()
    return used


def test_a_models_instances_share_its_session(nereid_server, tmp_path):
    """40 distinct models with 4 instances each: one session per model, not
    four (share-sessions=0 gives each instance its own, as in Triton); the
    instances still serve requests at once, each with the right answer."""
    n = 40
    repo = str(tmp_path / "models")
    weights = make_repo(repo, n, instances=4)
    s = nereid_server(repo)
    inits = weights["mlp_0007"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: check(s, "mlp_0007", inits, k), range(64)))
    s.stop()
    shared = serve_all(nereid_server, repo, weights)
    per_instance = serve_all(nereid_server, repo, weights,
                             "--backend-config=onnxruntime,share-sessions=0")
    # A session of this model costs ~60-100 KiB; 120 are saved.
    assert per_instance - shared >= n * 3 * 25 * KIB, (shared / KIB, per_instance / KIB)


def test_tiny_models_defaults_and_what_a_config_asks(nereid_server, tmp_path):
    """200 tiny models with default configs against the same models whose
    configs ask for all graph optimizations (optimization.graph.level 0,
    Triton's default) or for ONNX Runtime's memory arena, and against the
    same models with a file beside each model file (it might hold external
    weights: the file's size then says nothing): each costs the memory it
    costs in ONNX Runtime (the extended optimizations ~30 KiB a session,
    the arena ~35 KiB once it ran), so the default, lighter, settings are
    not applied over the config's, nor to a model that may be large."""
    n = 200
    default, level, arena, beside = (str(tmp_path / d)
                                     for d in ("default", "level", "arena", "beside"))
    weights = make_repo(default, n)
    make_repo(level, n, extra="optimization { graph { level: 0 } }\n")
    make_repo(arena, n, extra='parameters { key: "enable_mem_arena" '
                              'value: { string_value: "true" } }\n')
    make_repo(beside, n, sibling=True)
    light = serve_all(nereid_server, default, weights)
    for repo in (level, arena, beside):
        heavy = serve_all(nereid_server, repo, weights)
        assert heavy - light >= n * 12 * KIB, (repo, light / KIB, heavy / KIB)
