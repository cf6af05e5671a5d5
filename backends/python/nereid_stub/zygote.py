"""The zygote: started as `nereid_python_stub.py nereid_python_zygote`, a
python3 with numpy and pb_utils imported that forks one worker per request
from libnereid_python.so (python_worker.c, "The zygote"), so an instance
starts without a new interpreter and a new numpy import; and the
pre-faulting of the pages a forked worker is known to touch."""
import array
import gc
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys

import triton_python_backend_utils as pb_utils

import nereid_stub
from nereid_stub.wire import (HDR, MADV_POPULATE_READ, MADV_POPULATE_WRITE, M_INIT, RECV_MAX)
from nereid_stub.host import (Worker, worker_main)

PR_SET_PDEATHSIG = 1


def cmdline_room():
    """Where this process's command line after its third argument (the
    script) lies: (address, length), or None. A forked child has the same
    addresses, so the zygote finds them once."""
    import ctypes
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        area = ctypes.string_at(start, end - start)
        at = 0
        for _ in range(3):  # interpreter, -u, script
            at = area.index(b"\0", at) + 1
        return start + at, end - start - at
    except (OSError, ValueError, IndexError):
        return None  # only the name shown by ps is at stake


def set_cmdline(room, tail):
    """Rewrites the command line after the script (room: cmdline_room())
    with tail, as a spawned worker's reads ('... nereid_python_stub.py
    triton_python_backend_stub <instance>', what pgrep -f looks for). The
    zygote's command line ends in a blank argument that makes room; a tail
    longer than the room is cut."""
    if room is None:
        return
    import ctypes
    at, size = room
    new = b"\0".join(a.encode(errors="replace") for a in tail)[:size - 1]
    ctypes.memmove(at, new + bytes(size - len(new)), size)


# ---- Pre-faulting ----
# A forked worker writes a few hundred pages it shares with the zygote
# (reference counts, allocator pools, interpreter state) and reads code pages
# that fork does not map for it; every one of them is a page fault, which
# costs tens of microseconds on virtual machines that trap each one (25-60
# us on the project's 2-core test machine). The zygote learns once,
# from a probe child that starts a worker on a tiny model, which pages a
# worker touches; each later child has the kernel copy or map them in one
# madvise(MADV_POPULATE_WRITE / _READ) per run of pages instead of one fault
# per page (Linux 5.14; on older kernels madvise fails and nothing changes).
PM_PRESENT, PM_FILE, PM_EXCLUSIVE = 1 << 63, 1 << 61, 1 << 56
PREFAULT_GAP = 0  # runs this many pages apart are made one madvise
PROBE_WAIT_S = 10
KERNEL_MAPS = ("[vvar]", "[vvar_vclock]", "[vdso]", "[vsyscall]")


def private_maps():
    """This process's private readable mappings: (start, end, writable)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            perms = fields[1]
            if perms[0] != "r" or perms[3] != "p" or fields[-1] in KERNEL_MAPS:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, perms[1] == "w"))
    return out


def touched_ranges(pid, maps):
    """The runs of pages of this process's mappings (maps) that its child
    pid made its own (written: anonymous and mapped only there) or mapped
    to read (file pages present), as (address, length, advice). Plain
    Python on the raw entries: numpy here would touch more pages than it
    saves time."""
    page = mmap.PAGESIZE
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        raw = [os.pread(fd, (end - start) // page * 8, start // page * 8)
               for start, end, _ in maps]
    finally:
        os.close(fd)
    written = PM_PRESENT | PM_EXCLUSIVE
    ranges = []
    for (start, _end, writable), data in zip(maps, raw):
        mask, want = (PM_PRESENT | PM_FILE | PM_EXCLUSIVE, written) if writable else (
            PM_PRESENT, PM_PRESENT)
        advice = MADV_POPULATE_WRITE if writable else MADV_POPULATE_READ
        first = last = -1
        for i, e in enumerate(array.array("Q", data)):
            if e & mask != want:
                continue
            if i - last > PREFAULT_GAP + 1 and first >= 0:
                ranges.append((start + first * page, (last - first + 1) * page, advice))
                first = -1
            if first < 0:
                first = i
            last = i
        if first >= 0:
            ranges.append((start + first * page, (last - first + 1) * page, advice))
    return ranges


PROBE_MODEL = "nereid_python_probe_model.py"


def probe_child(out, prctl):
    """The probe: a worker started as a forked one is (zygote_main), fed an
    INIT for the probe model through a socket pair. Then writes a byte to
    out and waits to be killed: the zygote reads what it touched."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        os.close(3)  # the server's control socket is the zygote's alone
    except OSError:
        pass
    gc.enable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    server, sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    w = Worker(sock)
    pb_utils._worker = w
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = {"name": "nereid_probe", "backend": "python", "max_batch_size": 0}
    init = json.dumps({
        "model_file": os.path.join(here, PROBE_MODEL), "instance": "nereid_probe_0",
        "decoupled": False, "auto_complete": False, "config": cfg, "model_dir": here,
        "args": {"model_config": json.dumps(cfg), "model_instance_kind": "CPU",
                 "model_instance_name": "nereid_probe_0", "model_instance_device_id": "0",
                 "model_repository": here, "model_version": "1", "model_name": "nereid_probe"},
    }).encode()
    server.sendmsg([HDR.pack(M_INIT, len(init), 0), init])
    w.wait_for(lambda: w.work)
    _mtype, obj, _blob = w.work.popleft()
    w.handle_init(obj)
    server.recv(RECV_MAX)
    os.write(out, b"1")
    select.select([], [], [], PROBE_WAIT_S)


def learn_prefault(prctl):
    """Forks the probe and returns the ranges it touched, or [] when it
    fails (children then take their faults one by one, as before)."""
    try:
        maps = private_maps()
        r, w = os.pipe()
    except OSError:
        return []
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return []
    if pid == 0:
        try:
            os.close(r)
            probe_child(w, prctl)
        finally:
            os._exit(0)
    os.close(w)
    try:
        if not select.select([r], [], [], PROBE_WAIT_S)[0] or os.read(r, 1) != b"1":
            return []
        return touched_ranges(pid, maps)
    except OSError:
        return []
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)  # ours and not reaped yet: the pid is its
            os.waitpid(pid, 0)  # reaped here: its CPU time counts as the zygote's children's
        except OSError:
            pass


def zygote_main():
    """The pre-started worker: numpy and pb_utils are imported once, then
    each FORK request (the instance name, with the worker's socket end as
    SCM_RIGHTS) forks a child that becomes that instance's worker. The answer
    is the child's pid (4 bytes, little endian) with a pidfd for it, through
    which the server signals and watches the child. Children are reaped by
    the kernel (SIGCHLD ignored here) and die with the zygote
    (PR_SET_PDEATHSIG). Single-threaded, so fork is safe;
    exits when the server closes the control socket (fd 3)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.set_inheritable(3, False)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl  # looked up once: a child only calls it
    room = cmdline_room()
    # Nothing here becomes garbage; frozen objects are never touched by a
    # child's collector, so their pages stay shared (no copy-on-write).
    gc.disable()
    if os.environ.get("NEREID_PYTHON_PREFAULT", "1") != "0":
        ranges = learn_prefault(prctl)
        if ranges:
            madvise = libc.madvise
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            nereid_stub._prefault = (madvise, ranges)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=3)
    while True:
        try:
            data, anc, _, _ = ctl.recvmsg(4096, socket.CMSG_SPACE(4 * 4))
        except OSError:
            os._exit(0)
        if not data and not anc:
            os._exit(0)
        fds = []
        for level, kind, d in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", d[:len(d) - len(d) % 4]))
        pid, pidfd = -1, -1
        if len(fds) == 1:
            gc.freeze()
            zygote = os.getpid()
            pid = os.fork()
            if pid == 0:
                try:
                    # Dies with the zygote: killing the server's child
                    # processes ends every worker, as with spawned ones.
                    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                    if os.getppid() != zygote:
                        os._exit(1)
                    gc.enable()
                    ctl.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.dup2(fds[0], 3)
                    os.close(fds[0])
                    sys.argv[1:] = ["triton_python_backend_stub",
                                    data.decode(errors="replace")]
                    set_cmdline(room, sys.argv[1:])
                    worker_main(forked=True)
                finally:
                    os._exit(1)
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:  # it already ended
                pid = -1
        for f in fds:
            os.close(f)
        try:
            ctl.sendmsg([struct.pack("<i", pid)],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))]
                        if pidfd >= 0 else [])
        except OSError:
            os._exit(0)
        finally:
            if pidfd >= 0:
                os.close(pidfd)
