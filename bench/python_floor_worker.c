/* The floor of a Python model's request: a worker with no Python in it.
 *
 * bench/bench_python_floor.py builds this and starts it in place of
 * python3 (NEREID_PYTHON, --backend-config=python,zygote=false), so the
 * server runs a "Python" identity model on a worker that speaks
 * the worker's protocol (python_wire.h: the header, "Binary EXECUTE
 * and DONE descriptions") and does nothing else: every EXECUTE is answered
 * with each request's first input as OUTPUT0, a view of the server's
 * EXECUTE region (where = 1) when the request came in one, or of the
 * request body region the input lies in (where = 16 + slot: python_body.c,
 * "Request bodies"), else a copy in the DONE itself, as the real worker's
 * fast path answers an identity. It keeps no input past its answer, so its
 * DONEs hold no body region.
 * What a request through it costs over the C identity backend is what one
 * process per instance costs on the machine, before any Python runs.
 *
 * A benchmark tool, not part of the server: it trusts the server. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define SOCK 3
#define HDR_BYTES 16
#define RECV_MAX (64 * 1024)
#define M_INIT 1
#define M_EXECUTE 2
#define M_FINALIZE 3
#define M_BODY_MAP 8
#define BODY_WHERE 16
#define M_READY 101
#define M_DONE 102
#define M_FINALIZED 107
#define M_REGION 0x80000000u
#define M_SLOT_SHIFT 16
#define SLOTS 16

static uint8_t *slot_map[SLOTS];
static size_t slot_len[SLOTS];
static uint8_t *body_map[SLOTS]; /* request body regions, read-only */
static size_t body_len[SLOTS];

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint8_t *put(uint8_t *p, const void *src, size_t n)
{
    memcpy(p, src, n);
    return p + n;
}

static uint8_t *put32(uint8_t *p, uint32_t v)
{
    return put(p, &v, 4);
}

static uint8_t *put64(uint8_t *p, uint64_t v)
{
    return put(p, &v, 8);
}

static void send_hdr_json(uint32_t type)
{
    uint8_t m[HDR_BYTES + 2] = {0};
    put32(put32(m, type), 2);
    m[HDR_BYTES] = '{';
    m[HDR_BYTES + 1] = '}';
    send(SOCK, m, sizeof m, MSG_NOSIGNAL);
}

/* Answers one EXECUTE: desc is its description, blob its tensors; base is
 * the blob's offset in the region (region EXECUTEs), or -1 (inline). */
static void execute(const uint8_t *desc, const uint8_t *blob, long base)
{
    static uint8_t out[RECV_MAX];
    static uint8_t data[RECV_MAX];
    uint8_t *d = out + HDR_BYTES, *db = data;
    const uint8_t *p = desc;
    uint32_t n = rd32(p);
    p += 4;
    d = put32(put32(d, 0), n); /* DONE_RESPONSES, n responses */
    for (uint32_t r = 0; r < n; r++) {
        uint32_t n_in = rd32(p), n_out = rd32(p + 4), id_len = rd32(p + 12);
        int32_t corr_len = (int32_t)rd32(p + 16);
        uint32_t params_len = rd32(p + 20);
        p += 48 + id_len + (corr_len > 0 ? (uint32_t)corr_len : 0) + params_len;
        for (uint32_t o = 0; o < n_out; o++)
            p += 4 + rd32(p);
        /* the first input record; the others are skipped */
        const uint8_t *rec = p;
        for (uint32_t i = 0; i < n_in; i++)
            p += 32 + 8 * rd32(p + 8) + rd32(p); /* name_len, dt, rank, where, off, size */
        uint32_t dt = rd32(rec + 4), rank = rd32(rec + 8), where = rd32(rec + 12);
        uint64_t off = rd64(rec + 16), size = rd64(rec + 24);
        d = put32(put32(put32(put32(put32(d, 0), 1), 0), 0), 0); /* outputs, 1, no params/error */
        d = put32(put32(put32(put32(d, 7), dt), rank), where >= BODY_WHERE ? where
                                                       : base >= 0         ? 1
                                                                           : 0);
        if (where >= BODY_WHERE) { /* a view of the input where it is */
            d = put64(put64(d, off), size);
        } else if (base >= 0) {
            d = put64(put64(d, (uint64_t)base + off), size);
        } else {
            d = put64(put64(d, (uint64_t)(db - data)), size);
            db = put(db, blob + off, size);
            while ((db - data) % 64)
                *db++ = 0;
        }
        d = put(d, rec + 32, 8 * rank);
        d = put(d, "OUTPUT0", 7);
    }
    uint32_t jlen = (uint32_t)(d - out - HDR_BYTES);
    uint64_t blen = (uint64_t)(db - data);
    put64(put32(put32(out, M_DONE), jlen), blen);
    d = put(d, data, blen);
    send(SOCK, out, (size_t)(d - out), MSG_NOSIGNAL);
}

int main(void)
{
    static uint8_t buf[RECV_MAX];
    for (;;) {
        char cbuf[CMSG_SPACE(4 * sizeof(int))];
        struct iovec iov = {buf, sizeof buf};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        ssize_t got = recvmsg(SOCK, &mh, MSG_CMSG_CLOEXEC);
        if (got < HDR_BYTES) return 0;
        int fd = -1;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                memcpy(&fd, CMSG_DATA(c), sizeof fd);
        uint32_t type = rd32(buf), jlen = rd32(buf + 4);
        uint32_t kind = type & 0xffff;
        if (kind == M_INIT) {
            send_hdr_json(M_READY);
        } else if (kind == M_FINALIZE) {
            send_hdr_json(M_FINALIZED);
            return 0;
        } else if (kind == M_EXECUTE && (type & M_REGION)) {
            unsigned slot = (type >> M_SLOT_SHIFT) & 0xf;
            if (fd >= 0) { /* a new region in this slot */
                struct stat st;
                fstat(fd, &st);
                if (slot_map[slot]) munmap(slot_map[slot], slot_len[slot]);
                slot_len[slot] = (size_t)st.st_size;
                slot_map[slot] = mmap(NULL, slot_len[slot], PROT_READ, MAP_SHARED, fd, 0);
                if (slot_map[slot] == MAP_FAILED) return 1;
            }
            if (!slot_map[slot]) return 1;
            execute(slot_map[slot], slot_map[slot] + jlen, jlen);
        } else if (kind == M_EXECUTE) {
            execute(buf + HDR_BYTES, buf + HDR_BYTES + jlen, -1);
        } else if (kind == M_BODY_MAP && fd >= 0) {
            unsigned slot = (type >> M_SLOT_SHIFT) & 0xf;
            struct stat st;
            fstat(fd, &st);
            if (body_map[slot]) munmap(body_map[slot], body_len[slot]);
            body_len[slot] = (size_t)st.st_size;
            body_map[slot] = mmap(NULL, body_len[slot], PROT_READ, MAP_SHARED, fd, 0);
            if (body_map[slot] == MAP_FAILED) return 1;
        }
        if (fd >= 0) close(fd);
    }
}
