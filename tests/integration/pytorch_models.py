"""TorchScript test models for the pytorch backend, generated with Debian's
python3-torch (run with /usr/bin/python3).

    /usr/bin/python3 tests/integration/pytorch_models.py <repository-dir>

writes a model repository with every model below (config.pbtxt + 1/model.pt).
With --sequence it writes the sequence-batcher models (SEQUENCE_MODELS);
with --broken, models that must fail to load (BROKEN maps
each to the expected error text). Importable: MODELS maps name -> (module
factory, config text).
"""
import os
import sys
from typing import Dict, List

import torch


class AddSub(torch.nn.Module):
    def forward(self, INPUT0, INPUT1):
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class ArgNames(torch.nn.Module):
    # Config lists "y" before "x": mapping must follow the argument names.
    def forward(self, x, y):
        return x - y


class TupleOut(torch.nn.Module):
    def forward(self, x):
        return x * 2.0, x.to(torch.int64), x > 0.0


class Batched(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


class AllTypes(torch.nn.Module):
    def forward(self, b, u8, i8, i16, i32, i64, f16, f32, f64):
        return (torch.logical_not(b), u8 + 1, i8 - 1, i16 * 2, i32 + 7, i64 * -1,
                f16 * 2.0, f32 / 2.0, f64 + 0.25)


class Strings(torch.nn.Module):
    def forward(self, x: List[str]) -> List[str]:
        return [s.upper() + "!" for s in x]


class Accumulator(torch.nn.Module):
    """Stateful: keeps a running sum per instance. START__1 resets it; the
    sum only advances when READY__2 is set."""

    def __init__(self):
        super().__init__()
        self.acc = torch.zeros(1, dtype=torch.int32)

    def forward(self, INPUT__0, START__1, READY__2):
        if bool(START__1[0] != 0):
            self.acc = torch.zeros(1, dtype=torch.int32)
        if bool(READY__2[0] != 0):
            self.acc = self.acc + INPUT__0
        return self.acc.clone()


class StateAccumulator(torch.nn.Module):
    """Implicit-state accumulator: the sum travels in ACC_IN__3/ACC_OUT__1."""

    def forward(self, INPUT__0, START__1, READY__2, ACC_IN__3):
        acc = ACC_IN__3 * (1 - START__1)
        out = acc + INPUT__0 * READY__2
        return out, out


class DictIn(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]):
        return inputs["a"] * inputs["b"]


def io(kind, entries):
    parts = []
    for name, dtype, dims in entries:
        parts.append(f'  {{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ] }}')
    return f"{kind} [\n" + ",\n".join(parts) + "\n]\n"


def config(name, max_batch, inputs, outputs, extra=""):
    return (f'name: "{name}"\nplatform: "pytorch_libtorch"\nmax_batch_size: {max_batch}\n'
            + io("input", inputs) + io("output", outputs) + extra)


ALL_TYPES = ["TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32",
             "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64"]


def _all_types_config(name):
    ins = [(f"IN{i}_{t[5:]}__{i}", t, [4]) for i, t in enumerate(ALL_TYPES)]
    outs = [(f"OUT{i}_{t[5:]}__{i}", t, [4]) for i, t in enumerate(ALL_TYPES)]
    return config(name, 0, ins, outs)


def _traced_batched():
    return torch.jit.trace(Batched(), torch.zeros(2, 4))


MODELS = {
    "pt_add_sub": (lambda: torch.jit.script(AddSub()), config(
        "pt_add_sub", 0,
        [("INPUT__0", "TYPE_FP32", [16]), ("INPUT__1", "TYPE_FP32", [16])],
        [("OUTPUT__0", "TYPE_FP32", [16]), ("OUTPUT__1", "TYPE_FP32", [16])])),
    "pt_arg_names": (lambda: torch.jit.script(ArgNames()), config(
        "pt_arg_names", 0,
        [("y", "TYPE_FP32", [-1]), ("x", "TYPE_FP32", [-1])],
        [("diff", "TYPE_FP32", [-1])])),
    "pt_tuple": (lambda: torch.jit.script(TupleOut()), config(
        "pt_tuple", 0,
        [("X__0", "TYPE_FP32", [3])],
        [("BOOL__2", "TYPE_BOOL", [3]), ("DOUBLE__0", "TYPE_FP32", [3]),
         ("LONG__1", "TYPE_INT64", [3])])),
    "pt_batched": (_traced_batched, config(
        "pt_batched", 8,
        [("INPUT__0", "TYPE_FP32", [4])],
        [("OUTPUT__0", "TYPE_FP32", [4])],
        "dynamic_batching { max_queue_delay_microseconds: 20000 }\n")),
    "pt_all_types": (lambda: torch.jit.script(AllTypes()), _all_types_config("pt_all_types")),
    "pt_strings": (lambda: torch.jit.script(Strings()), config(
        "pt_strings", 0,
        [("TEXT__0", "TYPE_STRING", [-1])],
        [("UPPER__0", "TYPE_STRING", [-1])])),
    "pt_accumulator": (lambda: torch.jit.script(Accumulator()), config(
        "pt_accumulator", 0,
        [("INPUT__0", "TYPE_INT32", [1]), ("START__1", "TYPE_INT32", [1]),
         ("READY__2", "TYPE_INT32", [1])],
        [("OUTPUT__0", "TYPE_INT32", [1])])),
    "pt_dict": (lambda: torch.jit.script(DictIn()), config(
        "pt_dict", 0,
        [("b", "TYPE_FP32", [2]), ("a", "TYPE_FP32", [2])],
        [("OUTPUT__0", "TYPE_FP32", [2])])),
}


_SEQ_CONTROLS = """sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY__2" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
"""

# Models served through the sequence batcher: controls (and implicit state)
# come from sequence_batching, not from the request.
SEQUENCE_MODELS = {
    "pt_seq_accumulator": (lambda: torch.jit.script(Accumulator()), config(
        "pt_seq_accumulator", 0,
        [("INPUT__0", "TYPE_INT32", [1])],
        [("OUTPUT__0", "TYPE_INT32", [1])],
        _SEQ_CONTROLS + "}\n")),
    "pt_seq_state": (lambda: torch.jit.script(StateAccumulator()), config(
        "pt_seq_state", 0,
        [("INPUT__0", "TYPE_INT32", [1])],
        [("OUTPUT__0", "TYPE_INT32", [1])],
        _SEQ_CONTROLS + '  state [ { input_name: "ACC_IN__3" output_name: "ACC_OUT__1" '
        "data_type: TYPE_INT32 dims: [ 1 ] } ]\n}\n")),
}


def write_model(repo, name, module, config_text, filename="model.pt"):
    """Writes <repo>/<name>/config.pbtxt and, when module is not None,
    <repo>/<name>/1/<filename>."""
    d = os.path.join(repo, name)
    os.makedirs(os.path.join(d, "1"), exist_ok=True)
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write(config_text)
    if module is not None:
        module.save(os.path.join(d, "1", filename))
    return d


def _add_sub_cfg(name, inputs=2, extra=""):
    ins = [(f"INPUT__{i}", "TYPE_FP32", [16]) for i in range(inputs)]
    return config(name, 0, ins, [("OUTPUT__0", "TYPE_FP32", [16])], extra)


# name -> (write a model.pt? | bytes for model.pt, config, expected load error)
BROKEN = {
    "pt_missing": (None, _add_sub_cfg("pt_missing"), "unable to find '"),
    "pt_count": (True, _add_sub_cfg("pt_count", inputs=1),
                 "unable to load model 'pt_count', configuration expects 1 inputs, model provides 2"),
    # Triton's L0_model_config pytorch/too_few_inputs: no input in the config
    "pt_no_inputs": (True, config("pt_no_inputs", 0, [], [("OUTPUT__0", "TYPE_FP32", [16])]),
                     "unable to load model 'pt_no_inputs', configuration expects 0 inputs, "
                     "model provides 2"),
    "pt_corrupt": (b"not a torchscript archive", _add_sub_cfg("pt_corrupt"),
                   "failed to load model 'pt_corrupt'"),
    "pt_gpu": (True, _add_sub_cfg("pt_gpu", extra="instance_group [ { kind: KIND_GPU } ]\n"),
               "KIND_GPU"),
    "pt_uint16": (True, config("pt_uint16", 0, [("INPUT__0", "TYPE_UINT16", [16]),
                                                ("INPUT__1", "TYPE_FP32", [16])],
                               [("OUTPUT__0", "TYPE_FP32", [16])]),
                  "unsupported datatype TYPE_UINT16 for input 'INPUT__0' for model 'pt_uint16'"),
    "pt_bad_param": (True, _add_sub_cfg(
        "pt_bad_param", extra='parameters: { key: "INFERENCE_MODE" value: { string_value: "maybe" } }\n'),
        "failed to convert 'maybe' to boolean for parameter 'INFERENCE_MODE'"),
}


def write_broken(repo):
    for name, (model, cfg, _) in BROKEN.items():
        d = write_model(repo, name, torch.jit.script(AddSub()) if model is True else None, cfg)
        if isinstance(model, bytes):
            with open(os.path.join(d, "1", "model.pt"), "wb") as f:
                f.write(model)


def write_sequence(repo):
    for name, (factory, cfg) in SEQUENCE_MODELS.items():
        write_model(repo, name, factory(), cfg)


def write_all(repo, names=None):
    for name, (factory, cfg) in MODELS.items():
        if names is None or name in names:
            write_model(repo, name, factory(), cfg)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: pytorch_models.py <repository-dir> [--broken | --sequence | model ...]")
    if sys.argv[2:] == ["--broken"]:
        write_broken(sys.argv[1])
    elif sys.argv[2:] == ["--sequence"]:
        write_sequence(sys.argv[1])
    else:
        write_all(sys.argv[1], sys.argv[2:] or None)
