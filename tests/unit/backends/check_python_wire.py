#!/usr/bin/python3
"""Checks the Python side of the python backend's wire format against the C
side (backends/python/python_wire.h), which test_python_wire_sync.c writes
as JSON to the file named by argv[1]: its constants, its datatype codes,
and messages its encoders built from known values.

The Python side is the stub's wire module (what a worker speaks) and
bench/bench_python_stub.py (the fake server tests drive the worker with).
Every constant either module defines under a C name must have the C value
(the stub's must define all of REQUIRED); the datatype order must be C's;
the same known values packed with the Python layouts must give the C bytes.
Then the worker's side is packed here (a BLS_CALL, two DONEs) and printed
as "<kind> <hex>" lines for the C test to decode with its own decoders.
Exit status 1 on any difference, with the differences on stderr.
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "backends", "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from nereid_stub import wire  # noqa: E402
import bench_python_stub as bench  # noqa: E402

REQUIRED = ("M_INIT", "M_EXECUTE", "M_FINALIZE", "M_BLS_RESULT", "M_CANCEL_ANSWER",
            "M_READY_QUERY", "M_SPIN_PAGE", "M_BODY_MAP", "M_READY", "M_DONE", "M_LOG",
            "M_RESPONSE", "M_BLS_CALL", "M_CANCEL_QUERY", "M_FINALIZED", "M_API_ANSWER",
            "M_API_CALL", "M_BLS_CANCEL", "M_READY_ANSWER", "RECV_MAX", "INLINE_MAX", "ALIGN",
            "BLS_SLOTS", "BLS_REGION_MAX", "BODY_SLOTS", "BODY_WHERE", "M_REGION",
            "M_SLOT_SHIFT", "M_SLOT_MASK", "DONE_RESPONSES", "DONE_ERROR", "DONE_DECOUPLED",
            "RESP_OUTPUTS", "RESP_ERROR", "RESP_RESCHEDULE", "BLS_OUTPUTS", "BLS_ERROR",
            "BLS_EMPTY")

errors = []


def expect(what, got, want, ref="C"):
    if got != want:
        errors.append(f"{what}: Python {got!r}, {ref} {want!r}")


def check_module(label, mod, c, required=()):
    for name in required:
        if not hasattr(mod, name):
            errors.append(f"{label}: {name} is not defined")
    for name, value in c["consts"].items():
        if hasattr(mod, name):
            expect(f"{label}.{name}", getattr(mod, name), value)
    expect(f"{label}.HDR.size", mod.HDR.size, c["consts"]["HDR_BYTES"])
    expect(f"{label}.DT_NAMES", list(mod.DT_NAMES), c["datatypes"])
    s = c["samples"]
    k = c["consts"]
    expect(f"{label}.HDR", mod.HDR.pack(k["M_DONE"] | k["M_REGION"] | 2 << k["M_SLOT_SHIFT"],
                                        0x01020304, 0x0506070809).hex(), s["hdr"])
    expect(f"{label}.EXEC_REQ", mod.EXEC_REQ.pack(3, 2, 5, 7, -1, 11, 42, 1000, -1).hex(),
           s["exec_req"])
    expect(f"{label}.EXEC_REQ (string id)", mod.EXEC_REQ.pack(1, 1, 0, 0, 6, 0, 0, 0, 9).hex(),
           s["exec_req_str"])


def main():
    with open(sys.argv[1]) as f:
        c = json.load(f)
    k = c["consts"]
    check_module("stub wire", wire, c, REQUIRED)
    check_module("bench_python_stub", bench, c)
    s = c["samples"]
    expect("stub wire.tensor_record",
           wire.tensor_record("IN", "FP32", [2, 3], k["BODY_WHERE"] + 1, 64, 24).hex(),
           s["tensor"])
    expect("bench_python_stub.tensor_record",
           bench.tensor_record("IN", "FP32", [2, 3], 64, 24, k["BODY_WHERE"] + 1).hex(),
           s["tensor"])
    # The bench parses DONEs with its own copies of the stub's layouts
    # (the stub's are checked against the C decoders below).
    for name in ("HDR", "U32", "EXEC_REQ", "TENSOR", "DONE_RESP", "DONE_HEAD"):
        if hasattr(bench, name):
            expect(f"bench_python_stub.{name}.format", getattr(bench, name).format,
                   getattr(wire, name).format, "the stub's wire")
    expect("stub wire.BLS_CALL.size", wire.BLS_CALL.size, k["BLS_FIXED"])
    expect("stub wire.BLS_RES",
           (wire.BLS_RES.pack(77, wire.BLS_ERROR, 1, 3, 4, 0, 0) + b"boom").hex(), s["bls_res"])
    if errors:
        for e in errors:
            print(e, file=sys.stderr)
        return 1
    # The worker's side, for the C decoders (values the C test expects).
    bls_call = (wire.BLS_CALL.pack(7, -1, 42, 1000, 3, 1, -1, 1, 1, 0, 1, 1, 2) + b"m" + b"r" +
                wire.U32.pack(3) + b"OUT" + wire.tensor_record("IN", "FP32", [2], 0, 0, 8))
    done = (wire.DONE_HEAD.pack(wire.DONE_RESPONSES, 1) +
            wire.DONE_RESP.pack(wire.RESP_OUTPUTS, 1, 0, 0, 0) +
            wire.tensor_record("OUT", "FP32", [2], 0, 0, 8))
    print("bls_call", bls_call.hex())
    print("done", done.hex())
    print("done_error", wire.done_error("boom").hex())
    return 0


if __name__ == "__main__":
    sys.exit(main())
