"""Nereid's triton_python_backend_utils: the API a Triton model.py imports
as pb_utils.

Everything here runs inside a model's worker process (nereid_python_stub.py).
The worker installs itself as `_worker`; the objects that talk to the server
(BLS, response senders, the logger, cancellation) go through it. Tensors are
numpy arrays; BYTES tensors are object arrays of bytes.
"""
import ctypes
import json
import struct
import threading

import numpy as np

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 1
TRITONSERVER_MEMORY_CPU = 0

_worker = None  # set by the stub

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType codes, protocol names and numpy types, in one table.
_TYPES = [
    (1, "BOOL", np.bool_),
    (2, "UINT8", np.uint8),
    (3, "UINT16", np.uint16),
    (4, "UINT32", np.uint32),
    (5, "UINT64", np.uint64),
    (6, "INT8", np.int8),
    (7, "INT16", np.int16),
    (8, "INT32", np.int32),
    (9, "INT64", np.int64),
    (10, "FP16", np.float16),
    (11, "FP32", np.float32),
    (12, "FP64", np.float64),
    (13, "BYTES", np.object_),
    (14, "BF16", None),
]
_CODE_TO_NAME = {c: n for c, n, _ in _TYPES}
_NAME_TO_CODE = {n: c for c, n, _ in _TYPES}
_NAME_TO_NUMPY = {n: t for _, n, t in _TYPES}
_NUMPY_TO_NAME = {np.dtype(t): n for _, n, t in _TYPES if t is not None and t is not np.object_}


def triton_string_to_numpy(triton_type_string):
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type):
    if data_type == 13:
        return np.object_
    t = _NAME_TO_NUMPY.get(_CODE_TO_NAME.get(data_type))
    return bool if t is np.bool_ else t


def numpy_to_triton_type(data_type):
    if data_type == np.object_ or data_type == np.bytes_:
        return 13
    try:
        name = _NUMPY_TO_NAME.get(np.dtype(data_type))
    except TypeError:
        return None
    return _NAME_TO_CODE.get(name) if name else None


def serialize_byte_tensor(input_tensor):
    """4-byte little-endian length + bytes per element, C order, as uint8."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        raise TritonModelException("cannot serialize bytes tensor: invalid datatype")
    parts = []
    for item in input_tensor.flat:
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor):
    """The 1-D object array of bytes held by a serialized BYTES buffer."""
    buf = bytes(encoded_tensor)
    out, off = [], 0
    while off < len(buf):
        (n,) = struct.unpack_from("<I", buf, off)
        off += 4
        out.append(buf[off:off + n])
        off += n
    return np.array(out, dtype=np.object_)


def get_input_tensor_by_name(inference_request, name):
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response, name):
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config, name):
    for c in model_config.get("input", []):
        if c["name"] == name:
            return c
    return None


def get_output_config_by_name(model_config, name):
    for c in model_config.get("output", []):
        if c["name"] == name:
            return c
    return None


def using_decoupled_model_transaction_policy(model_config):
    return model_config.get("model_transaction_policy", {}).get("decoupled", False)


def get_model_dir():
    return _worker.model_dir if _worker else ""


class TritonError(Exception):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=1):
        super().__init__(message)
        self._message = str(message)
        self._code = int(code)

    def message(self):
        return self._message

    def code(self):
        return self._code


class TritonModelException(Exception):
    pass


class PreferredMemory:
    def __init__(self, preferred_memory_type=TRITONSERVER_MEMORY_CPU, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class Tensor:
    """A named tensor: a numpy array, or raw bytes for BF16."""

    def __init__(self, name, array, _dtype=None):
        if not isinstance(name, str) or not isinstance(array, np.ndarray):
            raise TypeError("Tensor(name: str, array: numpy.ndarray)")
        if name == "":
            raise TritonModelException("Tensor name cannot be an empty string.")
        if _dtype is None:
            # a numeric dtype first: one dict look-up (never object or bytes)
            _dtype = _NUMPY_TO_NAME.get(array.dtype)
            if _dtype is None:
                if array.dtype == np.object_ or array.dtype.type == np.bytes_:
                    _dtype = "BYTES"
                else:
                    raise TritonModelException("NumPy dtype is not supported.")
        if _dtype != "BYTES" and not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._dtype = _dtype

    def name(self):
        return self._name

    def as_numpy(self):
        if self._dtype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. "
                "Use to_dlpack() and from_dlpack() instead.")
        return self._array

    def triton_dtype(self):
        return _NAME_TO_CODE[self._dtype]

    def shape(self):
        return list(self._array.shape)

    def is_cpu(self):
        return True

    def to_dlpack(self):
        if self._dtype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        array = self._array
        if not array.flags.writeable:
            # numpy's DLPack export refuses a read-only array (a small input
            # arrives in the worker's read-only message bytes); Triton's
            # tensors are writable, so the consumer gets a copy of its own.
            array = array.copy()
        capsule = array.__dlpack__()
        if self._dtype == "BF16":
            _dlpack_retype(capsule, _KDL_UINT, _KDL_BFLOAT)
        return capsule

    def __dlpack__(self, stream=None):
        return self.to_dlpack()

    def __dlpack_device__(self):
        return (1, 0)

    @staticmethod
    def from_dlpack(name, dlpack_tensor):
        if not isinstance(name, str) or name == "" or dlpack_tensor is None:
            raise TritonModelException("from_dlpack needs a tensor name and a DLPack tensor")
        try:
            capsule = dlpack_tensor
            if type(capsule).__name__ != "PyCapsule":
                capsule = dlpack_tensor.__dlpack__()
            # numpy has no bfloat16: a BF16 tensor is taken as its 16-bit words
            bf16 = _dlpack_retype(capsule, _KDL_BFLOAT, _KDL_UINT)
            arr = np.from_dlpack(_Capsule(capsule))
        except (AttributeError, TypeError, ValueError, RuntimeError, BufferError) as e:
            raise TritonModelException(str(e))
        if not arr.flags["C_CONTIGUOUS"]:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are "
                "stored in C-Order are supported.")
        return Tensor(name, arr, "BF16" if bf16 else None)


# DLPack's element type codes, and the head of its DLTensor (the first
# member of a DLManagedTensor, which a "dltensor" capsule points to).
_KDL_UINT = 1
_KDL_BFLOAT = 4


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensorHead(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_retype(capsule, from_code, to_code):
    """Relabels the 16-bit elements of an unconsumed DLPack capsule from one
    type code to the other (BF16 <-> UINT16: same bits, and numpy knows only
    the second); True when it did. The memory and its owner stay as they
    are."""
    head = _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor"))
    dtype = head.dtype
    if dtype.code != from_code or dtype.bits != 16 or dtype.lanes != 1:
        return False
    dtype.code = to_code
    return True


class _Capsule:
    """Lets np.from_dlpack take a bare capsule (torch.utils.dlpack.to_dlpack)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)


def _check_parameters(parameters):
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        json.loads(parameters)
        return parameters
    if not isinstance(parameters, dict):
        # Triton's text (pybind11's typeid name of py::dict)
        raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
    for k, v in parameters.items():
        if not isinstance(k, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(k)}")
        if not isinstance(v, (bool, int, str)):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(v)}")
    return json.dumps(parameters)


class InferenceTrace:
    def __init__(self, context=None):
        self._context = context

    def get_context(self):
        return self._context


class InferenceRequest:
    """A request given to execute, or a BLS request built by the model."""

    def __init__(self, model_name, inputs, requested_output_names, request_id="",
                 correlation_id=0, model_version=-1, flags=0, timeout=0,
                 preferred_memory=None, trace=None, parameters=None):
        # Like pybind11's std::string, names may be given as bytes.
        if isinstance(model_name, bytes):
            model_name = model_name.decode("utf-8")
        if isinstance(request_id, bytes):
            request_id = request_id.decode("utf-8")
        if not isinstance(model_name, str) or not isinstance(inputs, list) or \
                not isinstance(requested_output_names, list) or \
                not isinstance(request_id, str) or not isinstance(model_version, int) or \
                not isinstance(flags, int) or not isinstance(timeout, int):
            raise TypeError("incompatible InferenceRequest arguments")
        if not isinstance(correlation_id, (int, str)):  # pybind11's signature check
            raise TypeError("Correlation ID must be integer or string")
        for t in inputs:
            if t is None:
                raise TritonModelException(
                    f"Input tensor for request with id '{request_id}' and model name "
                    f"'{model_name}' should not be empty.")
        for n in requested_output_names:
            if not isinstance(n, str):
                raise TypeError("requested output names must be str")
            if n == "":
                raise TritonModelException("requested output name should not be empty")
        self._model_name = model_name
        self._model_version = model_version
        self._inputs = inputs
        self._requested = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters = _check_parameters(parameters)
        self._trace = trace or InferenceTrace()
        self._sender = None
        self._sender_id = None
        self._token = None  # the server's handle of a request given to execute
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    def model_name(self):
        return self._model_name

    def inputs(self):
        return self._inputs

    def requested_output_names(self):
        return set(self._requested)

    def request_id(self):
        return self._request_id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = flags

    def timeout(self):
        return self._timeout

    def parameters(self):
        return self._parameters

    def trace(self):
        return self._trace

    def set_release_flags(self, flags):
        # RESCHEDULE: the request runs again in a later batch (the model's
        # sequence batcher must have iterative_sequence; otherwise the server
        # fails the request with Triton's text).
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unsupported request release flags {flags}")
        self._release_flags = flags

    def release_flags(self):
        return self._release_flags

    def get_response_sender(self):
        if self._sender is None:
            if self._sender_id is not None:
                self._sender = InferenceResponseSender(self._sender_id, self._requested)
            elif self._token is not None:  # a request given to a non-decoupled execute
                self._sender = _SingleResponseSender(self._requested, self._token)
            else:
                raise TritonModelException(
                    "Unable to get the response sender: the request was not given to execute.")
        return self._sender

    def is_cancelled(self):
        if self._token is None or _worker is None:
            return False
        return _worker.is_cancelled(self._token)

    def exec(self, decoupled=False):
        return _worker.bls(self, decoupled)

    def async_exec(self, decoupled=False):
        import asyncio
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, _worker.bls, self, decoupled)


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None, parameters=None):
        if isinstance(output_tensors, tuple) and not output_tensors:
            output_tensors = []  # the default (None is refused, as pybind11 does)
        if not isinstance(output_tensors, list):
            raise TypeError("output_tensors must be a list")
        for t in output_tensors:
            if t is None:
                raise TritonModelException(
                    "Output tensor for inference response should not be empty.")
            if not isinstance(t, Tensor):
                raise TypeError("output_tensors must hold pb_utils.Tensor objects")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError("error must be a TritonError")
        self._outputs = output_tensors
        self._error = error
        self._parameters = "{}" if parameters is None else _check_parameters(parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


def _check_send_args(response, flags):
    """Triton's checks of a response sender's send() arguments."""
    if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
        raise TritonModelException("Unable to send response. Unsupported flag provided.")
    if flags == 0 and response is None:
        raise TritonModelException(
            "Inference Response object must be provided when the response flags is set "
            "to zero.")


class InferenceResponseSender:
    def __init__(self, sender_id, requested):
        self._id = sender_id
        self._requested = set(requested)
        self._closed = False
        self._lock = threading.Lock()

    def send(self, response=None, flags=0):
        _check_send_args(response, flags)
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed.")
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
        _worker.send_response(self._id, response, flags, self._requested)

    def is_cancelled(self):
        return _worker.is_cancelled({"sender": self._id}) if _worker else False

    def _close_with_error(self, error):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _worker.send_response(self._id, InferenceResponse(error=error),
                              TRITONSERVER_RESPONSE_COMPLETE_FINAL, self._requested)


class _SingleResponseSender(InferenceResponseSender):
    """The response sender of a request to a model that is not decoupled
    (Triton's rules: one response, and the final flag with it or after it).
    The worker answers the request with that response when execute returns,
    or waits for it when execute returned None in the request's place."""

    def __init__(self, requested, token):
        super().__init__(None, requested)
        self._token = token
        self._sent = 0
        self._response = None

    def send(self, response=None, flags=0):
        _check_send_args(response, flags)
        with self._lock:
            if response is not None and self._sent > 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response.")
            if response is None and self._sent == 0:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final "
                    "before sending a response.")
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed.")
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._closed = True
            self._sent += 1
            if response is not None:
                self._response = response
        if _worker:
            _worker.sender_progress()

    def is_cancelled(self):
        return _worker.is_cancelled(self._token) if _worker else False

    def _answered(self):
        """execute's return answered the request (as if sent with the final
        flag): the sender is closed. False when it had already sent."""
        with self._lock:
            if self._sent:
                return False
            self._sent = 1
            self._closed = True
            return True

    def _close(self):
        with self._lock:
            self._closed = True


class ResponseIterator:
    """The responses of a decoupled BLS call, in order, each as it arrives
    (iterating waits for the next). As Triton's: a new iteration (a `for`
    loop, iter()) resumes where the last one stopped, and starts again from
    the first response only once the last response has been read."""

    def __init__(self, stream):
        self._stream = stream
        self._next = 0

    def __iter__(self):
        if self._stream.finished() and self._next >= len(self._stream.got):
            self._next = 0
        return self

    def __next__(self):
        r = self._stream.get(self._next)
        if r is None:
            raise StopIteration
        self._next += 1
        return r

    def cancel(self):
        """Asks the server to cancel the BLS request (the model called sees
        is_cancelled()); nothing happens once its last response came."""
        self._stream.cancel()


class _LogLevel(int):
    """A member of Triton's LogLevel enum: a plain int is not one."""


class Logger:
    class LogLevel:
        INFO = _LogLevel(0)
        WARNING = _LogLevel(1)
        ERROR = _LogLevel(2)
        VERBOSE = _LogLevel(3)

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        if not isinstance(message, str) or not isinstance(level, _LogLevel):
            raise TypeError("Logger.log(message: str, level: Logger.LogLevel)")
        import inspect
        frame = inspect.currentframe().f_back
        while frame and frame.f_code.co_filename == __file__:
            frame = frame.f_back
        where = (frame.f_code.co_filename, frame.f_lineno) if frame else ("", 0)
        if _worker:
            _worker.log(level, message, where[0], where[1])

    @staticmethod
    def log_info(message):
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, Logger.VERBOSE)


class ModelConfig:
    """The model config given to auto_complete_config (Triton's rules)."""

    def __init__(self, model_config):
        self._model_config = json.loads(model_config) if isinstance(model_config, str) \
            else model_config

    def as_dict(self):
        return self._model_config

    def _name(self):
        return self._model_config.get("name", "")

    def set_max_batch_size(self, max_batch_size):
        cur = self._model_config.get("max_batch_size", 0)
        if cur != max_batch_size and cur > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {cur}, but in auto-complete-config "
                f"function for model '{self._name()}' specified max_batch_size "
                f"{max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        cfg = self._model_config
        if cfg.get("sequence_batching") or cfg.get("ensemble_scheduling"):
            raise ValueError(
                f"Configuration specified scheduling_choice as '"
                f"{'sequence_batching' if cfg.get('sequence_batching') else 'ensemble_scheduling'}"
                f"', but auto-complete-config function for model '{self._name()}' tries to "
                "set scheduling_choice as 'dynamic_batching'")
        if "dynamic_batching" not in cfg:
            cfg["dynamic_batching"] = {}

    def _add_io(self, kind, io):
        if not isinstance(io, dict):
            raise ValueError(f"Error adding {kind} in auto-complete-config: expected a dict")
        allowed = {"name", "data_type", "dims"} | ({"optional"} if kind == "input" else set())
        for k in io:
            if k not in allowed:
                raise ValueError(
                    f"The {kind} '{io.get('name', '')}' in auto-complete-config function for "
                    f"model '{self._name()}' contains an unexpected key '{k}'")
        for k in ("name", "data_type", "dims"):
            if k not in io:
                raise ValueError(
                    f"{kind.capitalize()} '{io.get('name', '')}' in auto-complete-config "
                    f"function for model '{self._name()}' is missing '{k}' property.")
        entries = self._model_config.setdefault(kind, [])
        for e in entries:
            if e["name"] != io["name"]:
                continue
            if e.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", io["data_type"]):
                raise ValueError(
                    f"Unable to update {kind} '{io['name']}' data_type for model "
                    f"'{self._name()}': the configuration specified {e['data_type']}")
            if e.get("dims") and list(e["dims"]) != list(io["dims"]):
                raise ValueError(
                    f"Unable to update {kind} '{io['name']}' dims for model '{self._name()}': "
                    f"the configuration specified {e['dims']}")
            if "optional" in io and e.get("optional", False) != io["optional"]:
                raise ValueError(
                    f"Unable to update {kind} '{io['name']}' optional for model "
                    f"'{self._name()}'")
            e.update(io)
            return
        entries.append(dict(io))

    def add_input(self, input):
        self._add_io("input", input)

    def add_output(self, output):
        self._add_io("output", output)

    def set_model_transaction_policy(self, transaction_policy_dict):
        for k in transaction_policy_dict:
            if k != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains an unexpected key '{k}'")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        want = transaction_policy_dict.get("decoupled", False)
        if "decoupled" in policy and policy["decoupled"] != want:
            raise ValueError(
                f"trying to change decoupled property in auto-complete-config for model "
                f"'{self._name()}', which is already set to {policy['decoupled']}")
        policy["decoupled"] = want


# ---- Custom metrics (shown on the server's /metrics) ----

def _number(v):
    """A float as the server reads it (JSON has no inf or nan)."""
    return repr(float(v))


class _Deleted:
    """Handles whose Python objects are gone; deleted with the next call."""
    lock = threading.RLock()  # a __del__ may run while it is held
    families = []
    metrics = []

    @classmethod
    def flush(cls):
        with cls.lock:
            fams, mets = cls.families, cls.metrics
            cls.families, cls.metrics = [], []
        if mets:
            _worker.api({"op": "metric_delete", "handles": mets})
        if fams:
            _worker.api({"op": "family_delete", "handles": fams})


def _api(obj):
    if _worker is None:
        raise TritonModelException("pb_utils calls need the Python backend's worker")
    _Deleted.flush()
    return _worker.api(obj)


class Metric:
    """One series of a MetricFamily (made with MetricFamily.Metric)."""

    # the updates the server cannot refuse, per kind: sent without waiting
    # for an answer (the socket keeps them in order before what follows)
    _SURE = {0: ("increment",), 1: ("increment", "set"), 2: ("observe",)}

    def __init__(self, handle, family):
        self._handle = handle
        self._cleared = False
        self._kind = family._kind
        family._children.add(self)

    def _op(self, action, value=0.0):
        if self._cleared:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been "
                "deleted. The 'MetricFamily' object should be deleted AFTER its "
                "corresponding 'Metric' objects have been deleted.")
        call = {"op": "metric", "handle": self._handle, "action": action,
                "value": _number(value)}
        if _worker is not None and action in Metric._SURE[self._kind] and \
                (self._kind != MetricFamily.COUNTER or float(value) >= 0.0):
            _Deleted.flush()
            _worker.api_noreply(call)
            return None
        return _api(call)

    def increment(self, value):
        self._op("increment", value)

    def set(self, value):
        self._op("set", value)

    def observe(self, value):
        self._op("observe", value)

    def value(self):
        return float(self._op("value")["value"])

    def __del__(self):
        if not self._cleared and _worker is not None:
            with _Deleted.lock:
                _Deleted.metrics.append(self._handle)


class MetricFamily:
    """A custom metric family: Triton's pb_utils.MetricFamily."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name, description, kind):
        if name is None or description is None or kind is None:
            raise TypeError("name, description and kind must not be None")
        if kind not in (MetricFamily.COUNTER, MetricFamily.GAUGE, MetricFamily.HISTOGRAM):
            raise TritonModelException("Error when creating MetricFamily: Unknown metric kind")
        import weakref
        self._kind = kind
        self._children = weakref.WeakSet()
        self._handle = _api({"op": "family_new", "name": str(name),
                             "description": str(description), "kind": int(kind)})["handle"]

    def Metric(self, labels=None, buckets=None):
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != MetricFamily.HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [_number(b) for b in buckets]
        elif self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        res = _api({"op": "metric_new", "family": self._handle, "labels": labels or {},
                    "buckets": buckets})
        return Metric(res["handle"], self)

    def __del__(self):
        if _worker is None or not hasattr(self, "_handle"):
            return
        for m in list(self._children):
            m._cleared = True
        with _Deleted.lock:
            _Deleted.families.append(self._handle)


# ---- Model control (refused by the server unless --model-control-mode=explicit) ----

def load_model(model_name, config="", files=None):
    """Loads (or reloads) model_name; config is a JSON model config and files
    maps "file:<path>" to the bytes of a file of the model's directory."""
    if model_name is None or config is None:
        raise TypeError("model_name and config must not be None")
    tensors = []
    if files is not None:
        if not isinstance(files, dict):
            raise TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file "
                "paths and file contents")
        for path, content in files.items():
            if isinstance(content, str):
                content = content.encode()
            tensors.append(Tensor(str(path), np.frombuffer(bytes(content), dtype=np.uint8)))
    if _worker is None:
        raise TritonModelException("pb_utils calls need the Python backend's worker")
    _Deleted.flush()
    _worker.api({"op": "load_model", "model": str(model_name), "config": str(config)}, tensors)


def unload_model(model_name, unload_dependents=False):
    if model_name is None or unload_dependents is None:
        raise TypeError("model_name and unload_dependents must not be None")
    _api({"op": "unload_model", "model": str(model_name),
          "unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name, model_version=""):
    if model_name is None or model_version is None:
        raise TypeError("model_name and model_version must not be None")
    return bool(_api({"op": "is_model_ready", "model": str(model_name),
                      "version": str(model_version)})["ready"])
