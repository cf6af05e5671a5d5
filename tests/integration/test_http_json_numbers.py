"""JSON tensor numbers on the HTTP frontend: NaN/Infinity literals in and
out, the full UINT64/INT64 ranges, shortest round-trip printing, rapidjson's
syntax error texts, and large (flat and nested) JSON tensors."""
import json
import re

import numpy as np
import pytest

from http_helpers import build_infer, http_server, infer  # noqa: F401


def post(server, model, text, headers=None):
    return infer(server, model, text.encode() if isinstance(text, str) else text, headers)


def req(dt, data_text, shape, extra=""):
    return ('{"inputs":[{"name":"INPUT0","datatype":"%s","shape":%s,"data":%s}]%s}'
            % (dt, json.dumps(shape), data_text, extra))


def binary_out(extra=""):
    return ',"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]' + extra


def data_text(resp):
    """The raw text of the first output's data array."""
    m = re.search(r'"data":\[([^\]]*)\]', resp.text)
    assert m, resp.text
    return m.group(1).split(",")


def raw_tail(resp, dtype):
    n = int(resp.headers["Inference-Header-Content-Length"])
    return np.frombuffer(resp.content[n:], dtype=dtype)


def test_nan_infinity_literals_in(http_server):
    r = post(http_server, "id_fp32",
             req("FP32", "[NaN,-NaN,Infinity,-Infinity,Inf,-Inf,1.5]", [1, 7], binary_out()))
    assert r.status_code == 200, r.text
    got = raw_tail(r, np.float32)
    assert np.isnan(got[0]) and np.isnan(got[1])
    assert list(got[2:]) == [np.inf, -np.inf, np.inf, -np.inf, 1.5]


def test_nan_infinity_literals_out(http_server):
    r = post(http_server, "id_fp64", req("FP64", "[NaN, Infinity, -Infinity, -0.0, 0]", [1, 5]))
    assert r.status_code == 200, r.text
    assert data_text(r) == ["NaN", "Infinity", "-Infinity", "-0.0", "0.0"]


@pytest.mark.parametrize("bad", ["Nan", "-Infinit", "infinity", "+1", "01", "1.", "1e", ".5"])
def test_bad_number_literals(http_server, bad):
    r = post(http_server, "id_fp32", req("FP32", f"[{bad}]", [1, 1]))
    assert r.status_code == 500
    assert r.json()["error"].startswith("failed to parse the request JSON buffer: ")


def test_uint64_full_range(http_server):
    vals = [0, 1, 2**63 - 1, 2**63, 2**64 - 1]
    r = post(http_server, "id_uint64", req("UINT64", json.dumps(vals), [1, 5]))
    assert r.status_code == 200, r.text
    assert [int(t) for t in data_text(r)] == vals
    r = post(http_server, "id_uint64", req("UINT64", json.dumps(vals), [1, 5], binary_out()))
    assert list(raw_tail(r, np.uint64)) == vals


@pytest.mark.parametrize("dt,value,kind", [
    ("UINT64", "18446744073709551616", "unsigned-integer"),  # 2^64: a double for rapidjson
    ("UINT64", "-1", "unsigned-integer"),
    ("UINT64", "1.0", "unsigned-integer"),
    ("INT64", "9223372036854775808", "signed-integer"),  # 2^63
    ("INT32", "NaN", "signed-integer"),
    ("BOOL", "1", "boolean"),
    ("FP32", "\"1\"", "float"),
    ("FP64", "null", "double"),
])
def test_number_type_errors(http_server, dt, value, kind):
    r = post(http_server, f"id_{dt.lower()}", req(dt, f"[{value}]", [1, 1]))
    assert r.status_code == 500, r.text
    assert r.json()["error"] == f"Unable to parse 'data': attempt to access JSON non-{kind} as {kind}"


def test_int64_extremes(http_server):
    vals = [-2**63, -1, 0, 2**63 - 1]
    r = post(http_server, "id_int64", req("INT64", json.dumps(vals), [1, 4]))
    assert r.status_code == 200, r.text
    assert [int(t) for t in data_text(r)] == vals


def test_number_too_big(http_server):
    r = post(http_server, "id_fp64", req("FP64", "[1, 1e400]", [1, 2]))
    assert r.status_code == 500
    assert r.json()["error"].startswith(
        "failed to parse the request JSON buffer: Number too big to be stored in double. at ")


def n_digits(tok):
    """Significant digits of a printed number."""
    mantissa = re.sub(r"[eE].*", "", tok).lstrip("-").replace(".", "")
    return len(mantissa.strip("0")) or 1


def test_fp32_widened_shortest_double(http_server):
    """FP32 outputs print as Triton writes them: widened to double, then
    rapidjson's Grisu2 digits (at most 17 that read back as that double;
    usually but not always the shortest, and the last digit not always the
    nearest) in rapidjson's layout."""
    rng = np.random.default_rng(7)
    vals = np.concatenate([
        np.array([0.1, 0.5, 1.5, 16777216.0, 1e10, 3.4028235e38, 1e-7, 1.17549435e-38,
                  1.4e-45, 123456.79, -2.5, 100.0, 1e21, 2.0 ** -20, 0.375], dtype=np.float32),
        (rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000)).astype(np.float32),
    ])
    body = req("FP32", json.dumps([float(v) for v in vals]), [1, len(vals)])
    r = post(http_server, "id_fp32", body)
    assert r.status_code == 200, r.text
    tokens = data_text(r)
    assert len(tokens) == len(vals)
    for tok, v in zip(tokens, vals):
        assert float(tok) == float(v), (tok, v)
        assert n_digits(tok) <= 17, (tok, v)
    assert tokens[:3] == ["0.10000000149011612", "0.5", "1.5"]
    assert tokens[3:5] == ["16777216.0", "10000000000.0"]
    # Grisu2's last digit: Python's repr (the nearest) would be ...886e38.
    assert tokens[5] == "3.4028234663852887e38" and tokens[6] == "1.0000000116860974e-7"
    assert tokens[10:15] == ["-2.5", "100.0", "1.0000000200408774e21", "9.5367431640625e-7",
                             "0.375"]


def test_fp64_round_trip(http_server):
    rng = np.random.default_rng(11)
    vals = np.concatenate([np.array([0.1, 1 / 3, 2.0 ** -1074, 1.7976931348623157e308, 5e-324,
                                     123.456, -1e-300]),
                           rng.standard_normal(300) * 10.0 ** rng.integers(-300, 300, 300)])
    r = post(http_server, "id_fp64", req("FP64", json.dumps([float(v) for v in vals]),
                                         [1, len(vals)]))
    assert r.status_code == 200, r.text
    tokens = data_text(r)
    assert [float(t) for t in tokens] == [float(v) for v in vals]
    for tok, v in zip(tokens, vals):
        assert n_digits(tok) <= 17, (tok, v)
    assert tokens[0] == "0.1" and tokens[5] == "123.456" and tokens[4] == "5e-324"


def test_large_json_tensor_flat_and_nested(http_server):
    n = 65536
    vals = (np.arange(n, dtype=np.float64) * 0.37 - 1000).astype(np.float32)
    flat = json.dumps([float(v) for v in vals])
    r = post(http_server, "id_fp32", req("FP32", flat, [1, n], binary_out()))
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(raw_tail(r, np.float32), vals)
    nested = json.dumps(vals.reshape(256, 256).astype(np.float64).tolist())
    r = post(http_server, "id_fp32", req("FP32", nested, [1, n]))  # only leaves count
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [1, n]
    np.testing.assert_array_equal(np.array(out["data"], dtype=np.float32), vals)


def test_large_json_int_and_bytes(http_server):
    n = 20000
    ints = list(range(-n // 2, n // 2))
    r = post(http_server, "id_int32", req("INT32", json.dumps(ints), [1, n]))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ints
    strs = [f"s{i}\u00e9\"\\\n" for i in range(2000)] + ["\U0001F600", ""]
    r = post(http_server, "id_bytes", req("BYTES", json.dumps(strs), [1, len(strs)]))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == strs


def test_large_json_tensor_read_and_written_in_parts(http_server):
    """Arrays of 40,000 numbers are read and written in parts on idle cores
    (src/http/par.c): whitespace around any comma reads the same, the text
    written is the one-run text, and a broken array is refused with the
    error a small one gets, wherever in the array the fault is."""
    n = 40000
    rng = np.random.default_rng(7)
    vals = (rng.standard_normal(n) * 1000).astype(np.float32)
    toks = [repr(float(v)) for v in vals]
    seps = [", ", " ,", ",\n", ",", " , "]
    text = "[" + "".join(t + seps[i % 5] for i, t in enumerate(toks[:-1])) + toks[-1] + " ]"
    r = post(http_server, "id_fp32", req("FP32", text, [1, n]))
    assert r.status_code == 200, r.text
    written = data_text(r)
    assert np.array_equal(np.array(written, dtype=np.float64).astype(np.float32), vals)
    one_run = []  # the same values in requests too small to split
    for i in range(0, n, 10000):
        r = post(http_server, "id_fp32", req("FP32", json.dumps(toks[i:i + 10000]).replace('"', ""),
                                             [1, 10000]))
        one_run += data_text(r)
    assert written == one_run

    def error(tokens, shape):
        r = post(http_server, "id_fp32", req("FP32", "[" + ",".join(tokens) + "]", shape))
        assert r.status_code != 200, r.text
        return re.sub(r"[0-9]+", "N", r.json()["error"])

    small = error(["1", "2x", "3"], [1, 3])
    for at in (0, n // 4, n // 2 - 1, n // 2, n // 2 + 1, 3 * n // 4, n - 1):
        broken = list(toks)
        broken[at] = "2x"
        assert error(broken, [1, n]) == small, at
    assert error(toks + ["1"], [1, n]) == error(["1", "2"], [1, 1])
    assert error(toks[:-1], [1, n]) == error(["1"], [1, 2])


@pytest.mark.parametrize("text,message", [
    ("", "The document is empty."),
    ("{\"inputs\":[}", "Invalid value."),
    ("{\"inputs\" []}", "Missing a colon after a name of object member."),
    ("{\"inputs\":[] x}", "Missing a comma or '}' after an object member."),
    ("{\"inputs\":[1 2]}", "Missing a comma or ']' after an array element."),
    ("{inputs:1}", "Missing a name for object member."),
    ("{\"id\":\"abc}", "Missing a closing quotation mark in string."),
    ("{\"id\":\"\\x\"}", "Invalid escape character in string."),
    ("{\"id\":\"\\u12G4\"}", "Incorrect hex digit after \\u escape in string."),
    ("{\"id\":\"\\ud800\"}", "The surrogate pair in string is invalid."),
    ("{} {}", "The document root must not be followed by other values."),
])
def test_syntax_error_texts(http_server, text, message):
    r = post(http_server, "id_fp32", text)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err.startswith(f"failed to parse the request JSON buffer: {message} at "), err


def test_invalid_utf8_refused(http_server):
    r = post(http_server, "id_fp32", b'{"id":"\xff","inputs":[]}')
    assert r.status_code == 500
    assert "Invalid encoding in string." in r.json()["error"]


def test_parameters_keep_number_types(http_server):
    extra = ',"parameters":{"big":18446744073709551615,"neg":-3,"real":NaN,"s":"x"}'
    r = post(http_server, "id_fp32", req("FP32", "[1]", [1, 1], extra))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("dt,np_t", [("FP32", np.float32), ("FP64", np.float64)])
def test_random_values_print_shortest(http_server, dt, np_t):
    """20,000 random values sent in binary come back in JSON as Triton's
    writer prints them (rapidjson's Grisu2): text that reads back, at most 17
    digits, longer than the shortest (Python's repr) only rarely."""
    rng = np.random.default_rng(3)
    n = 20000
    bits = rng.integers(0, 2**63, n // 4, dtype=np.int64).view(np.float64)  # any exponent
    with np.errstate(over="ignore"):
        vals = (rng.standard_normal(n) * 10.0 ** rng.integers(-14, 46, n)).astype(np_t)
        vals[: n // 4] = np.where(np.isfinite(bits), bits, 1.0).astype(np_t)
    vals[~np.isfinite(vals)] = 1.0
    body, headers = build_infer([{"name": "INPUT0", "datatype": dt,
                                  "data": vals.reshape(1, n), "binary": True}])
    r = infer(http_server, f"id_{dt.lower()}", body, headers)
    assert r.status_code == 200, r.text
    tokens = data_text(r)
    assert [float(t) for t in tokens] == [float(v) for v in vals]
    assert max(n_digits(t) for t in tokens) <= 17
    longer = [(t, repr(float(v))) for t, v in zip(tokens, vals)
              if n_digits(t) > n_digits(repr(float(v)))]
    assert len(longer) < n // 100, longer[:5]


@pytest.mark.parametrize("dt,value,rng", [
    ("UINT8", "300", "0 to 255"),
    ("UINT8", "256", "0 to 255"),
    ("INT8", "-129", "-128 to 127"),
    ("INT8", "128", "-128 to 127"),
    ("UINT16", "65536", "0 to 65535"),
    ("INT16", "-32769", "-32768 to 32767"),
    ("INT32", "3000000000", "-2147483648 to 2147483647"),
    ("INT32", "-2147483649", "-2147483648 to 2147483647"),
    ("UINT32", "4294967296", "0 to 4294967295"),
])
def test_integer_out_of_range_is_an_error(http_server, dt, value, rng):
    """A deliberate difference from Triton (which casts: 300 as UINT8 becomes
    44): an integer outside its datatype's range is refused, naming the input
    and the value, at any position and on both the block and serial readers."""
    want = (f"value {value} of input 'INPUT0' is out of range for datatype {dt} ({rng})")
    for vals in ([value], ["1"] * 40 + [value] + ["2"] * 40, [value] + ["1"] * 99):
        text = "[" + ",".join(vals) + "]"
        r = post(http_server, f"id_{dt.lower()}", req(dt, text, [1, len(vals)]))
        assert r.status_code == 400, r.text
        assert r.json()["error"] == want
        nested = "[[" + "],[".join(vals) + "]]"
        r = post(http_server, f"id_{dt.lower()}", req(dt, nested, [1, len(vals)]))
        assert r.status_code == 400, r.text
        assert r.json()["error"] == want


@pytest.mark.parametrize("dt,lo,hi", [
    ("UINT8", 0, 255), ("INT8", -128, 127), ("UINT16", 0, 65535), ("INT16", -32768, 32767),
    ("INT32", -2**31, 2**31 - 1), ("UINT32", 0, 2**32 - 1),
])
def test_integer_range_edges_accepted(http_server, dt, lo, hi):
    vals = [lo, hi] * 40
    r = post(http_server, f"id_{dt.lower()}", req(dt, json.dumps(vals), [1, len(vals)]))
    assert r.status_code == 200, r.text
    assert [int(t) for t in data_text(r)] == vals
