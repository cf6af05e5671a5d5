"""The worker process of one Python model instance (Triton's "stub"), as a
package next to libnereid_python.so. nereid_python_stub.py (the script the
library starts) runs it:

  wire     the message types, sizes and binary layouts (python_wire.h's),
           and the codec
  channel  the socket: sending, receiving, spinning, calls with answers
  bls      BLS calls from the model (pb_utils.InferenceRequest.exec)
  host     the Worker: the model's initialize, execute, is_ready, finalize
  zygote   the pre-started python3 that forks the workers

Importing the package first registers the pre-faulting after-fork hook
(zygote, "Pre-faulting"), before the modules it loads register theirs.
"""
import os
import sys

# Pages a forked worker is known to write, made private in one madvise per
# range before anything else runs in the child (zygote_main, "Pre-faulting"):
# None, or (madvise, [(address, length, advice)]). Registered before the
# modules below register theirs, so it runs first among the after-fork hooks.
_prefault = None
_prefaulted = ()  # the ranges this worker was given (for tests)


def _prefault_child():
    global _prefault, _prefaulted
    p = _prefault
    if p is not None:
        madvise, ranges = p
        for r in ranges:
            madvise(*r)
        _prefault = None  # the model's own forks pre-fault nothing
        _prefaulted = ranges


os.register_at_fork(after_in_child=_prefault_child)

# The fast path (see Channel.next_work, Worker.build_requests,
# wire.tensor_records): the main thread reads an EXECUTE itself when no
# other thread waits for a message, an EXECUTE description seen before
# reuses its parsed requests, a DONE record seen before its bytes. Off:
# every message goes through wait_for and everything is parsed and built
# anew (the general path, which tests compare it with).
FAST_PATH = True
# A BLS input that is a view of the EXECUTE in flight's region (the model
# passes its own input), and a DONE output that is a view of a BLS result,
# are referenced where they are, not copied (python_bls.c, "BLS tensors by
# reference").
BLS_BY_REF = True

# triton_python_backend_utils lives next to the package.
_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _here not in sys.path:
    sys.path.insert(0, _here)
