"""The model the Python zygote starts once in a probe worker to learn which
pages a worker touches (nereid_python_stub.py, "Pre-faulting"). A typical
model.py: pb_utils and numpy imported, the config parsed in initialize."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.dtype = np.float32

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
