"""A decoupled model's execute never runs on a frontend's thread. Short
executes of a model (a Python model: up to 1 ms on average) run inline on
the thread that submitted the request, which then cannot write anything
until execute returns; for a decoupled model that sends one response a
second from inside execute, every event of an HTTP generate_stream (and the
reply's headers) came at once when execute ended. Triton's L0_http
generate_endpoint_test test_streaming, after test_race_condition's burst of
quick requests made the model's average execute short."""
import json
import time

import requests

from test_python_backend import write

CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
instance_group [ { count: 1 kind: KIND_CPU } ]
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

MODEL = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            out = pb_utils.Tensor("TEXT", pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy())
            for _ in range(params.get("REPETITION", 1)):
                time.sleep(params.get("DELAY", 0))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def stream(s, body, timeout=60):
    return requests.post(f"{s.http_url}/v2/models/gen/generate_stream", data=json.dumps(body),
                         headers={"Accept": "text/event-stream"}, stream=True, timeout=timeout)


def test_decoupled_execute_does_not_hold_the_frontend_thread(nereid_server, tmp_path):
    repo = str(tmp_path / "models")
    write(repo, "gen", CONFIG, MODEL)
    s = nereid_server(repo, "--http-thread-count=1")
    # Quick executes keep the model's average execute short and leave its
    # instance idle: what an inline run needs. Then a slow stream; tried a
    # few times, as whether the instance thread is blocked at that moment
    # varies.
    for attempt in range(10):
        for _ in range(10):
            r = stream(s, {"PROMPT": ["hi"]})
            assert r.status_code == 200 and r.text.count("data: ") == 1
        t0 = time.time()
        r = stream(s, {"PROMPT": ["hi"], "REPETITION": 3, "DELAY": 0.3})
        assert r.status_code == 200
        at = []
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                at.append(time.time() - t0)
        assert len(at) == 3
        # Each event as it is sent (0.3 s apart), not all three at 0.9 s.
        assert at[0] < 0.8 and at[2] - at[0] > 0.4, (attempt, at)
