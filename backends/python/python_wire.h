/*
 * This file contains the python backend's wire format: everything the
 * server (libnereid_python.so) and the worker (the nereid_stub
 * package's wire module, and bench/bench_python_stub.py, the tests' fake
 * server) must agree on — message types and sizes, the persistent
 * shared-memory regions and their slots, the layout of the binary
 * descriptions (EXECUTE, DONE, BLS_CALL, BLS_RESULT, the spin page) — and
 * the server's codec for them: building and sending messages, receiving
 * and checking what an untrusted worker sends. It corresponds to Triton
 * python_backend's ipc_message.h and pb_utils.h (one message definition
 * for both sides); the unit test test_python_wire_sync
 * (tests/unit/backends/test_python_wire_sync.c and check_python_wire.py)
 * fails when the Python side's copy of these constants and layouts differs.
 *
 * One datagram on the worker's SOCK_SEQPACKET socket is one message: a
 * 16-byte header {type, json_len, blob_len} (little-endian u32, u32, u64),
 * then a JSON object and a blob of tensor bytes. Small messages carry JSON
 * and blob inline; larger ones carry them in an anonymous shared-memory
 * file (memfd, never /dev/shm) passed with SCM_RIGHTS, or in a persistent
 * region named by slot. Tensors are described in the JSON ("tensors":
 * [{name, datatype, shape, offset, size}]) with offsets into the blob;
 * EXECUTE, DONE, BLS_CALL and BLS_RESULT carry a binary description in the
 * JSON's place instead (below).
 */
#ifndef NEREID_PYTHON_WIRE_H
#define NEREID_PYTHON_WIRE_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "nereid/backend.h"

/* Message types: server -> worker below 100 (and M_API_ANSWER), worker ->
 * server from 101. */
enum {
    M_INIT = 1,
    M_EXECUTE = 2,
    M_FINALIZE = 3,
    M_BLS_RESULT = 4,
    M_CANCEL_ANSWER = 5,
    M_READY_QUERY = 6, /* the model's is_ready() (model-ready checks) */
    M_SPIN_PAGE = 7,   /* the word the worker counts its messages in ("spin-wait") */
    M_BODY_MAP = 8,    /* a request body region's memfd for a slot ("Request bodies") */
    M_READY = 101,
    M_DONE = 102,
    M_LOG = 103,
    M_RESPONSE = 104,
    M_BLS_CALL = 105,
    M_CANCEL_QUERY = 106,
    M_FINALIZED = 107,
    M_API_ANSWER = 20, /* pb_utils calls besides inference (python_api.c) */
    M_API_CALL = 120,
    M_BLS_CANCEL = 121, /* ResponseIterator.cancel() of a decoupled BLS call */
    M_READY_ANSWER = 122,
};

#define HDR_BYTES 16
#define RECV_MAX (64 * 1024)
#define INLINE_MAX (60 * 1024)
#define JSON_MAX (64u << 20)
#define BLOB_MAX (1ull << 40)
#define ALIGN 64
#define MAX_RANK 16
#define MAX_NAME 4096
#define TX_SPARES 2                /* EXECUTE regions kept besides the current one */
#define BLS_SLOTS 8                /* persistent BLS regions per direction and worker */
#define BLS_REGION_MAX (16u << 20) /* a larger BLS message travels in a memfd of its own */
#define BODY_SLOTS 8               /* request body regions per model ("Request bodies") */
#define BODY_WHERE 16              /* tensor record where = BODY_WHERE + slot */

/* The worker's spin page (M_SPIN_PAGE, see python_spin.c): a JSON part
 * padded to SPIN_JSON_BYTES, then the worker's message count (u64) and the
 * server's spin hint (u64, µs). */
#define SPIN_PAGE_BYTES 4096
#define SPIN_JSON_BYTES 24 /* {"spin_us":N} with N <= SPIN_WAIT_US_MAX, padded */

/* ---- Regions ---- */

/* A memfd mapping that lives across messages: the server's region for
 * EXECUTE inputs (written here, read by the worker) or the worker's region
 * for DONE outputs (read here). Reference counted: a message read from a
 * region keeps it mapped after the worker replaced it, and so does a
 * response output that is a view of it (until the frontend freed the
 * response), also after the worker died. */
typedef struct region {
    uint8_t *map;
    size_t size;
    atomic_int refs;
    int fd;       /* the server's own regions keep their memfd; else -1 */
    uint8_t slot; /* the server's own: its number in EXECUTE headers (M_SLOT_SHIFT) */
    bool fresh;   /* the server's own: made by the last send (for the counts) */
    uint64_t id;  /* a body region: unique in the process (which one a worker mapped) */
    size_t used;  /* a body region: the bytes of the body in it now (set by body_alloc,
                     while nobody else holds it) */
} region_t;

/* A message type with this bit has its payload in the sender's persistent
 * region (a new region when a memfd comes with it): EXECUTE and DONE (one
 * of each is in flight at a time), BLS_CALL and BLS_RESULT (see "BLS
 * regions"). */
#define M_REGION 0x80000000u

/* An EXECUTE in a region names it by a slot (0..TX_SPARES) in these bits
 * of its type. The worker keeps one mapping per slot, replaced when a
 * memfd comes with the slot (a new region): switching to a spare sends no
 * fd, and the worker maps nothing. */
#define M_SLOT_SHIFT 16
#define M_SLOT_MASK (0xFu << M_SLOT_SHIFT)

/* The worker's persistent regions, as the thread reading its socket knows
 * them: the DONE region, and BLS_CALL regions by slot (see "BLS regions"). */
typedef struct rx_regions {
    region_t *done;
    region_t *bls[BLS_SLOTS];
} rx_regions_t;

/* ---- Messages ---- */

/* A received message: JSON and a blob view into the datagram or memfd map. */
typedef struct msg {
    uint32_t type;
    json_t *json;
    const uint8_t *blob;
    size_t blob_len;
    void *map; /* memfd mapping, or NULL */
    size_t map_len;
    uint8_t *buf;     /* datagram buffer */
    region_t *region; /* the worker's region the payload is in, or NULL */
    uint8_t *meta;    /* DONE: its binary description (a private copy), json NULL */
    size_t meta_len;
} msg_t;

/* The socket and its send lock; shared with BLS completions, which may
 * outlive the worker (they then write to a closed peer and are dropped).
 * The server's BLS_RESULT regions belong to the connection: a new worker
 * starts with none. */
typedef struct chan {
    int fd;
    pthread_mutex_t send_mu;
    atomic_int refs;
    pthread_mutex_t bls_mu;      /* guards what follows */
    region_t *bls_tx[BLS_SLOTS]; /* BLS_RESULT regions by slot, or NULL */
    size_t bls_tx_bytes;         /* their sizes together (<= BLS_BUDGET) */
    size_t bls_new_bytes;        /* new regions calls place outputs in, not yet in bls_tx
                                    (with bls_tx_bytes <= BLS_BUDGET) */
} chan_t;

/* A tensor to send: a view, never owned. */
typedef struct tview {
    const char *name;
    nereid_datatype_t datatype;
    const int64_t *shape;
    size_t rank;
    const void *data;
    size_t size;
} tview_t;

/* A message being built: JSON plus the tensors its blob will hold. */
typedef struct outmsg {
    json_t *obj;  /* the JSON part, or NULL: */
    uint8_t *raw; /* a binary one (EXECUTE), malloc'ed */
    size_t raw_len;
    tview_t *t;
    size_t n, cap;
    size_t blob_len;
    /* EXECUTE: the region it goes in (when one) is published here with a
     * reference, under publish_mu, before the worker can see it. */
    region_t **publish;
    pthread_mutex_t *publish_mu;
} outmsg_t;

/* Room for one fd passed with SCM_RIGHTS. */
typedef union fd_cmsg {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
} fd_cmsg_t;

/* A message's header: type, JSON length, blob length (little-endian). */
static inline void hdr_pack(uint8_t hdr[HDR_BYTES], uint32_t type, uint32_t jlen, uint64_t blob_len)
{
    memcpy(hdr, &type, 4);
    memcpy(hdr + 4, &jlen, 4);
    memcpy(hdr + 8, &blob_len, 8);
}

void region_unref(region_t *r);
/* nereid_output_release_fn of an output that is a view of a region. */
void region_release(void *userp);
/* A new region of the server's own: a memfd of size bytes sealed against
 * shrinking (the worker cannot make our writes fault), mapped, named by
 * slot in the messages that use it. NULL when there is no memory for it. */
region_t *region_new(size_t size, uint8_t slot);
void rx_regions_clear(rx_regions_t *rx);
/* Faults in a fresh memfd mapping's pages with one call (python_wire.c). */
void populate(void *map, size_t len, int advice);

void msg_free(msg_t *m);
/* A message kept past its reading: the worker can still write its memfd,
 * so the blob becomes a private copy. */
void msg_own_blob(msg_t *m);
chan_t *chan_new(int fd);
void chan_unref(chan_t *c);

/* Adds tensor v to the blob; returns its offset there. */
size_t outmsg_add_view(outmsg_t *m, const tview_t *v);
int outmsg_send(chan_t *c, uint32_t type, outmsg_t *m);
/* Copies the message's JSON and tensors to dst. */
void outmsg_copy(const outmsg_t *m, uint8_t *dst, const char *js, size_t jlen);
/* Sends m (and frees what it holds). A large message goes into *tx, the
 * persistent region, when tx is given (a new one in slot new_slot, its
 * memfd sent along, when there is none or it is too small); otherwise
 * into a memfd of its own. -1 when the peer is gone. */
int outmsg_send_region(chan_t *c, uint32_t type, outmsg_t *m, region_t **tx, uint8_t new_slot);
int send_json(chan_t *c, uint32_t type, json_t *obj);
/* Attaches fd to mh; u holds it and must outlive the sendmsg. */
void attach_fd(struct msghdr *mh, fd_cmsg_t *u, int fd);
/* Sends the len bytes at d (a header, and what a region message adds to
 * it) with fd (-1: none). */
int send_bytes_with_fd(chan_t *c, const uint8_t *d, size_t len, int fd);
/* Sends header hdr with fd (-1: none). */
int send_with_fd(chan_t *c, const uint8_t *hdr, int fd);

/* Receives one message. Returns 1 with *out, 0 at EOF, -1 with *why on a
 * malformed message or a socket error. */
int msg_recv(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap);
/* msg_recv with recvmsg flags (MSG_DONTWAIT: 2 when nothing is waiting). */
int msg_recv_flags(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap, int flags);
/* msg_recv_flags receiving into scratch (RECV_MAX bytes, reused by the
 * caller): the message keeps a copy of just the bytes received, so a small
 * message costs no 64 KiB allocation. NULL: into a buffer of its own. */
int msg_recv_into(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap, int flags,
                  uint8_t *scratch);

/* Whether p[0..size) is exactly elems serialized BYTES elements. Memory the
 * worker can still write is checked again after it was copied. */
bool bytes_ok(const uint8_t *p, size_t size, uint64_t elems);
uint64_t elements(const int64_t *shape, size_t rank);
/* A tensor a worker described: checked against the blob and its type. */
bool parse_tensor(json_t *d, const uint8_t *blob, size_t blob_len, tview_t *v, int64_t *shape,
                  char *why, size_t why_cap);

/* ---- Binary EXECUTE and DONE descriptions ----
 *
 * The two messages of every request carry no JSON: their description is
 * little-endian fields (the worker parses them with struct), followed as
 * before by the blob. A tensor record is
 *   u32 name_len, u32 datatype (nereid_datatype_t), u32 rank, u32 where,
 *   u64 offset, u64 size, i64 dims[rank], name bytes
 * where 0 means the message's blob, and 1 (DONE only) the EXECUTE region
 * the server wrote: an output that is a view of an input is not copied by
 * the worker, and a large computed one is written there after the EXECUTE
 * payload (so both can reach the reply as views of the region); 2 + k
 * (DONE only) the server's BLS_RESULT region k, an output that is a BLS
 * result (see "BLS tensors by reference"); BODY_WHERE + s (EXECUTE and
 * DONE) the request body region in slot s (see "Request bodies"): an input
 * that lies in a body region is referenced there, not copied, and an
 * output that is a view of such an input goes back the same way. EXECUTE:
 *   u32 n_requests, then per request
 *   u32 n_inputs, u32 n_outputs, u32 flags, u32 id_len, i32 corr_len (-1:
 *   numeric), u32 params_len, u64 correlation_id, u64 timeout_us,
 *   i64 sender (decoupled; -1 none), id, correlation id string,
 *   parameters (JSON text, absent when none), n_outputs x (u32 len, name),
 *   n_inputs tensor records.
 * DONE: u32 kind (bits 16-23: the worker's body-slot holds, see "Request
 * bodies"), then
 *   0 (responses): u32 n, per response u32 status (0 outputs, 1 error,
 *     2 rescheduled), u32 n_outputs, u32 params_len, u32 error_code,
 *     u32 error_len, error text, parameters (JSON text), tensor records;
 *   1 (execute failed): u32 len, text;
 *   2 (decoupled): u32 n, n x u32 indices of rescheduled requests.
 * The worker is untrusted: done_check walks the whole (privately copied)
 * description, every count and length against what is left of it, before
 * apply_done uses any of it. */

enum { DONE_RESPONSES = 0, DONE_ERROR = 1, DONE_DECOUPLED = 2 };
enum { RESP_OUTPUTS = 0, RESP_ERROR = 1, RESP_RESCHEDULE = 2 };

/* BLS_RESULT statuses, and the fixed fields of a BLS_CALL (bytes). */
enum { BLS_OUTPUTS = 0, BLS_ERROR = 1, BLS_EMPTY = 2 };
#define BLS_FIXED (4 * 8 + 9 * 4) /* the fixed fields of a BLS_CALL */

typedef struct bwr {
    uint8_t *p;
    size_t n, cap;
} bwr_t;

static inline void bw_put(bwr_t *w, const void *src, size_t n)
{
    if (w->cap - w->n < n) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->n < n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) abort();
        w->p = p;
        w->cap = cap;
    }
    if (n) memcpy(w->p + w->n, src, n);
    w->n += n;
}

static inline void bw_u32(bwr_t *w, uint32_t v)
{
    bw_put(w, &v, 4);
}

static inline void bw_u64(bwr_t *w, uint64_t v)
{
    bw_put(w, &v, 8);
}

typedef struct brd {
    const uint8_t *p;
    size_t n, pos;
    bool bad; /* read past the end */
} brd_t;

static inline const uint8_t *br_take(brd_t *r, size_t n)
{
    if (r->bad || n > r->n - r->pos) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p + r->pos;
    r->pos += n;
    return q;
}

static inline uint32_t br_u32(brd_t *r)
{
    uint32_t v = 0;
    const uint8_t *q = br_take(r, 4);
    if (q) memcpy(&v, q, 4);
    return v;
}

static inline uint64_t br_u64(brd_t *r)
{
    uint64_t v = 0;
    const uint8_t *q = br_take(r, 8);
    if (q) memcpy(&v, q, 8);
    return v;
}

/* The where field of the tensor record at rd (not consumed), or
 * UINT32_MAX when the description ends before it. */
static inline uint32_t record_where(const brd_t *rd)
{
    uint32_t where = UINT32_MAX;
    if (!rd->bad && rd->n - rd->pos >= 16) memcpy(&where, rd->p + rd->pos + 12, 4);
    return where;
}

/* Writes the fixed fields of one request of an EXECUTE (what follows them:
 * id, correlation id string, parameters, output names, tensor records).
 * corr_len UINT32_MAX: the correlation id is numeric. */
static inline void bw_exec_request(bwr_t *w, uint32_t n_inputs, uint32_t n_outputs, uint32_t flags,
                                   uint32_t id_len, uint32_t corr_len, uint32_t params_len,
                                   uint64_t corr, uint64_t timeout_us, int64_t sender)
{
    bw_u32(w, n_inputs);
    bw_u32(w, n_outputs);
    bw_u32(w, flags);
    bw_u32(w, id_len);
    bw_u32(w, corr_len);
    bw_u32(w, params_len);
    bw_u64(w, corr);
    bw_u64(w, timeout_us);
    bw_u64(w, (uint64_t)sender);
}

void bw_tensor_where(bwr_t *w, const tview_t *v, uint32_t where, uint64_t offset);
void bw_tensor(bwr_t *w, const tview_t *v, uint64_t offset);
/* A tensor record of a DONE, checked as parse_tensor checks a JSON one;
 * name (MAX_NAME + 1 bytes) receives its name. ex/ex_len: the region a
 * record with where >= 1 lies in (the caller's choice by where: the
 * EXECUTE region, or a BLS_RESULT one). */
bool read_tensor(brd_t *r, const uint8_t *blob, size_t blob_len, const uint8_t *ex, size_t ex_len,
                 tview_t *v, int64_t *shape, char *name, char *why, size_t why_cap);

/* ---- BLS_CALL and BLS_RESULT descriptions ----
 *
 * BLS_CALL and BLS_RESULT carry binary descriptions too (the little-endian
 * fields and tensor records of "Binary EXECUTE and DONE descriptions").
 * BLS_CALL (worker -> server):
 *   u64 call id, i64 model version, u64 correlation_id, u64 timeout_us,
 *   u32 sequence flags, u32 decoupled (0/1), i32 corr_len (-1: numeric),
 *   u32 model_len, u32 id_len, u32 params_len, u32 n_outputs, u32 n_inputs,
 *   i32 reply slot (-1: none; see "BLS regions"), model name, request id,
 *   correlation id string, parameters (JSON text of an object, absent when
 *   none), n_outputs x (u32 len, name), n_inputs tensor records (where 0:
 *   the message's blob; 1: the EXECUTE region of the execute in flight,
 *   see "BLS tensors by reference").
 * BLS_RESULT (server -> worker):
 *   u64 call id, u32 status (0 outputs, 1 error, 2 empty: a flags-only
 *   final), u32 final, u32 error code, u32 error_len, u32 params_len,
 *   u32 n_outputs, error text, parameters (JSON text), tensor records.
 * The server copies a BLS_CALL's description before reading it and walks
 * it whole (bls_check) before using any of it. Inputs stay where the worker
 * wrote them (its datagram, memfd or BLS region, kept mapped until the
 * call's final response), except BYTES, which are copied and checked
 * again: the worker can still write its memory, and only BYTES have a
 * structure to break.
 */

/* A BLS_CALL's fields, pointing into its (private) description. */
typedef struct bls_req {
    uint64_t id, corr, timeout;
    int64_t version;
    uint32_t flags, decoupled, model_len, id_len, params_len, n_out, n_in;
    int32_t corr_len, reply_slot;
    const uint8_t *model, *rid, *corr_s, *params, *outs, *ins;
    bool by_ref;        /* an input names the EXECUTE region (where 1) */
    uint32_t body_mask; /* the request body slots inputs name (where BODY_WHERE + slot) */
} bls_req_t;

/* Walks a BLS_CALL description whole: every count and length fits, strings
 * hold no NUL, nothing is left over. Fills *q on success. */
bool bls_check(const uint8_t *meta, size_t len, bls_req_t *q);
/* Writes the head of a BLS_RESULT: call id, status (BLS_OUTPUTS, BLS_ERROR,
 * BLS_EMPTY), final, error code, the lengths, then the error text. */
void bls_result_head(bwr_t *w, uint64_t id, uint32_t status, bool final, uint32_t code,
                     const char *text, size_t params_len, size_t n_out);
/* The BYTES inputs of a BLS_CALL whose blob is in the worker's memfd or
 * region: their total size (copied into one private buffer, see
 * bls_inputs). */
size_t bls_bytes_total(const bls_req_t *q, const msg_t *m);

/* Walks a DONE description for n requests without applying it: whether
 * every count and length fits and nothing is left over (a tensor's
 * contents are checked later, per request). */
bool done_check(const uint8_t *meta, size_t len, size_t n, bool decoupled);

#endif
