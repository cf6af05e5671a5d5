"""The worker's socket to the server. One datagram is one message: a
16-byte header (type, json_len, blob_len), then JSON (or a binary
description) and a blob, inline, in a memfd passed with SCM_RIGHTS, or in a
persistent region named by slot (wire.py).

Threads: the socket is read by whichever thread is waiting for something
(leader/follower, Channel.wait_for): the main thread when it waits for work
(init, execute, finalize run on it), a model thread when it waits for its
BLS result or cancellation answer. The main thread may spin for its next
message first (spin_recv, "spin-wait" in python_spin.c). A watchdog thread
blocked in poll() sees the server's hang-up even while the model is busy."""
import array
import collections
import fcntl
import json
import mmap
import os
import select
import socket
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

import nereid_stub
from nereid_stub.wire import (ALIGN, BLS_RES, CMSG_FD_SPACE, HDR, INLINE_MAX, MADV_POPULATE_READ,
                              MADV_POPULATE_WRITE, M_API_ANSWER, M_API_CALL, M_BLS_RESULT,
                              M_BODY_MAP, M_CANCEL_ANSWER, M_CANCEL_QUERY, M_DONE, M_EXECUTE,
                              M_FINALIZE, M_INIT, M_LOG, M_READY_QUERY, M_REGION, M_SLOT_MASK,
                              M_SLOT_SHIFT, M_SPIN_PAGE, RECV_MAX, U32, U64, ZEROS, encode_tensors,
                              fill_region, new_region, populate)

SPIN_PREEMPTED_S = 50e-6  # a gap between two polls this long: the spin lost its CPU
SPIN_BUSY_CHECKS = 2  # checks in a row that saw threads waiting for a CPU: stop
SPIN_BACKOFF = 32  # requests that do not spin after threads were seen waiting for a CPU
N_CPUS = os.cpu_count() or 1  # what /proc/loadavg's runnable threads compete for
SEND_JOIN_MAX = 4096  # inline messages up to this size are joined, then sent (send_parts)
HDR_SIZE, HDR_UNPACK = HDR.size, HDR.unpack_from  # recv's per-message look-ups, made once
NOT_SLOT, EXECUTE_IN_REGION = ~M_SLOT_MASK, M_EXECUTE | M_REGION


class Channel:
    """The Worker's socket to the server: sending messages (inline, in a
    memfd, or in a region), receiving them (leader/follower: whichever
    thread waits reads), spinning for the next one, the calls that wait
    for an answer, and the turns forked children take on the socket."""

    # ---- transport ----
    def send(self, mtype, obj, tensors=(), region=False):
        """Sends obj (a dict, or its JSON text) with tensors in the blob."""
        descs, views, blob_len = encode_tensors(tensors)
        js = obj if isinstance(obj, str) else json.dumps(obj)
        if descs:
            js = f'{js[:-1]}{"," if len(js) > 2 else ""}"tensors":[{",".join(descs)}]}}'
        self.send_parts(mtype, js.encode(), views, blob_len, region)

    def send_done(self, meta, views=(), blob_len=0):
        """A DONE: its binary description, tensors in our region; the body
        slots we hold in bits 16-23 of its kind."""
        if self.body_exec or self.body_live:
            meta = U32.pack(U32.unpack_from(meta, 0)[0] | self.body_holds() << 16) + meta[4:]
        self.send_parts(M_DONE, meta, views, blob_len, True)

    def send_parts(self, mtype, js, views, blob_len, region):
        total = len(js) + blob_len
        if HDR.size + total <= INLINE_MAX:
            # one datagram gathered from the pieces: no copy into a buffer here
            parts = [HDR.pack(mtype, len(js), blob_len), js]
            pos = 0
            for off, data in views:
                if off > pos:
                    parts.append(ZEROS[:off - pos])
                parts.append(data)  # a C-contiguous array: join or sendmsg reads its buffer
                pos = off + data.nbytes
            if blob_len > pos:
                parts.append(ZEROS[:blob_len - pos])
            # A small datagram joined and sent with send(): 0.3-0.4 µs less per
            # message than sendmsg() of the pieces (best of 100 interleaved
            # blocks on a socket pair); a large one is not copied here.
            data = b"".join(parts) if total <= SEND_JOIN_MAX else None
            lock = self.send_lock  # not `with`: a fifth of a microsecond less
            lock.acquire()
            try:
                if data is not None:
                    self.sock.send(data)
                    self.sent += 1
                    if self.spin is not None:
                        U64.pack_into(self.spin, 0, self.sent)
                else:
                    self.sendmsg(parts)
            finally:
                lock.release()
            return
        if region:
            return self.send_region(mtype, js, views, blob_len)
        fd = os.memfd_create("nereid-python", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, total)
            with mmap.mmap(fd, total) as mm:
                populate(mm, MADV_POPULATE_WRITE)
                fill_region(mm, js, views)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            with self.send_lock:
                self.sendmsg([HDR.pack(mtype, len(js), blob_len)],
                                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                    array.array("i", [fd]))])
        finally:
            os.close(fd)

    def sendmsg(self, *args):
        """sock.sendmsg, then the count in the server's word (send_lock held):
        a server thread spinning for our answer sees it without a wake-up."""
        self.sock.sendmsg(*args)
        self.sent += 1
        if self.spin is not None:
            U64.pack_into(self.spin, 0, self.sent)

    def send_region(self, mtype, js, views, blob_len):
        total = len(js) + blob_len
        fd = -1
        if self.tx_map is None or len(self.tx_map) < total:
            size = max(total, 1 << 20, 2 * len(self.tx_map) if self.tx_map else 0)
            fd, mm = new_region(size)
            if self.tx_map is not None:
                self.tx_map.close()
            self.tx_map = mm
        self.send_in_region(self.tx_map, fd, mtype | M_REGION, js, views, blob_len)

    def send_in_region(self, mm, fd, mtype, js, views, blob_len):
        """Writes a message at the start of region mm and sends its header,
        with fd (the region's memfd, closed here) when the server has not
        got it yet (-1 otherwise)."""
        try:
            fill_region(mm, js, views)
            anc = [] if fd < 0 else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            with self.send_lock:
                self.sendmsg([HDR.pack(mtype, len(js), blob_len)], anc)
        finally:
            if fd >= 0:
                os.close(fd)

    def recv(self, spin=False):
        # a fresh bytes object per datagram: the arrays of an execute are
        # views of it and outlive the next recv
        if spin:
            data, anc = self.spin_recv()
        else:
            data, anc, _, _ = self.sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)
        n = len(data)
        if n == 0:
            return None
        if not anc and n >= HDR_SIZE:  # the common case: a whole message inline
            mtype, jlen, blen = HDR_UNPACK(data, 0)
            if mtype == M_EXECUTE:  # small: inline, parsed by build_requests
                self.rx_used = None
                end = HDR_SIZE + jlen
                return mtype, data[HDR_SIZE:end], memoryview(data)[end:end + blen]
            if mtype & NOT_SLOT == EXECUTE_IN_REGION:
                # the common large one: in a region we have mapped
                slot = self.rx_slots.get(mtype >> M_SLOT_SHIFT & 0xF)
                if slot is not None:
                    if slot[0] is not self.rx_map:
                        self.rx_map, self.rx_region, self.rx_view = slot
                    mv = self.rx_view
                    self.rx_used = (jlen + blen + ALIGN - 1) // ALIGN * ALIGN
                    self.rx_base = jlen
                    return M_EXECUTE, bytes(mv[:jlen]), mv[jlen:jlen + blen]
            if not mtype & M_REGION:
                end = HDR_SIZE + jlen
                if mtype == M_BLS_RESULT:  # binary
                    return mtype, data[HDR_SIZE:end], memoryview(data)[end:end + blen]
                return (mtype, json.loads(str(data[HDR_SIZE:end], "utf-8")),
                        memoryview(data)[end:end + blen])
        fds = []
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", cdata[:len(cdata) - len(cdata) % 4]))
        mtype, jlen, blen = HDR.unpack_from(data, 0)
        in_region = mtype & M_REGION
        slot_no = (mtype & M_SLOT_MASK) >> M_SLOT_SHIFT
        mtype &= ~(M_REGION | M_SLOT_MASK)
        if mtype == M_BODY_MAP:
            self.map_body(slot_no, fds)
            return self.recv()
        if in_region and mtype == M_BLS_RESULT:
            return self.recv_bls_result(slot_no, fds, data, jlen, blen)
        if in_region and fds:
            # A new region of the server's (it switches between a few: one
            # a reply still reads is not written), kept in its slot: later
            # EXECUTEs name the slot only.
            fd = fds[0]
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                for f in fds:
                    os.close(f)
            self.rx_slots[slot_no] = (mm, (np.frombuffer(mm, np.uint8, 1).ctypes.data, len(mm)),
                                      memoryview(mm))
            self.rx_map, self.rx_region, self.rx_view = self.rx_slots[slot_no]
            payload = self.rx_view
        elif in_region:
            slot = self.rx_slots.get(slot_no)
            if slot is None:
                raise ValueError(f"a message in region slot {slot_no}, never sent")
            self.rx_map, self.rx_region, self.rx_view = slot
            payload = self.rx_view
        elif fds:
            fd = fds[0]
            try:
                size = os.fstat(fd).st_size
                mm = mmap.mmap(fd, size) if size else b""
                if size:
                    populate(mm, MADV_POPULATE_READ)
            finally:
                for f in fds:
                    os.close(f)
            payload = memoryview(mm)
        else:
            payload = memoryview(data)[HDR.size:]
        meta = bytes(payload[:jlen])
        obj = meta if mtype == M_EXECUTE or mtype == M_BLS_RESULT else json.loads(meta)
        if mtype == M_EXECUTE:
            self.rx_used = ((jlen + blen + ALIGN - 1) // ALIGN * ALIGN) if in_region else None
            self.rx_base = jlen
        return mtype, obj, payload[jlen:jlen + blen]

    def wait_for(self, ready):
        """Returns when ready() is true. Whichever waiting thread finds nobody
        reading the socket reads it (leader/follower): the main thread waiting
        for work, or a thread waiting for its BLS result, so an EXECUTE reaches
        the main thread without a hop through another thread."""
        with self.cv:
            while not ready():
                if self.reading:
                    self.n_waiting += 1
                    try:
                        self.cv.wait()
                    finally:
                        self.n_waiting -= 1
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
                self.dispatch(msg)

    def dispatch(self, msg):
        """Puts a message where its reader finds it (cv held): an answer in
        its call's slot, work in the main thread's queue; wakes the waiters
        (one of them reads next)."""
        mtype, obj, blob = msg
        if mtype == M_BLS_RESULT:
            cid, _, final = BLS_RES.unpack_from(obj, 0)[:3]
            slot = self.pending.get(cid)
            if slot is not None:
                slot[1].append((obj, blob))
                if final:
                    slot[0] = True
            if final and self.bls_calls:
                self.bls_release(cid)
        elif mtype in (M_CANCEL_ANSWER, M_API_ANSWER):
            slot = self.pending.get(obj.get("id"))
            if slot is not None:
                slot[1].append((obj, blob))
                slot[0] = True
        elif mtype == M_READY_QUERY:  # on its own thread: executes go on
            self.ready_query()
        elif mtype == M_SPIN_PAGE:
            self.spin_s = min(max(float(obj.get("spin_us", 0)), 0.0), 10000.0) / 1e6
            if self.spin_s and self.loadavg_fd < 0:
                try:
                    self.loadavg_fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    pass
            with self.send_lock:
                self.spin = blob[0:8]
                self.spin_hint = blob[8:16] if len(blob) >= 16 else None
                U64.pack_into(self.spin, 0, self.sent)
        else:
            self.work.append(msg)
        self.cv.notify_all()

    def spin_hint_us(self):
        """The server's hint for the execute it sent last: how long (µs) we
        may spin for the next one after answering it (0: not at all)."""
        return U64.unpack_from(self.spin_hint, 0)[0] if self.spin_hint is not None else 0

    def others_runnable(self):
        """Whether threads wait for a CPU: more are runnable on the machine
        (the 4th field of /proc/loadavg, this one included) than it has
        CPUs plus two (two are tolerated: along the request's own path the
        client, the server's thread and this spin overlap for a few µs;
        with one, the spin lost most of its gain at 1 connection:
        docs/performance.md, "Merged main, session 12"). Then a spin takes
        a CPU that others want. ~3 µs."""
        try:
            return int(os.pread(self.loadavg_fd, 64, 0).split()[3].split(b"/")[0]) > N_CPUS + 2
        except (OSError, ValueError, IndexError):
            return False

    def spin_recv(self):
        """spin-wait-us on the worker's side: the main thread polls for its
        next message before it blocks, so a request that follows soon finds
        it awake (no wake-up of a sleeping process; on this 2-vCPU VM a
        wake-up is ~20 µs of latency). It spins at most the server's hint
        for the execute it answered (python_spin.c, spin_hint_set: 0 unless that
        was the only Python execute in flight), only while messages keep
        coming within that (its last wait was shorter), and stops when
        another thread wants a CPU: a gap between two polls (it lost its
        CPU: this spin ends), or threads waiting for a CPU on two checks in
        a row (others_runnable: no spin for the next SPIN_BACKOFF
        requests)."""
        sock, clock = self.sock, time.monotonic
        t0 = now = clock()
        wait = min(self.spin_s, self.spin_hint_us() / 1e6)
        if self.last_wait > wait:
            wait = 0.0
        if self.spin_skip:
            self.spin_skip -= 1
            wait = 0.0
        until = t0 + wait
        self.spin_n += wait > 0
        check = self.loadavg_fd >= 0
        polls = busy = 0
        while now < until:
            try:
                data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE, socket.MSG_DONTWAIT)
                self.last_wait = clock() - t0
                self.spin_caught += 1
                return data, anc
            except BlockingIOError:
                pass
            polls += 1
            if check and polls % 2 == 0:
                busy = busy + 1 if self.others_runnable() else 0
            t = clock()
            if busy >= SPIN_BUSY_CHECKS:  # others wait for a CPU: back off
                self.spin_skip = SPIN_BACKOFF
                self.spin_stopped += 1
                break
            if t - now > SPIN_PREEMPTED_S:  # lost the CPU once: stop this spin only
                self.spin_stopped += 1
                break
            now = t
        data, anc, _, _ = sock.recvmsg(RECV_MAX, CMSG_FD_SPACE)
        self.last_wait = clock() - t0
        return data, anc

    def next_work(self):
        """The main thread's next message (INIT, EXECUTE, FINALIZE). The
        fast path: with nothing queued and no other thread reading or
        waiting to, the main thread reads the socket itself and keeps an
        EXECUTE without queueing it or waking anyone; any other message, or
        another thread waiting, takes the leader/follower way (wait_for)."""
        cv = self.cv
        if nereid_stub.FAST_PATH:
            cv.acquire()
            if self.work or self.reading or self.n_waiting:
                cv.release()
            else:
                self.reading = True
                cv.release()
                try:
                    msg = self.recv(self.spin_s > 0)
                except OSError:
                    msg = None
                cv.acquire()
                self.reading = False
                if msg is None:  # the server is gone (or closed our socket)
                    os._exit(0)
                if msg[0] in (M_EXECUTE, M_INIT, M_FINALIZE):
                    if self.n_waiting:  # one of them reads next
                        cv.notify_all()
                    cv.release()
                    return msg
                self.dispatch(msg)
                cv.release()
        self.wait_for(self.has_work)
        with cv:
            return self.work.popleft()

    def has_work(self):
        return bool(self.work)

    def watch_parent(self):
        """Exits when the server dies (or drops us), even while the model is
        busy: the socket hangs up when the server's end closes. Blocks in
        poll, so an idle worker is never woken."""
        p = select.poll()
        p.register(self.sock.fileno(), 0)  # POLLHUP and POLLERR are always reported
        while True:
            if p.poll():
                os._exit(0)

    def register(self):
        """A new call id and the slot its answers arrive in."""
        slot = [False, []]
        with self.cv:
            cid = self.next_id
            self.next_id += 1
            self.pending[cid] = slot
        return cid, slot


    # ---- processes the model forks ----
    # A model may fork (multiprocessing.Pool with the fork start method,
    # Triton's L0_backend_python bls test_multiprocess) and make BLS calls
    # from the children. Each child has a copy of this Worker and the same
    # socket to the server. Left alone, the children would read each other's
    # answers off that socket (and wait forever for the one a sibling took),
    # number their calls alike and write into the same regions. So a child
    # starts with fresh locks, call ids of its own (its pid in the high
    # bits), no regions (its calls and their results travel inline or in
    # memfds of their own) and no inputs by reference; and the children
    # take turns: a child holds a POSIX record lock on a memfd the parent
    # made before the first fork from its call's send to its last answer,
    # so one child at a time reads the socket. The parent itself is meant
    # to wait for them (pool.map in execute): a thread of the parent
    # reading the socket meanwhile could still take a child's answer.


    def before_fork(self):
        """In the process about to fork: the turn lock's memfd, made once."""
        if self.fork_lock < 0:
            try:
                self.fork_lock = os.memfd_create("nereid-python-forks", os.MFD_CLOEXEC)
            except OSError:
                pass

    def after_fork_child(self):
        """In a process the model forked (see above)."""
        self.forked = True
        self.send_lock = threading.Lock()
        self.cv = threading.Condition()
        self.fork_turn_lock = threading.Lock()
        self.fork_turns = 0
        self.reading = False
        self.n_waiting = 0
        self.pending = {}
        self.work = collections.deque()
        self.next_id = (os.getpid() << 32) + 1
        self.spin = None  # the server's word for the parent's messages
        self.spin_s = 0.0
        self.exec_ident = None
        self.bls_calls = {}

    def fork_turn(self, take):
        """A forked child's turn on the socket (take) or its end; nested
        and concurrent calls of one process share one turn."""
        if not self.forked or self.fork_lock < 0:
            return
        with self.fork_turn_lock:
            if take:
                if self.fork_turns == 0:
                    fcntl.lockf(self.fork_lock, fcntl.LOCK_EX)
                self.fork_turns += 1
            else:
                self.fork_turns -= 1
                if self.fork_turns == 0:
                    fcntl.lockf(self.fork_lock, fcntl.LOCK_UN)

    def call(self, mtype, obj, tensors=()):
        if self.forked:
            self.fork_turn(True)
            try:
                return self.call_now(mtype, obj, tensors)
            finally:
                self.fork_turn(False)
        return self.call_now(mtype, obj, tensors)

    def call_now(self, mtype, obj, tensors=()):
        cid, slot = self.register()
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

    def api_noreply(self, obj):
        """A metric update the server cannot refuse: sent, not answered."""
        obj["noreply"] = True
        self.send(M_API_CALL, obj)
