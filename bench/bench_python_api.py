"""pb_utils calls from a Python model, time per call: is_model_ready about
another model and about the model itself, a counter's increment (sent
without an answer) and value() (answered). Prints numbers; not a test.

    NEREID_BUILD=build /usr/bin/python3 bench/bench_python_api.py [calls]
"""
import json
import os
import sys
import tempfile
import textwrap

import numpy as np
import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "integration"))
from conftest import Server  # noqa: E402

MODEL = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="bench_calls", description="calls",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"k": "v"})

    def execute(self, requests):
        out = []
        for r in requests:
            name, n = json.loads(r.inputs()[0].as_numpy()[0])
            if name.startswith("metric"):
                m = self.metric
                call = m.increment if name == "metric.increment" else m.value
                args = (1,) if name == "metric.increment" else ()
            else:
                call, args = pb_utils.is_model_ready, (name,)
            call(*args)
            t = time.perf_counter()
            for _ in range(n):
                call(*args)
            if name == "metric.increment":
                m.value()  # answered after all the increments were applied
            us = (time.perf_counter() - t) / n * 1e6
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([str(us).encode()], dtype=np.object_))]))
        return out
"""

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    repo = tempfile.mkdtemp(prefix="bench-pyapi-")
    for name in ("asker", "other", "ready_asker"):
        os.makedirs(os.path.join(repo, name, "1"))
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(textwrap.dedent(CONFIG.format(name=name)))
        with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
            # ready_asker defines is_ready(): asked about itself, the
            # server must get the answer from its worker
            f.write(textwrap.dedent(MODEL) + ("\n    def is_ready(self):\n        return True\n"
                                              if name == "ready_asker" else ""))
    s = Server(repo, [])
    try:
        for target in ("other", "asker", "ready_asker", "metric.increment", "metric.value"):
            body = {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1],
                                "data": [json.dumps([target, calls])]}]}
            asker = "ready_asker" if target == "ready_asker" else "asker"
            r = requests.post(f"{s.http_url}/v2/models/{asker}/infer", json=body, timeout=600)
            us = float(r.json()["outputs"][0]["data"][0])
            what = (f"Metric.{target[7:]}()" if target.startswith("metric")
                    else f"is_model_ready({target!r})")
            print(f"{what} from {asker!r}: {us:.1f} us/call ({calls} calls)")
    finally:
        s.stop()


if __name__ == "__main__":
    np.random.seed(0)
    main()
