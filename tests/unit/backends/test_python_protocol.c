/*
 * This file contains the tests of the python backend's side of the worker
 * protocol (backends/python/python_wire.c, included here, alone): what a hostile
 * worker can send — truncated or oversized datagrams, memfds that are not
 * sealed or too small, region messages out of place, JSON that is not an
 * object, tensor descriptions whose name, datatype, shape, offset or
 * size do not add up, and binary DONE descriptions whose counts, lengths,
 * statuses or tensor records do not fit — must be refused with a reason, never read out of
 * bounds (the ASan build checks that).
 */
#include "../../../backends/python/python_wire.c"

#include "check.h"

static int sv[2];

static void send_raw(const void *data, size_t n, int fd)
{
    struct iovec iov = {(void *)data, n};
    fd_cmsg_t u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) attach_fd(&mh, &u, fd);
    if (sendmsg(sv[1], &mh, 0) != (ssize_t)n) abort();
}

static size_t header(uint8_t *buf, uint32_t type, uint32_t jlen, uint64_t blen)
{
    memcpy(buf, &type, 4);
    memcpy(buf + 4, &jlen, 4);
    memcpy(buf + 8, &blen, 8);
    return HDR_BYTES;
}

/* Receives one message; returns msg_recv's result, the reason in why. */
static int recv_one(rx_regions_t *rx, msg_t **m, char *why)
{
    why[0] = '\0';
    return msg_recv(sv[0], rx, m, why, 512);
}

static int memfd_with(const char *text, size_t size, bool seal)
{
    int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) abort();
    if (text && pwrite(fd, text, strlen(text), 0) != (ssize_t)strlen(text)) abort();
    if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) abort();
    return fd;
}

static void test_datagrams(void)
{
    char why[512];
    msg_t *m;
    rx_regions_t rx = {0};
    uint8_t buf[256];

    send_raw("xx", 2, -1);
    CHECK(recv_one(&rx, &m, why) == -1 && !m);
    CHECK_STR_CONTAINS(why, "malformed message header");

    size_t n = header(buf, M_LOG, 10, 0);
    memcpy(buf + n, "{}", 2);
    send_raw(buf, n + 2, -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "does not match its header");

    n = header(buf, M_LOG, 3, 0);
    memcpy(buf + n, "[1]", 3);
    send_raw(buf, n + 3, -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "not an object");

    n = header(buf, M_LOG, 0xffffffffu, 0);
    send_raw(buf, n, -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "too large");

    n = header(buf, M_LOG, 7, 3);
    memcpy(buf + n, "{\"a\":1}abc", 10);
    send_raw(buf, n + 10, -1);
    CHECK(recv_one(&rx, &m, why) == 1 && m);
    if (m) {
        CHECK(m->type == M_LOG && json_is_object(m->json) && m->blob_len == 3);
        CHECK(memcmp(m->blob, "abc", 3) == 0);
        msg_free(m);
    }

    /* memfds: must be sealed against shrinking and hold the message */
    int fd = memfd_with("{}", 4096, false);
    send_raw(buf, header(buf, M_API_CALL, 2, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "bad shared-memory region");

    fd = memfd_with("{}", 16, true);
    send_raw(buf, header(buf, M_API_CALL, 2, 100), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "bad shared-memory region");

    fd = memfd_with("{\"x\":2}", 4096, true);
    send_raw(buf, header(buf, M_API_CALL, 7, 100), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == 1 && m);
    if (m) {
        CHECK(json_integer_value(json_object_get(m->json, "x")) == 2 && m->blob_len == 100);
        msg_free(m);
    }

    /* BLS_CALL is binary: its description comes as a private copy, the blob
     * stays in the worker's memfd (mapped) */
    fd = memfd_with("{\"x\":2}", 4096, true);
    send_raw(buf, header(buf, M_BLS_CALL, 7, 100), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == 1 && m);
    if (m) {
        CHECK(m->type == M_BLS_CALL && !m->json && m->meta_len == 7 && m->map);
        CHECK(m->meta && memcmp(m->meta, "{\"x\":2}", 7) == 0 && m->blob == m->map + 7);
        msg_free(m);
    }

    /* the persistent region: only DONE, and only inside it */
    send_raw(buf, header(buf, M_DONE | M_REGION, 2, 0), -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "outside the shared-memory region");
    fd = memfd_with("{}", 4096, true);
    send_raw(buf, header(buf, M_LOG | M_REGION, 2, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "unexpected region message");
    fd = memfd_with("{\"r\":1}", 4096, true);
    send_raw(buf, header(buf, M_DONE | M_REGION, 7, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == 1 && m && rx.done);
    msg_free(m);
    send_raw(buf, header(buf, M_DONE | M_REGION, 7, 4089), -1);
    CHECK(recv_one(&rx, &m, why) == 1 && m);
    if (m) {
        /* DONE is binary: its description comes as a private copy */
        CHECK(m->type == M_DONE && !m->json && m->meta_len == 7);
        CHECK(m->meta && memcmp(m->meta, "{\"r\":1}", 7) == 0);
        msg_free(m);
    }
    send_raw(buf, header(buf, M_DONE | M_REGION, 7, 4090), -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "outside the shared-memory region");

    /* BLS_CALL regions: by slot, each its own, at most BLS_REGION_MAX */
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 2, 0), -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "outside the shared-memory region");
    fd = memfd_with("{}", 4096, true);
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | (uint32_t)BLS_SLOTS << M_SLOT_SHIFT, 2, 0),
             fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "unexpected region message");
    fd = memfd_with("{}", 4096, true);
    send_raw(buf, header(buf, M_DONE | M_REGION | 1u << M_SLOT_SHIFT, 2, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "unexpected region message");
    fd = memfd_with("{}", 4096, false);
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 2, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "bad shared-memory region");
    fd = memfd_with("{}", (size_t)BLS_REGION_MAX + 4096, true);
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 2, 0), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "bad shared-memory region");
    fd = memfd_with("{\"b\":2}", 4096, true);
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 7, 100), fd);
    close(fd);
    CHECK(recv_one(&rx, &m, why) == 1 && m && rx.bls[2] && !rx.bls[0]);
    if (m) {
        CHECK(m->type == M_BLS_CALL && m->region == rx.bls[2] && !m->map && m->meta_len == 7);
        CHECK(memcmp(m->meta, "{\"b\":2}", 7) == 0 && m->blob == rx.bls[2]->map + 7);
        msg_free(m);
    }
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 7, 4089), -1);
    CHECK(recv_one(&rx, &m, why) == 1 && m && m->region == rx.bls[2]);
    msg_free(m);
    send_raw(buf, header(buf, M_BLS_CALL | M_REGION | 2u << M_SLOT_SHIFT, 7, 4090), -1);
    CHECK(recv_one(&rx, &m, why) == -1);
    CHECK_STR_CONTAINS(why, "outside the shared-memory region");
    rx_regions_clear(&rx);
}

/* parse_tensor on a description (JSON text) against blob. */
static bool tensor(const char *desc, const uint8_t *blob, size_t blob_len, char *why)
{
    json_error_t jerr;
    json_t *d = json_loads(desc, 0, &jerr);
    if (!d) abort();
    tview_t v;
    int64_t shape[MAX_RANK];
    why[0] = '\0';
    bool ok = parse_tensor(d, blob, blob_len, &v, shape, why, 512);
    json_decref(d);
    return ok;
}

static void test_tensors(void)
{
    char why[512];
    uint8_t blob[64] = {0};
    CHECK(tensor("{\"name\":\"A\",\"datatype\":\"FP32\",\"shape\":[2,2],\"offset\":0,\"size\":16}",
                 blob, 64, why));
    CHECK(tensor("{\"name\":\"A\",\"datatype\":\"FP32\",\"shape\":[0],\"offset\":64,\"size\":0}",
                 blob, 64, why));
    CHECK(!tensor("{\"name\":\"\",\"datatype\":\"FP32\",\"shape\":[1],\"offset\":0,\"size\":4}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"FP128\",\"shape\":[1],\"offset\":0,\"size\":4}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "unknown datatype");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"INT8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                  "1,1,1],\"offset\":0,\"size\":1}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "more than 16 dimensions");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"INT8\",\"shape\":[-1],\"offset\":0,\"size\":1}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "invalid shape");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"FP32\",\"shape\":[3],\"offset\":0,\"size\":8}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "has 8 bytes, its shape and datatype need 12");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"FP32\",\"shape\":[4],\"offset\":56,\"size\":16}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "lies outside its message");
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"FP32\",\"shape\":[1],\"offset\":-4,\"size\":4}",
                  blob, 64, why));
    CHECK_STR_CONTAINS(why, "lies outside its message");
    /* shapes whose element count overflows 64 bits */
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"FP64\",\"shape\":[4611686018427387903,"
                  "4611686018427387903,4611686018427387903],\"offset\":0,\"size\":8}",
                  blob, 64, why));
    CHECK(!tensor("{\"name\":\"A\",\"datatype\":\"INT8\",\"shape\":[4294967296,4294967296],"
                  "\"offset\":0,\"size\":0}",
                  blob, 64, why));

    /* BYTES: exactly the shape's element count, each length inside */
    uint8_t b[32];
    uint32_t one = 1, three = 3, huge = 0xfffffff0u;
    memcpy(b, &one, 4);
    b[4] = 'x';
    memcpy(b + 5, &three, 4);
    memcpy(b + 9, "abc", 3);
    CHECK(tensor("{\"name\":\"S\",\"datatype\":\"BYTES\",\"shape\":[2],\"offset\":0,\"size\":12}",
                 b, 32, why));
    CHECK(!tensor("{\"name\":\"S\",\"datatype\":\"BYTES\",\"shape\":[3],\"offset\":0,\"size\":12}",
                  b, 32, why));
    CHECK_STR_CONTAINS(why, "does not hold 3 serialized elements");
    CHECK(!tensor("{\"name\":\"S\",\"datatype\":\"BYTES\",\"shape\":[2],\"offset\":0,\"size\":11}",
                  b, 32, why));
    memcpy(b + 5, &huge, 4);
    CHECK(!tensor("{\"name\":\"S\",\"datatype\":\"BYTES\",\"shape\":[2],\"offset\":0,\"size\":12}",
                  b, 32, why));
    CHECK(bytes_ok(b, 0, 0) && !bytes_ok(b, 3, 1) && !bytes_ok(b, 2, 0));
}

/* A binary DONE description being built. */
typedef struct done {
    uint8_t b[1024];
    size_t n;
} done_t;

static void put32(done_t *d, uint32_t v)
{
    memcpy(d->b + d->n, &v, 4);
    d->n += 4;
}

static void put64(done_t *d, uint64_t v)
{
    memcpy(d->b + d->n, &v, 8);
    d->n += 8;
}

static void put(done_t *d, const char *s)
{
    memcpy(d->b + d->n, s, strlen(s));
    d->n += strlen(s);
}

/* A tensor record: name, datatype, dims, where, offset, size. */
static void put_tensor(done_t *d, const char *name, uint32_t dt, const int64_t *dims, uint32_t rank,
                       uint32_t where, uint64_t off, uint64_t size)
{
    put32(d, (uint32_t)strlen(name));
    put32(d, dt);
    put32(d, rank);
    put32(d, where);
    put64(d, off);
    put64(d, size);
    for (uint32_t i = 0; i < rank; i++)
        put64(d, (uint64_t)dims[i]);
    put(d, name);
}

/* A response header: status, n_outputs, params, error code, error text. */
static void put_resp(done_t *d, uint32_t status, uint32_t n_out, const char *params, uint32_t code,
                     const char *err)
{
    put32(d, status);
    put32(d, n_out);
    put32(d, (uint32_t)strlen(params));
    put32(d, code);
    put32(d, (uint32_t)strlen(err));
    put(d, err);
    put(d, params);
}

static void test_done_binary(void)
{
    int64_t dims[2] = {2, 2};
    done_t d = {0};
    /* two responses: outputs, error */
    put32(&d, DONE_RESPONSES);
    put32(&d, 2);
    put_resp(&d, RESP_OUTPUTS, 1, "{\"p\":1}", 0, "");
    put_tensor(&d, "OUT", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    put_resp(&d, RESP_ERROR, 0, "", NEREID_ERROR_INVALID_ARG, "bad");
    CHECK(done_check(d.b, d.n, 2, false));
    CHECK(!done_check(d.b, d.n, 3, false)); /* another request count */
    CHECK(!done_check(d.b, d.n, 2, true));  /* responses from a decoupled model */
    for (size_t cut = 0; cut < d.n; cut++)  /* every truncation */
        CHECK_MSG(!done_check(d.b, cut, 2, false), "truncated at %zu", cut);
    d.b[d.n++] = 0; /* a byte left over */
    CHECK(!done_check(d.b, d.n, 2, false));

    /* a status out of range; outputs on an error response */
    d = (done_t){0};
    put32(&d, DONE_RESPONSES);
    put32(&d, 1);
    put_resp(&d, 3, 0, "", 0, "");
    CHECK(!done_check(d.b, d.n, 1, false));
    d = (done_t){0};
    put32(&d, DONE_RESPONSES);
    put32(&d, 1);
    put_resp(&d, RESP_ERROR, 1, "", 0, "x");
    put_tensor(&d, "OUT", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    CHECK(!done_check(d.b, d.n, 1, false));

    /* lengths and counts far beyond the description */
    d = (done_t){0};
    put32(&d, DONE_RESPONSES);
    put32(&d, 1);
    put32(&d, RESP_OUTPUTS);
    put32(&d, 0xffffffffu); /* n_outputs */
    put32(&d, 0);
    put32(&d, 0);
    put32(&d, 0);
    CHECK(!done_check(d.b, d.n, 1, false));
    d = (done_t){0};
    put32(&d, DONE_RESPONSES);
    put32(&d, 1);
    put_resp(&d, RESP_OUTPUTS, 1, "", 0, "");
    put32(&d, 3);
    put32(&d, NEREID_TYPE_FP32);
    put32(&d, 0xffffffffu); /* rank */
    put32(&d, 0);
    put64(&d, 0);
    put64(&d, 0);
    CHECK(!done_check(d.b, d.n, 1, false));
    d = (done_t){0};
    put32(&d, DONE_ERROR);
    put32(&d, 0xfffffff0u);
    put(&d, "text");
    CHECK(!done_check(d.b, d.n, 1, false));
    d = (done_t){0};
    put32(&d, DONE_ERROR);
    put32(&d, 4);
    put(&d, "text");
    CHECK(done_check(d.b, d.n, 1, false) && done_check(d.b, d.n, 1, true));
    d = (done_t){0};
    put32(&d, 7); /* unknown kind */
    CHECK(!done_check(d.b, d.n, 1, false));

    /* decoupled: reschedule indices inside the batch */
    d = (done_t){0};
    put32(&d, DONE_DECOUPLED);
    put32(&d, 1);
    put32(&d, 1);
    CHECK(done_check(d.b, d.n, 2, true));
    CHECK(!done_check(d.b, d.n, 1, true));  /* index 1 of 1 request */
    CHECK(!done_check(d.b, d.n, 2, false)); /* from a model that is not decoupled */
    d = (done_t){0};
    put32(&d, DONE_DECOUPLED);
    put32(&d, 5); /* more indices than requests */
    CHECK(!done_check(d.b, d.n, 2, true));
}

/* read_tensor on one binary record against a blob (and an EXECUTE region). */
static bool bin_tensor(const done_t *d, const uint8_t *blob, size_t blob_len, const uint8_t *ex,
                       size_t ex_len, char *why)
{
    brd_t rd = {d->b, d->n, 0, false};
    tview_t v;
    int64_t shape[MAX_RANK];
    char name[MAX_NAME + 1];
    why[0] = '\0';
    return read_tensor(&rd, blob, blob_len, ex, ex_len, &v, shape, name, why, 512);
}

static void test_tensor_records(void)
{
    char why[512];
    uint8_t blob[64] = {0}, ex[128] = {0};
    int64_t dims[2] = {2, 2}, neg[1] = {-1};
    done_t d = {0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    CHECK(bin_tensor(&d, blob, 64, NULL, 0, why));
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 0, 56, 16);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "lies outside its message");
    /* where 1: inside the EXECUTE region, and only when there is one */
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 1, 96, 16);
    CHECK(bin_tensor(&d, blob, 64, ex, 128, why));
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 1, 120, 16);
    CHECK(!bin_tensor(&d, blob, 64, ex, 128, why));
    CHECK_STR_CONTAINS(why, "lies outside its message");
    /* where 2 + k: a BLS_RESULT region (the caller passes it as ex), at
     * most BLS_SLOTS of them; none given, or past them: malformed */
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 2, 0, 16);
    CHECK(bin_tensor(&d, blob, 64, ex, 128, why));
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 1 + BLS_SLOTS, 112, 16);
    CHECK(bin_tensor(&d, blob, 64, ex, 128, why));
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 2 + BLS_SLOTS, 0, 16);
    CHECK(!bin_tensor(&d, blob, 64, ex, 128, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    /* offsets and sizes past INT64_MAX */
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 0, UINT64_MAX - 8, 16);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "lies outside its message");
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 0, 0, UINT64_MAX);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    /* names: empty, with a NUL; datatypes; shapes */
    d = (done_t){0};
    put_tensor(&d, "", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    d = (done_t){0};
    put_tensor(&d, "AB", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    d.b[d.n - 1] = 0;
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "malformed tensor description");
    d = (done_t){0};
    put_tensor(&d, "A", 0, dims, 2, 0, 0, 16);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "unknown datatype");
    d = (done_t){0};
    put_tensor(&d, "A", N_DATATYPES + 1, dims, 2, 0, 0, 16);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "unknown datatype");
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_INT8, neg, 1, 0, 0, 1);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "invalid shape");
    int64_t many[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_INT8, many, 17, 0, 0, 1);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "more than 16 dimensions");
    d = (done_t){0};
    put_tensor(&d, "A", NEREID_TYPE_FP32, dims, 2, 0, 0, 8);
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
    CHECK_STR_CONTAINS(why, "has 8 bytes, its shape and datatype need 16");
    /* a record cut short */
    d = (done_t){0};
    put_tensor(&d, "ABC", NEREID_TYPE_FP32, dims, 2, 0, 0, 16);
    d.n -= 1;
    CHECK(!bin_tensor(&d, blob, 64, NULL, 0, why));
}

/* A BLS_CALL description: the fixed fields, then model, request id,
 * correlation string (corr_len >= 0), parameters, outputs, input records. */
static void put_bls(done_t *d, uint64_t id, uint32_t decoupled, int32_t corr_len, const char *model,
                    const char *rid, const char *params, uint32_t n_out, uint32_t n_in)
{
    put64(d, id);
    put64(d, (uint64_t)-1); /* version */
    put64(d, 7);            /* numeric correlation id */
    put64(d, 0);            /* timeout */
    put32(d, 1);            /* sequence start */
    put32(d, decoupled);
    put32(d, (uint32_t)corr_len);
    put32(d, (uint32_t)strlen(model));
    put32(d, (uint32_t)strlen(rid));
    put32(d, (uint32_t)strlen(params));
    put32(d, n_out);
    put32(d, n_in);
    put32(d, (uint32_t)-1); /* no reply slot */
    put(d, model);
    put(d, rid);
    for (int32_t i = 0; i < corr_len && i < 64; i++) /* a longer one: only claimed */
        put(d, "c");
    put(d, params);
}

static void put_name(done_t *d, const char *name)
{
    put32(d, (uint32_t)strlen(name));
    put(d, name);
}

static void test_bls_call(void)
{
    int64_t dims[1] = {2};
    bls_req_t q;
    done_t d = {0};
    put_bls(&d, 42, 1, 3, "model", "rid", "{\"p\":1}", 2, 1);
    put_name(&d, "OUT0");
    put_name(&d, "OUT1");
    put_tensor(&d, "IN", NEREID_TYPE_FP32, dims, 1, 0, 0, 8);
    CHECK(bls_check(d.b, d.n, &q));
    CHECK(q.id == 42 && q.version == -1 && q.corr == 7 && q.flags == 1 && q.decoupled == 1);
    CHECK(q.corr_len == 3 && memcmp(q.corr_s, "ccc", 3) == 0);
    CHECK(q.model_len == 5 && memcmp(q.model, "model", 5) == 0);
    CHECK(q.id_len == 3 && q.params_len == 7 && q.n_out == 2 && q.n_in == 1);
    CHECK(bls_bytes_total(&q, &(msg_t){.meta = d.b, .meta_len = d.n}) == 0);
    for (size_t cut = 0; cut < d.n; cut++) /* every truncation */
        CHECK_MSG(!bls_check(d.b, cut, &q), "truncated at %zu", cut);
    d.b[d.n++] = 0; /* a byte left over */
    CHECK(!bls_check(d.b, d.n, &q));

    /* numeric correlation id, no strings, no tensors */
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 0);
    CHECK(bls_check(d.b, d.n, &q) && q.corr_len == -1);

    /* fields out of range */
    d = (done_t){0};
    put_bls(&d, 1, 2, -1, "m", "", "", 0, 0); /* decoupled is 0 or 1 */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -2, "m", "", "", 0, 0);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "", "", "", 0, 0); /* no model name */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 0);
    d.b[BLS_FIXED] = 0; /* a NUL in the model name */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "a", "", 0, 0);
    d.b[BLS_FIXED + 1] = 0; /* ... in the request id */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, 1, "m", "", "", 0, 0);
    d.b[BLS_FIXED + 1] = 0; /* ... in the correlation id */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 1, 0);
    put_name(&d, ""); /* an empty output name */
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 1, 0);
    put_name(&d, "A");
    d.b[d.n - 1] = 0;
    CHECK(!bls_check(d.b, d.n, &q));
    /* where 1 (the EXECUTE region in flight, checked by bls_start): numeric
     * only; nothing else but the blob */
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 1);
    put_tensor(&d, "IN", NEREID_TYPE_FP32, dims, 1, 1, 0, 8);
    CHECK(bls_check(d.b, d.n, &q) && q.by_ref);
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 1);
    put_tensor(&d, "IN", NEREID_TYPE_BYTES, dims, 1, 1, 0, 8);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 1);
    put_tensor(&d, "IN", NEREID_TYPE_FP32, dims, 1, 2, 0, 8);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 1);
    put_tensor(&d, "IN", NEREID_TYPE_FP32, dims, 1, 0, 0, 8);
    CHECK(bls_check(d.b, d.n, &q) && !q.by_ref);
    /* counts and lengths far beyond the description */
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0xffffffffu, 0);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 0xffffffffu);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, 0x7ffffff0, "m", "", "", 0, 0);
    CHECK(!bls_check(d.b, d.n, &q));
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 1);
    put32(&d, 2);
    put32(&d, NEREID_TYPE_FP32);
    put32(&d, 0xffffffffu); /* rank */
    put32(&d, 0);
    put64(&d, 0);
    put64(&d, 0);
    CHECK(!bls_check(d.b, d.n, &q));

    /* BYTES inputs in a memfd are counted for their private copy */
    d = (done_t){0};
    put_bls(&d, 1, 0, -1, "m", "", "", 0, 2);
    put_tensor(&d, "S", NEREID_TYPE_BYTES, dims, 1, 0, 0, 10);
    put_tensor(&d, "F", NEREID_TYPE_FP32, dims, 1, 0, 64, 8);
    CHECK(bls_check(d.b, d.n, &q));
    uint8_t blob[128] = {0};
    msg_t m = {.meta = d.b, .meta_len = d.n, .blob = blob, .blob_len = 128};
    CHECK(bls_bytes_total(&q, &m) == 0); /* in the datagram: already private */
    m.map = blob;
    CHECK(bls_bytes_total(&q, &m) == 10);
    m.map = NULL;
    m.region = &(region_t){.map = blob, .size = 128};
    CHECK(bls_bytes_total(&q, &m) == 10); /* in a BLS region: likewise */

    /* the reply slot: -1 (none) or one of BLS_SLOTS */
    for (int32_t slot = -2; slot <= BLS_SLOTS; slot++) {
        d = (done_t){0};
        put_bls(&d, 1, 0, -1, "m", "", "", 0, 0);
        memcpy(d.b + BLS_FIXED - 4, &slot, 4);
        CHECK_MSG(bls_check(d.b, d.n, &q) == (slot >= -1 && slot < BLS_SLOTS), "slot %d",
                  (int)slot);
        if (slot >= -1 && slot < BLS_SLOTS) CHECK(q.reply_slot == slot);
    }
}

int main(void)
{
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 1;
    test_datagrams();
    test_tensors();
    test_done_binary();
    test_tensor_records();
    test_bls_call();
    close(sv[0]);
    close(sv[1]);
    return check_summary();
}
