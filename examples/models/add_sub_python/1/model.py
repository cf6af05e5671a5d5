"""add_sub_python: the sum and the difference of two FP32[4] tensors.

A minimal Triton Python-backend model; it runs unchanged under Triton.
"""
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.out_dtypes = {
            name: pb_utils.triton_string_to_numpy(
                pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        }

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.out_dtypes["OUTPUT0"])),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.out_dtypes["OUTPUT1"])),
            ]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub_python: finalize")
