"""The worker process of one Python model instance (Triton's "stub").

libnereid_python.so starts `python3 -u nereid_python_stub.py
triton_python_backend_stub <instance>` with a Unix SOCK_SEQPACKET socket on
fd 3. Each message is a 16-byte header (type, json_len, blob_len; little
endian) followed by a JSON object and a blob of tensor bytes, either inline
in the same datagram or, when large, in an anonymous shared-memory file
(memfd) passed with SCM_RIGHTS. Tensors are described in the JSON by name,
datatype, shape, offset and size within the blob. EXECUTE and DONE carry a
binary description (struct records, layout in python_wire.h) in the JSON's place.

Threads: the socket is read by whichever thread is waiting for something
(leader/follower, Worker.wait_for): the main thread when it waits for work
(init, execute, finalize run on it), a model thread when it waits for its
BLS result or cancellation answer. The worker exits when the server closes
the socket; a watchdog thread blocked in poll() sees the hang-up even while
the model is busy.

Started as `nereid_python_stub.py nereid_python_zygote`, the script is the
pre-started "zygote" instead (zygote_main): it forks one worker per request,
so an instance starts without a new interpreter and a new numpy import.
"""
import sys

import nereid_stub  # first: its after-fork hook runs before the others'
from nereid_stub.host import worker_main
from nereid_stub.zygote import zygote_main


def main():
    if sys.argv[1:2] == ["nereid_python_zygote"]:
        zygote_main()
    else:
        worker_main()


if __name__ == "__main__":
    main()
