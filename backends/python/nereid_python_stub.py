"""The worker process of one Python model instance (Triton's "stub").

libnereid_python.so starts `python3 -u nereid_python_stub.py
triton_python_backend_stub <instance>` with a Unix SOCK_SEQPACKET socket on
fd 3. Each message is a 16-byte header (type, json_len, blob_len; little
endian) followed by a JSON object and a blob of tensor bytes, either inline
in the same datagram or, when large, in an anonymous shared-memory file
(memfd) passed with SCM_RIGHTS. Tensors are described in the JSON by name,
datatype, shape, offset and size within the blob.

Threads: the socket is read by whichever thread is waiting for something
(leader/follower, Worker.wait_for): the main thread when it waits for work
(init, execute, finalize run on it), a model thread when it waits for its
BLS result or cancellation answer. The worker exits when the server closes
the socket, or, checked every 0.3 s by a watchdog thread, when the server
process is gone.
"""
import array
import asyncio
import collections
import fcntl
import importlib
import inspect
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time
import traceback

import numpy as np

HDR = struct.Struct("<IIQ")
INLINE_MAX = 60 * 1024  # a whole message up to this size travels in the datagram
RECV_MAX = 64 * 1024
ALIGN = 64
M_REGION = 0x80000000  # payload in the sender's persistent region (EXECUTE, DONE)

# C -> worker
M_INIT, M_EXECUTE, M_FINALIZE, M_BLS_RESULT, M_CANCEL_ANSWER = 1, 2, 3, 4, 5
# worker -> C
M_READY, M_DONE, M_LOG, M_RESPONSE, M_BLS_CALL, M_CANCEL_QUERY, M_FINALIZED = (
    101, 102, 103, 104, 105, 106, 107)
# pb_utils calls besides inference (metrics, model control): call, answer
M_API_CALL, M_API_ANSWER = 120, 20

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton_python_backend_utils as pb_utils  # noqa: E402


def error_text(e):
    """An exception as Triton's stub prints it: '<Type>: <msg>' and the frames."""
    lines = [f"{type(e).__name__}: {e}", "", "At:"]
    for fs in reversed(traceback.extract_tb(e.__traceback__)):
        lines.append(f"  {fs.filename}({fs.lineno}): {fs.name}")
    return "\n".join(lines)


def encode_tensors(tensors):
    """Descriptors and the byte views of a list of pb_utils.Tensor."""
    descs, views, off = [], [], 0
    for t in tensors:
        arr = t._array
        if t._dtype == "BYTES":
            ser = pb_utils.serialize_byte_tensor(arr)
            data = np.asarray(ser, dtype=np.uint8) if len(ser) else np.empty(0, np.uint8)
        else:
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        descs.append({"name": t._name, "datatype": t._dtype, "shape": list(arr.shape),
                      "offset": off, "size": int(data.nbytes)})
        views.append((off, data))
        off = (off + data.nbytes + ALIGN - 1) // ALIGN * ALIGN
    return descs, views, off


def decode_tensors(descs, blob):
    out = []
    for d in descs:
        dt, shape, off, size = d["datatype"], d["shape"], d["offset"], d["size"]
        if off < 0 or size < 0 or off + size > len(blob):
            raise pb_utils.TritonModelException("tensor outside its message")
        raw = np.frombuffer(blob, dtype=np.uint8, count=size, offset=off)
        if dt == "BYTES":
            arr = pb_utils.deserialize_bytes_tensor(raw).reshape(shape)
        elif dt == "BF16":
            arr = raw.view(np.uint16).reshape(shape)
        else:
            arr = raw.view(pb_utils._NAME_TO_NUMPY[dt]).reshape(shape)
        out.append(pb_utils.Tensor(d["name"], arr, _dtype=dt))
    return out


class Worker:
    def __init__(self, sock):
        self.sock = sock
        self.send_lock = threading.Lock()
        self.work = collections.deque()
        self.pending = {}  # call id -> [done, results]
        self.cv = threading.Condition()  # guards work, pending, reading
        self.reading = False
        self.next_id = 1
        self.model = None
        self.model_dir = ""
        self.instance = ""
        self.decoupled = False
        self.in_execute = False
        self.bg_loop = None
        self.rx_map = None  # the server's region for EXECUTE inputs
        self.tx_map = None  # ours for DONE outputs (sealed against shrinking)
        self.loop = asyncio.new_event_loop()

    # ---- transport ----
    def send(self, mtype, obj, tensors=(), region=False):
        descs, views, blob_len = encode_tensors(tensors)
        if descs:
            obj["tensors"] = descs
        js = json.dumps(obj).encode()
        total = len(js) + blob_len
        if HDR.size + total <= INLINE_MAX:
            buf = bytearray(HDR.size + total)
            HDR.pack_into(buf, 0, mtype, len(js), blob_len)
            buf[HDR.size:HDR.size + len(js)] = js
            base = HDR.size + len(js)
            mv = memoryview(buf)
            for off, data in views:
                mv[base + off:base + off + data.nbytes] = data
            with self.send_lock:
                self.sock.sendmsg([buf])
            return
        if region:
            return self.send_region(mtype, js, views, blob_len)
        fd = os.memfd_create("nereid-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as mm:
                mm[0:len(js)] = js
                mv = memoryview(mm)
                for off, data in views:
                    mv[len(js) + off:len(js) + off + data.nbytes] = data
                mv.release()
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            with self.send_lock:
                self.sock.sendmsg([HDR.pack(mtype, len(js), blob_len)],
                                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))])
        finally:
            os.close(fd)

    def send_region(self, mtype, js, views, blob_len):
        total = len(js) + blob_len
        fd = -1
        if self.tx_map is None or len(self.tx_map) < total:
            size = max(total, 1 << 20, 2 * len(self.tx_map) if self.tx_map else 0)
            fd = os.memfd_create("nereid-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            if self.tx_map is not None:
                self.tx_map.close()
            self.tx_map = mmap.mmap(fd, size)
        try:
            mv = memoryview(self.tx_map)
            mv[0:len(js)] = js
            for off, data in views:
                mv[len(js) + off:len(js) + off + data.nbytes] = data
            mv.release()
            anc = [] if fd < 0 else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            with self.send_lock:
                self.sock.sendmsg([HDR.pack(mtype | M_REGION, len(js), blob_len)], anc)
        finally:
            if fd >= 0:
                os.close(fd)

    def recv(self):
        buf = bytearray(RECV_MAX)
        n, anc, flags, _ = self.sock.recvmsg_into([buf], socket.CMSG_SPACE(4))
        if n == 0:
            return None
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[:len(data) - len(data) % 4]))
        mtype, jlen, blen = HDR.unpack_from(buf, 0)
        in_region = mtype & M_REGION
        mtype &= ~M_REGION
        if in_region and fds:
            fd = fds[0]
            try:
                self.rx_map = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                for f in fds:
                    os.close(f)
            payload = memoryview(self.rx_map)
        elif in_region:
            payload = memoryview(self.rx_map)
        elif fds:
            fd = fds[0]
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, size) if size else b""
            finally:
                for f in fds:
                    os.close(f)
            payload = memoryview(mm)
        else:
            payload = memoryview(buf)[HDR.size:n]
        obj = json.loads(bytes(payload[:jlen]))
        return mtype, obj, payload[jlen:jlen + blen]

    def wait_for(self, ready):
        """Returns when ready() is true. Whichever waiting thread finds nobody
        reading the socket reads it (leader/follower): the main thread waiting
        for work, or a thread waiting for its BLS result, so an EXECUTE reaches
        the main thread without a hop through another thread."""
        with self.cv:
            while not ready():
                if self.reading:
                    self.cv.wait()
                    continue
                self.reading = True
                self.cv.release()
                try:
                    msg = self.recv()
                except OSError:
                    msg = None
                finally:
                    self.cv.acquire()
                    self.reading = False
                if msg is None:  # the server is gone (or closed our socket)
                    os._exit(0)
                mtype, obj, blob = msg
                if mtype in (M_BLS_RESULT, M_CANCEL_ANSWER, M_API_ANSWER):
                    slot = self.pending.get(obj.get("id"))
                    if slot is not None:
                        slot[1].append((obj, blob))
                        if mtype != M_BLS_RESULT or obj.get("final", True):
                            slot[0] = True
                else:
                    self.work.append(msg)
                self.cv.notify_all()

    def watch_parent(self):
        """Exits when the server dies, even while the model is busy."""
        parent = os.getppid()
        while True:
            time.sleep(0.3)
            if os.getppid() != parent:
                os._exit(0)

    def call(self, mtype, obj, tensors=()):
        slot = [False, []]
        with self.cv:
            cid = self.next_id
            self.next_id += 1
            self.pending[cid] = slot
        obj["id"] = cid
        try:
            self.send(mtype, obj, tensors)
            self.wait_for(lambda: slot[0])
        finally:
            with self.cv:
                del self.pending[cid]
        return slot[1]

    # ---- services for pb_utils ----
    def log(self, level, message, filename, line):
        self.send(M_LOG, {"level": level, "message": message, "file": filename, "line": line})

    def is_cancelled(self, token):
        res = self.call(M_CANCEL_QUERY, {"token": token})
        return bool(res[0][0].get("cancelled"))

    def api(self, obj, tensors=()):
        """A metric or model control call; the answer, or TritonModelException."""
        res = self.call(M_API_CALL, obj, tensors)[0][0]
        err = res.get("error")
        if err:
            raise pb_utils.TritonModelException(err["message"])
        return res

    def send_response(self, sender_id, response, flags, requested):
        obj = {"sender": sender_id, "flags": flags}
        tensors = []
        if response is not None:
            if response.has_error():
                obj["error"] = {"message": response.error().message(),
                                "code": response.error().code()}
            else:
                tensors = [t for t in response.output_tensors() if t.name() in requested]
                if response._parameters != "{}":
                    obj["parameters"] = json.loads(response._parameters)
        else:
            obj["empty"] = True
        self.send(M_RESPONSE, obj, tensors)

    def bls(self, request, decoupled):
        if not self.in_execute:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "BLS is only supported during the 'execute' function."))
        obj = {"model": request._model_name, "version": request._model_version,
               "outputs": request._requested, "request_id": request._request_id,
               "correlation_id": request._correlation_id, "flags": request._flags,
               "timeout": request._timeout, "parameters": json.loads(request._parameters),
               "decoupled": bool(decoupled)}
        results = self.call(M_BLS_CALL, obj, request._inputs)
        responses = []
        for res, blob in results:
            if res.get("empty"):
                if decoupled:
                    responses.append(pb_utils.InferenceResponse())
                continue
            err = res.get("error")
            if err:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(err["message"], err["code"])))
            else:
                responses.append(pb_utils.InferenceResponse(
                    decode_tensors(res.get("tensors", []), blob),
                    parameters=json.dumps(res.get("parameters", {}))))
        if decoupled:
            return pb_utils.ResponseIterator(responses)
        return responses[0] if responses else pb_utils.InferenceResponse(
            error=pb_utils.TritonError("BLS call ended without a response"))

    # ---- the model's life ----
    def load_model(self, obj):
        path = obj["model_file"]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Python model file not found in '{path}'")
        version_dir = os.path.dirname(path)
        model_dir = os.path.dirname(version_dir)
        # Triton's get_model_dir(): the directory of the version's model file
        self.model_dir = obj.get("model_dir") or version_dir
        for p in (version_dir, model_dir):
            if p not in sys.path:
                sys.path.append(p)
        stem = os.path.splitext(os.path.basename(path))[0]
        module = importlib.import_module(f"{os.path.basename(version_dir)}.{stem}")
        return module.TritonPythonModel

    def handle_init(self, obj):
        self.instance = obj.get("instance", "")
        self.decoupled = bool(obj.get("decoupled"))
        try:
            cls = self.load_model(obj)
            if obj.get("auto_complete"):
                config = None
                if hasattr(cls, "auto_complete_config"):
                    res = cls.auto_complete_config(pb_utils.ModelConfig(obj["config"]))
                    if not isinstance(res, pb_utils.ModelConfig):
                        raise pb_utils.TritonModelException(
                            f"auto_complete_config function in model '{obj['args']['model_name']}'"
                            " must return a valid pb.ModelConfig object.")
                    config = res.as_dict()
                self.send(M_READY, {"config": config})
                return
            self.model = cls()
            if hasattr(self.model, "initialize"):
                r = self.model.initialize(obj["args"])
                if inspect.iscoroutine(r):
                    self.loop.run_until_complete(r)
            if self.decoupled and inspect.iscoroutinefunction(
                    getattr(self.model, "execute", None)):
                self.bg_loop = asyncio.new_event_loop()
                threading.Thread(target=self.bg_loop.run_forever, daemon=True).start()
            self.send(M_READY, {})
        except BaseException as e:  # noqa: B902 - SystemExit from model code included
            self.send(M_READY, {"error": error_text(e)})

    def build_requests(self, obj, blob):
        reqs = []
        for i, r in enumerate(obj["requests"]):
            inputs = decode_tensors(r["inputs"], blob)
            if self.decoupled:  # kept past execute: not views of the reused region
                for t in inputs:
                    if t._array.dtype != np.object_:
                        t._array = t._array.copy()
            req = pb_utils.InferenceRequest("", [], [])
            req._inputs = inputs
            req._requested = r["outputs"]
            req._request_id = r["id"]
            req._correlation_id = r["correlation_id"]
            req._flags = r["flags"]
            req._timeout = r.get("timeout", 0)
            req._parameters = json.dumps(r["parameters"])
            req._model_name = r.get("model", "")
            if self.decoupled:
                req._sender_id = r["sender"]
                req._token = {"sender": r["sender"]}
            else:
                req._token = {"request": i}
            reqs.append(req)
        return reqs

    def execute_decoupled(self, reqs):
        def close_all(e):
            text = (f"Failed to process the request(s) for model '{self.instance}', "
                    f"message: {error_text(e)}")
            for q in reqs:
                q.get_response_sender()._close_with_error(pb_utils.TritonError(text))

        try:
            res = self.model.execute(reqs)
            if inspect.iscoroutine(res):
                fut = asyncio.run_coroutine_threadsafe(res, self.bg_loop)

                def done(f):
                    if f.exception() is not None:
                        traceback.print_exception(f.exception())
                fut.add_done_callback(done)
                res = None
            if res is not None:
                close_all(pb_utils.TritonModelException(
                    f"Python model '{self.instance}' is using the decoupled mode and the "
                    "execute function must return None."))
        except Exception as e:
            close_all(e)
        self.send(M_DONE, {})

    def handle_execute(self, obj, blob):
        reqs = self.build_requests(obj, blob)
        self.in_execute = True
        try:
            if self.decoupled:
                return self.execute_decoupled(reqs)
            try:
                res = self.model.execute(reqs)
                if inspect.iscoroutine(res):
                    res = self.loop.run_until_complete(res)
            except Exception as e:
                self.send(M_DONE, {"error": f"Failed to process the request(s) for model "
                                            f"'{self.instance}', message: {error_text(e)}"})
                return
        finally:
            self.in_execute = False
        err = None
        if not isinstance(res, list):
            err = f"Expected a list in the execute return, found type '{type(res)}'."
        elif len(res) != len(reqs):
            err = ("Number of InferenceResponse objects do not match the number of "
                   f"InferenceRequest objects. InferenceRequest(s) size is:{len(reqs)}, and "
                   f"InferenceResponse(s) size is:{len(res)}")
        else:
            for r in res:
                if not isinstance(r, pb_utils.InferenceResponse):
                    err = ("Expected an 'InferenceResponse' object in the execute function "
                           f"return list, found type '{type(r)}'.")
                    break
        if err:
            self.send(M_DONE, {"error": err})
            return
        out, tensors = [], []
        for req, resp in zip(reqs, res):
            if resp.has_error():
                e = resp.error()
                out.append({"error": {"message": e.message(), "code": e.code()}})
                continue
            requested = req._requested
            mine = [t for t in resp.output_tensors() if t.name() in requested]
            out.append({"n_outputs": len(mine)})
            if resp._parameters != "{}":
                out[-1]["parameters"] = json.loads(resp._parameters)
            tensors.extend(mine)
        try:
            self.send(M_DONE, {"responses": out}, tensors, region=True)
        except Exception as e:  # e.g. a BYTES element that cannot be encoded
            self.send(M_DONE, {"error": f"Failed to process the request(s) for model "
                                        f"'{self.instance}', message: {error_text(e)}"})

    def handle_finalize(self):
        if self.bg_loop is not None:
            self.bg_loop.call_soon_threadsafe(self.bg_loop.stop)
        if self.model is not None and hasattr(self.model, "finalize"):
            try:
                r = self.model.finalize()
                if inspect.iscoroutine(r):
                    self.loop.run_until_complete(r)
            except Exception as e:
                print(error_text(e), file=sys.stderr, flush=True)
        self.send(M_FINALIZED, {})

    def run(self):
        threading.Thread(target=self.watch_parent, daemon=True).start()
        while True:
            self.wait_for(lambda: self.work)
            with self.cv:
                mtype, obj, blob = self.work.popleft()
            if mtype == M_INIT:
                self.handle_init(obj)
            elif mtype == M_EXECUTE:
                self.handle_execute(obj, blob)
            elif mtype == M_FINALIZE:
                self.handle_finalize()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)


def main():
    import signal
    # Shutdown is driven by the server (finalize, then the socket closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.set_inheritable(3, False)  # programs the model starts must not hold our socket
    # Triton's stub embeds Python with an empty argv: model code that parses
    # it (unittest.main() in Triton's QA models) must not see our arguments
    sys.argv = [""]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=3)
    w = Worker(sock)
    pb_utils._worker = w
    w.run()


if __name__ == "__main__":
    main()
