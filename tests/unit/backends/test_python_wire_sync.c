/*
 * This file contains the test that the python backend's wire format is
 * defined once: the constants and layouts of backends/python/python_wire.h
 * (included here with python_wire.c, alone) against the Python side's
 * copies — the stub's wire module and bench/bench_python_stub.py (the
 * tests' fake server). It writes the C side as JSON (constants, datatype
 * codes, and messages the C encoders build from known values), runs
 * tests/unit/backends/check_python_wire.py on it, which compares them with
 * the Python modules and packs the same values with their struct layouts,
 * and decodes what that script packs the worker's way (a BLS_CALL and a
 * DONE) with the C decoders. Any difference fails.
 */
#include "../../../backends/python/python_wire.c"

#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static char *hex(const uint8_t *p, size_t n)
{
    char *s = malloc(2 * n + 1);
    if (!s) abort();
    for (size_t i = 0; i < n; i++)
        snprintf(s + 2 * i, 3, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static void add_hex(json_t *o, const char *key, const uint8_t *p, size_t n)
{
    char *s = hex(p, n);
    json_object_set_new(o, key, json_string(s));
    free(s);
}

/* The C side: constants, datatype names by code, encoded samples. */
static json_t *c_side(void)
{
    json_t *k = json_object();
#define K(name) json_object_set_new(k, #name, json_integer((json_int_t)(name)))
    K(M_INIT), K(M_EXECUTE), K(M_FINALIZE), K(M_BLS_RESULT), K(M_CANCEL_ANSWER);
    K(M_READY_QUERY), K(M_SPIN_PAGE), K(M_BODY_MAP), K(M_READY), K(M_DONE), K(M_LOG);
    K(M_RESPONSE), K(M_BLS_CALL), K(M_CANCEL_QUERY), K(M_FINALIZED), K(M_API_ANSWER);
    K(M_API_CALL), K(M_BLS_CANCEL), K(M_READY_ANSWER);
    K(HDR_BYTES), K(RECV_MAX), K(INLINE_MAX), K(ALIGN), K(MAX_RANK), K(MAX_NAME);
    K(TX_SPARES), K(BLS_SLOTS), K(BLS_REGION_MAX), K(BODY_SLOTS), K(BODY_WHERE);
    K(M_REGION), K(M_SLOT_SHIFT), K(M_SLOT_MASK), K(SPIN_JSON_BYTES);
    K(DONE_RESPONSES), K(DONE_ERROR), K(DONE_DECOUPLED);
    K(RESP_OUTPUTS), K(RESP_ERROR), K(RESP_RESCHEDULE);
    K(BLS_OUTPUTS), K(BLS_ERROR), K(BLS_EMPTY), K(BLS_FIXED);
#undef K
    json_t *dts = json_array();
    json_array_append_new(dts, json_string("INVALID"));
#define X(e, name, size, cfg) json_array_append_new(dts, json_string(name));
    NEREID_DATATYPE_MAP(X)
#undef X

    json_t *s = json_object();
    uint8_t hdr[HDR_BYTES];
    hdr_pack(hdr, M_DONE | M_REGION | 2u << M_SLOT_SHIFT, 0x01020304, 0x0506070809ull);
    add_hex(s, "hdr", hdr, sizeof hdr);
    /* A tensor record: "IN", FP32, [2, 3], where BODY_WHERE + 1, offset 64, size 24. */
    bwr_t w = {0};
    const int64_t shape[2] = {2, 3};
    tview_t v = {"IN", NEREID_TYPE_FP32, shape, 2, NULL, 24};
    bw_tensor_where(&w, &v, BODY_WHERE + 1, 64);
    add_hex(s, "tensor", w.p, w.n);
    w.n = 0;
    /* One EXECUTE request's fixed fields. */
    bw_exec_request(&w, 3, 2, 5, 7, UINT32_MAX, 11, 42, 1000, -1);
    add_hex(s, "exec_req", w.p, w.n);
    w.n = 0;
    bw_exec_request(&w, 1, 1, 0, 0, 6, 0, 0, 0, 9);
    add_hex(s, "exec_req_str", w.p, w.n);
    w.n = 0;
    /* A BLS_RESULT head with an error text. */
    bls_result_head(&w, 77, BLS_ERROR, true, 3, "boom", 0, 0);
    add_hex(s, "bls_res", w.p, w.n);
    free(w.p);

    json_t *o = json_object();
    json_object_set_new(o, "consts", k);
    json_object_set_new(o, "datatypes", dts);
    json_object_set_new(o, "samples", s);
    return o;
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
    size_t n = 0;
    while (s[0] && s[1] && n < cap) {
        unsigned b;
        if (sscanf(s, "%2x", &b) != 1) break;
        out[n++] = (uint8_t)b;
        s += 2;
    }
    return n;
}

/* The worker's side, packed by the script: decoded here. */
static void check_python_packed(const char *kind, const uint8_t *p, size_t n)
{
    if (strcmp(kind, "bls_call") == 0) {
        /* id 7, version -1, corr 42, timeout 1000, flags 3, decoupled 1,
         * numeric corr, model "m", id "r", no parameters, outputs ["OUT"],
         * input "IN" FP32 [2] where 0 offset 0 size 8, reply slot 2 */
        bls_req_t q;
        CHECK(bls_check(p, n, &q));
        CHECK(q.id == 7 && q.version == -1 && q.corr == 42 && q.timeout == 1000);
        CHECK(q.flags == 3 && q.decoupled == 1 && q.corr_len == -1 && q.reply_slot == 2);
        CHECK(q.model_len == 1 && q.model[0] == 'm' && q.id_len == 1 && q.rid[0] == 'r');
        CHECK(q.params_len == 0 && q.n_out == 1 && q.n_in == 1 && !q.by_ref && !q.body_mask);
        brd_t rd = {q.ins, (size_t)(p + n - q.ins), 0, false};
        static const uint8_t blob[8];
        tview_t v;
        int64_t shape[MAX_RANK];
        char name[MAX_NAME + 1], why[256];
        CHECK(read_tensor(&rd, blob, sizeof blob, NULL, 0, &v, shape, name, why, sizeof why));
        CHECK(strcmp(v.name, "IN") == 0 && v.datatype == NEREID_TYPE_FP32 && v.rank == 1 &&
              shape[0] == 2 && v.size == 8);
    } else if (strcmp(kind, "done") == 0) {
        /* responses for 1 request: outputs, one FP32 [2] tensor of 8 bytes */
        CHECK(done_check(p, n, 1, false));
        CHECK(!done_check(p, n, 2, false) && !done_check(p, n - 1, 1, false));
    } else if (strcmp(kind, "done_error") == 0) {
        CHECK(done_check(p, n, 3, false));
    } else {
        fprintf(stderr, "unknown sample '%s' from the script\n", kind);
        CHECK(false);
    }
}

int main(void)
{
    char path[] = "/tmp/nereid-wire-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    json_t *c = c_side();
    CHECK(json_dumpfd(c, fd, JSON_INDENT(1)) == 0);
    json_decref(c);
    close(fd);
    const char *py = getenv("NEREID_PYTHON");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s tests/unit/backends/check_python_wire.py %s",
             py && *py ? py : "/usr/bin/python3", path);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    int decoded = 0;
    char line[8192];
    static uint8_t buf[4096];
    while (f && fgets(line, sizeof line, f)) {
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = '\0';
        sp[strcspn(sp + 1, "\n") + 1] = '\0';
        check_python_packed(line, buf, unhex(sp + 1, buf, sizeof buf));
        decoded++;
    }
    int status = f ? pclose(f) : -1;
    unlink(path);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(decoded == 3);
    return check_summary();
}
