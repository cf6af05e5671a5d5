/*
 * This file contains the python backend: Triton's Python backend for
 * `backend: "python"` models (a model.py with class TritonPythonModel).
 *
 * Every model instance runs its model.py in a worker process of its own
 * (Debian's python3 running nereid_python_stub.py, which ships next to this
 * library), so instances run in parallel and a crash, os._exit or leak in
 * model code stays in the worker. A worker that dies fails the requests it
 * held; the next execute starts a new one.
 *
 * The worker talks to this library over a Unix SOCK_SEQPACKET socketpair.
 * One datagram is one message: a 16-byte header {type, json_len, blob_len}
 * (little-endian u32, u32, u64), then a JSON object and a blob of tensor
 * bytes. Small messages carry JSON and blob inline; larger ones carry them
 * in an anonymous shared-memory file (memfd, never /dev/shm) passed with
 * SCM_RIGHTS. Tensors are described in the JSON ("tensors": [{name,
 * datatype, shape, offset, size}]) with offsets into the blob; EXECUTE and
 * DONE, the two messages of every batch, carry a binary description in
 * the JSON's place instead (see "Binary EXECUTE and DONE descriptions").
 * The worker is untrusted: every datagram is size-checked, a memfd must be
 * sealed against shrinking before it is mapped, and every name, datatype,
 * shape, offset and size is checked before a byte is copied; a malformed
 * message kills the worker and fails its requests.
 *
 * Threads: each worker has a reader thread here that receives all its
 * messages. Replies the instance thread waits for (ready, execute done,
 * finalized) are handed to it through a one-slot mailbox; decoupled
 * responses, BLS calls, log lines and cancellation checks are served on the
 * reader thread itself. BLS completions arrive on Nereid's threads and
 * write to the socket under the channel's send lock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nereid/backend.h"
#include "python_api.h"
#include "python_env.h"

extern char **environ;

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

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
#define FINALIZE_WAIT_S 30
#define INLINE_MAX_US 1000         /* longest average execute run on the caller's thread */
#define VIEW_MIN (32 * 1024)       /* smallest output handed to the response as a region view */
#define TX_SPARES 2                /* EXECUTE regions kept besides the current one */
#define BLS_SLOTS 8                /* persistent BLS regions per direction and worker */
#define BLS_REGION_MAX (16u << 20) /* a larger BLS message travels in a memfd of its own */
#define BLS_BUDGET (64u << 20)     /* the server's BLS_RESULT regions of one worker, at most */
#define BLS_IN_PLACE 1             /* called models write large BLS outputs into the reply region */
#define SPIN_WAIT_US_DEFAULT 200   /* with 2 CPUs or more, else 0: docs/python_backend.md */
#define SPIN_RECENT 8              /* the spin budget follows the median of this many executes */
#define SPIN_WAIT_US_MAX 10000
#define BODY_SLOTS 8         /* request body regions per model ("Request bodies") */
#define BODY_MIN (16 * 1024) /* a smaller body stays in the frontend's memory */
#define BODY_REGION_MIN (64 * 1024)
#define BODY_BUDGET (64u << 20) /* one model's body regions together, at most */
#define BODY_WHERE 16           /* tensor record where = BODY_WHERE + slot */

/* ---- Backend settings ---- */

typedef struct backend_state {
    char *python; /* interpreter */
    char *stub;   /* nereid_python_stub.py */
    long finalize_wait_s;
    uint64_t spin_max_ns; /* spin-wait-us: longest spin for a worker's answer; 0: never */

    /* The zygote: a pre-started python3 (numpy and pb_utils imported) that
     * forks the workers of models using the backend's interpreter. */
    pthread_mutex_t zy_mu; /* guards what follows; held for one fork */
    bool zy_off;           /* disabled, or it failed before its first fork */
    bool zy_served;        /* the current zygote forked a worker */
    int zy_fd;             /* control socket, -1: not running */
    pid_t zy_pid;
} backend_state_t;

static backend_state_t *g_backend; /* one python backend per process */

/* --backend-config=python,<key>=<value> (or a global --backend-config). */
static const char *backend_config(nereid_backend_t *b, const char *key)
{
    return nereid_backend_config(b, key);
}

static void plog_line(char level, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define plog(level, ...) plog_line(level, __LINE__, __VA_ARGS__)

NEREID_EXPORT nereid_error_t *nereid_backend_init(nereid_backend_t *backend)
{
    backend_state_t *st = calloc(1, sizeof *st);
    if (!st) return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    Dl_info info;
    char dir[PATH_MAX] = ".";
    if (dladdr((void *)nereid_backend_init, &info) && info.dli_fname) {
        snprintf(dir, sizeof dir, "%s", info.dli_fname);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
    }
    const char *cands[2] = {"%s/nereid_python_stub.py", "%s/python/nereid_python_stub.py"};
    for (int i = 0; i < 2 && !st->stub; i++) {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, cands[i], dir);
        if (access(path, R_OK) == 0) st->stub = strdup(path);
    }
    if (!st->stub) {
        free(st);
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "python backend: nereid_python_stub.py not found next to %s", dir);
    }
    const char *py = backend_config(backend, "python-executable");
    if (!py) py = getenv("NEREID_PYTHON");
    st->python = strdup(py && *py ? py : "/usr/bin/python3");
    st->finalize_wait_s = FINALIZE_WAIT_S;
    /* A spin needs a CPU besides the one it waits for: none on one CPU. */
    cpu_set_t cpus;
    int n_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    st->spin_max_ns = n_cpus >= 2 ? SPIN_WAIT_US_DEFAULT * 1000ull : 0;
    const char *sw = backend_config(backend, "spin-wait-us");
    if (sw) {
        char *end;
        errno = 0;
        long v = strtol(sw, &end, 10);
        if (!*sw || *end || errno || v < 0 || v > SPIN_WAIT_US_MAX) {
            free(st->python);
            free(st->stub);
            free(st);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "python backend: spin-wait-us must be an integer from 0 to "
                                    "%d, got '%s'",
                                    SPIN_WAIT_US_MAX, sw);
        }
        st->spin_max_ns = (uint64_t)v * 1000;
    }
    pthread_mutex_init(&st->zy_mu, NULL);
    st->zy_fd = -1;
    const char *zy = backend_config(backend, "zygote");
    if (zy && strcmp(zy, "true") != 0 && strcmp(zy, "false") != 0) {
        pthread_mutex_destroy(&st->zy_mu);
        free(st->python);
        free(st->stub);
        free(st);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "python backend: zygote must be 'true' or 'false', got '%s'", zy);
    }
    st->zy_off = zy && strcmp(zy, "false") == 0;
    const char *t = backend_config(backend, "stub-timeout-seconds");
    if (t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v <= 0) {
            free(st->python);
            free(st->stub);
            free(st);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "stub-timeout-seconds must be a positive integer, got '%s'", t);
        }
        st->finalize_wait_s = v;
    }
    static const char *const ignored[] = {"shm-default-byte-size",  "shm-growth-byte-size",
                                          "shm_message_queue_size", "shm-message-queue-size",
                                          "thread-pool-size",       "shm-region-prefix-name"};
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++)
        if (backend_config(backend, ignored[i]))
            plog('W',
                 "python backend: --backend-config=python,%s is accepted and ignored: tensors "
                 "travel in per-message memfd regions, not in a /dev/shm pool",
                 ignored[i]);
    g_backend = st;
    nereid_backend_set_state(backend, st);
    return NULL;
}

static void zygote_end(backend_state_t *st);

NEREID_EXPORT nereid_error_t *nereid_backend_fini(nereid_backend_t *backend)
{
    backend_state_t *st = nereid_backend_state(backend);
    if (st) {
        zygote_end(st);
        python_env_cleanup();
        pthread_mutex_destroy(&st->zy_mu);
        free(st->python);
        free(st->stub);
        free(st);
    }
    g_backend = NULL;
    return NULL;
}

/* ---- Logging (the server's format and filters) ---- */

/* Lines go through the server's log (its format, filters and --log-file):
 * the backend's own with this file's name and line, a worker's Logger
 * calls with the model file's. */
static void plog_v(nereid_log_level_t level, const char *file, int line, const char *fmt,
                   va_list ap)
{
    char text[8192];
    vsnprintf(text, sizeof text, fmt, ap);
    nereid_log_message(level, file, line, text);
}

static void plog_line(char level, int line, const char *fmt, ...)
{
    nereid_log_level_t lv = level == 'W'   ? NEREID_LOG_WARN
                            : level == 'E' ? NEREID_LOG_ERROR
                            : level == 'V' ? NEREID_LOG_VERBOSE
                                           : NEREID_LOG_INFO;
    va_list ap;
    va_start(ap, fmt);
    plog_v(lv, "python.c", line, fmt, ap);
    va_end(ap);
}
/* ---- Messages ---- */

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

static void region_unref(region_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    munmap(r->map, r->size);
    if (r->fd >= 0) close(r->fd);
    free(r);
}

/* nereid_output_release_fn of an output that is a view of a region. */
static void region_release(void *userp)
{
    region_unref(userp);
}

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

static void rx_regions_clear(rx_regions_t *rx)
{
    region_unref(rx->done);
    rx->done = NULL;
    for (int i = 0; i < BLS_SLOTS; i++) {
        region_unref(rx->bls[i]);
        rx->bls[i] = NULL;
    }
}

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

static void msg_free(msg_t *m)
{
    if (!m) return;
    json_decref(m->json);
    free(m->meta);
    if (m->map) munmap(m->map, m->map_len);
    region_unref(m->region);
    free(m->buf);
    free(m);
}

/* A message kept past its reading: the worker can still write its memfd,
 * so the blob becomes a private copy. */
static void msg_own_blob(msg_t *m)
{
    if (!m->map) return;
    uint8_t *copy = malloc(m->blob_len ? m->blob_len : 1);
    if (!copy) abort();
    memcpy(copy, m->blob, m->blob_len);
    munmap(m->map, m->map_len);
    m->map = NULL;
    free(m->buf);
    m->buf = copy;
    m->blob = copy;
}

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

static chan_t *chan_new(int fd)
{
    chan_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_mutex_init(&c->bls_mu, NULL);
    atomic_init(&c->refs, 1);
    return c;
}

static void chan_unref(chan_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    close(c->fd);
    for (int i = 0; i < BLS_SLOTS; i++)
        region_unref(c->bls_tx[i]);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->bls_mu);
    free(c);
}

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

/* Adds tensor v to the blob; returns its offset there. */
static size_t outmsg_add_view(outmsg_t *m, const tview_t *v)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 8;
        tview_t *t = realloc(m->t, cap * sizeof *t);
        if (!t) abort();
        m->t = t;
        m->cap = cap;
    }
    size_t off = m->blob_len;
    m->t[m->n++] = *v;
    m->blob_len = (m->blob_len + v->size + ALIGN - 1) / ALIGN * ALIGN;
    return off;
}

/* Sends m (and frees what it holds). -1 when the peer is gone. */
static int outmsg_send_region(chan_t *c, uint32_t type, outmsg_t *m, region_t **tx,
                              uint8_t new_slot);

static int outmsg_send(chan_t *c, uint32_t type, outmsg_t *m)
{
    return outmsg_send_region(c, type, m, NULL, 0);
}

/* Copies the message's JSON and tensors to dst. */
static void outmsg_copy(const outmsg_t *m, uint8_t *dst, const char *js, size_t jlen)
{
    memcpy(dst, js, jlen);
    size_t off = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->t[i].size) memcpy(dst + jlen + off, m->t[i].data, m->t[i].size);
        off = (off + m->t[i].size + ALIGN - 1) / ALIGN * ALIGN;
    }
}

/* Room for one fd passed with SCM_RIGHTS. */
typedef union fd_cmsg {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
} fd_cmsg_t;

/* Attaches fd to mh; u holds it and must outlive the sendmsg. */
static void attach_fd(struct msghdr *mh, fd_cmsg_t *u, int fd)
{
    memset(u, 0, sizeof *u);
    mh->msg_control = u->buf;
    mh->msg_controllen = sizeof u->buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
}

/* Sends the len bytes at d (a header, and what a region message adds to
 * it) with fd (-1: none). */
static int send_bytes_with_fd(chan_t *c, const uint8_t *d, size_t len, int fd)
{
    struct iovec iov = {(void *)d, len};
    fd_cmsg_t u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) attach_fd(&mh, &u, fd);
    pthread_mutex_lock(&c->send_mu);
    ssize_t s = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    pthread_mutex_unlock(&c->send_mu);
    return s == (ssize_t)len ? 0 : -1;
}

/* Sends header hdr with fd (-1: none). */
static int send_with_fd(chan_t *c, const uint8_t *hdr, int fd)
{
    return send_bytes_with_fd(c, hdr, HDR_BYTES, fd);
}

/* A fresh memfd mapping's pages are faulted in with one call instead of
 * one fault each as they are touched (each fault costs tens of µs on a
 * paravirtualized machine): what a message is about to write or read, at
 * most POPULATE_MAX (a worker's memfd may be sparse and far larger). */
#define POPULATE_MAX (64u << 20)
static void populate(void *map, size_t len, int advice)
{
    (void)madvise(map, len < POPULATE_MAX ? len : POPULATE_MAX, advice); /* best effort */
}

/* A new region of the server's own: a memfd of size bytes sealed against
 * shrinking (the worker cannot make our writes fault), mapped, named by
 * slot in the messages that use it. NULL when there is no memory for it. */
static region_t *region_new(size_t size, uint8_t slot)
{
    int fd = memfd_create("nereid-python", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    uint8_t *map = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0)
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    region_t *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->map = map;
    r->size = size;
    r->fd = fd;
    r->slot = slot;
    r->fresh = true;
    atomic_init(&r->refs, 1);
    return r;
}

/* A message's header: type, JSON length, blob length (little-endian). */
static void hdr_pack(uint8_t hdr[HDR_BYTES], uint32_t type, uint32_t jlen, uint64_t blob_len)
{
    memcpy(hdr, &type, 4);
    memcpy(hdr + 4, &jlen, 4);
    memcpy(hdr + 8, &blob_len, 8);
}

/* Sends m (and frees what it holds). A large message goes into *tx, the
 * persistent region, when tx is given (a new one in slot new_slot, its
 * memfd sent along, when there is none or it is too small); otherwise
 * into a memfd of its own. -1 when the peer is gone. */
static int outmsg_send_region(chan_t *c, uint32_t type, outmsg_t *m, region_t **tx,
                              uint8_t new_slot)
{
    char *dumped = m->obj ? json_dumps(m->obj, JSON_COMPACT) : NULL;
    const char *js = m->obj ? dumped : (const char *)m->raw;
    json_decref(m->obj);
    m->obj = NULL;
    int rc = -1;
    if (!js) goto out;
    size_t jlen = dumped ? strlen(js) : m->raw_len, total = jlen + m->blob_len;
    uint8_t hdr[HDR_BYTES];
    hdr_pack(hdr, type, (uint32_t)jlen, m->blob_len);
    if (HDR_BYTES + total <= INLINE_MAX) {
        uint8_t *buf = calloc(1, HDR_BYTES + total);
        if (!buf) goto out;
        memcpy(buf, hdr, HDR_BYTES);
        memcpy(buf + HDR_BYTES, js, jlen);
        size_t off = 0;
        for (size_t i = 0; i < m->n; i++) {
            if (m->t[i].size) memcpy(buf + HDR_BYTES + jlen + off, m->t[i].data, m->t[i].size);
            off = (off + m->t[i].size + ALIGN - 1) / ALIGN * ALIGN;
        }
        pthread_mutex_lock(&c->send_mu);
        ssize_t s = send(c->fd, buf, HDR_BYTES + total, MSG_NOSIGNAL);
        pthread_mutex_unlock(&c->send_mu);
        free(buf);
        rc = s == (ssize_t)(HDR_BYTES + total) ? 0 : -1;
        goto out;
    }
    if (tx) {
        int fd = -1;
        if (!*tx || (*tx)->size < total) {
            /* Twice the message: the worker may put its outputs after it. */
            size_t size = total < (1u << 19) ? (1u << 20) : 2 * total;
            if (*tx && size < (*tx)->size * 2) size = (*tx)->size * 2;
            region_t *r = region_new(size, new_slot);
            if (!r) goto out;
            region_unref(*tx);
            *tx = r;
            fd = r->fd;
        }
        outmsg_copy(m, (*tx)->map, js, jlen);
        hdr_pack(hdr, type | M_REGION | (uint32_t)(*tx)->slot << M_SLOT_SHIFT, (uint32_t)jlen,
                 m->blob_len);
        if (m->publish) {
            atomic_fetch_add(&(*tx)->refs, 1);
            pthread_mutex_lock(m->publish_mu);
            region_unref(*m->publish);
            *m->publish = *tx;
            pthread_mutex_unlock(m->publish_mu);
        }
        rc = send_with_fd(c, hdr, fd);
        goto out;
    }
    int fd = memfd_create("nereid-python", MFD_CLOEXEC);
    if (fd < 0) goto out;
    uint8_t *map = MAP_FAILED;
    if (ftruncate(fd, (off_t)total) == 0)
        map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        goto out;
    }
    populate(map, total, MADV_POPULATE_WRITE);
    outmsg_copy(m, map, js, jlen);
    munmap(map, total);
    rc = send_with_fd(c, hdr, fd);
    close(fd);
out:
    free(dumped);
    free(m->raw);
    m->raw = NULL;
    free(m->t);
    m->t = NULL;
    m->n = m->cap = 0;
    return rc;
}

static int send_json(chan_t *c, uint32_t type, json_t *obj)
{
    outmsg_t m = {.obj = obj};
    return outmsg_send(c, type, &m);
}

/* Receives one message. Returns 1 with *out, 0 at EOF, -1 with *why on a
 * malformed message or a socket error. */
static int msg_recv_flags(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap,
                          int flags);
static int msg_recv_into(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap,
                         int flags, uint8_t *scratch);

static int msg_recv(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap)
    __attribute__((unused)); /* the protocol's unit tests receive with it */

static int msg_recv(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap)
{
    return msg_recv_flags(fd, rx, out, why, why_cap, 0);
}

/* msg_recv with recvmsg flags (MSG_DONTWAIT: 2 when nothing is waiting). */
static int msg_recv_flags(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap,
                          int flags)
{
    return msg_recv_into(fd, rx, out, why, why_cap, flags, NULL);
}

/* msg_recv_flags receiving into scratch (RECV_MAX bytes, reused by the
 * caller): the message keeps a copy of just the bytes received, so a small
 * message costs no 64 KiB allocation. NULL: into a buffer of its own. */
static int msg_recv_into(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap,
                         int flags, uint8_t *scratch)
{
    *out = NULL;
    msg_t *m = calloc(1, sizeof *m);
    uint8_t *buf = scratch ? scratch : malloc(RECV_MAX);
    if (!m || !buf) {
        free(m);
        if (!scratch) free(buf);
        snprintf(why, why_cap, "out of memory");
        return -1;
    }
    if (!scratch) m->buf = buf;
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {buf, RECV_MAX};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    do {
        n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        msg_free(m);
        return 2;
    }
    if (scratch && n > 0) {
        m->buf = malloc((size_t)n);
        if (!m->buf) abort();
        memcpy(m->buf, scratch, (size_t)n);
        buf = m->buf;
    }
    int fds[4], n_fds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && n_fds < 4; i++)
            memcpy(&fds[n_fds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    int rc = -1;
    if (n == 0 && n_fds == 0) {
        msg_free(m);
        return 0;
    }
    if (n < 0) {
        snprintf(why, why_cap, "receive failed: %s", strerror(errno));
        goto fail;
    }
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        snprintf(why, why_cap, "message larger than %d bytes", RECV_MAX);
        goto fail;
    }
    if (n < HDR_BYTES || n_fds > 1) {
        snprintf(why, why_cap, "malformed message header");
        goto fail;
    }
    uint32_t jlen;
    uint64_t blen;
    memcpy(&m->type, buf, 4);
    memcpy(&jlen, buf + 4, 4);
    memcpy(&blen, buf + 8, 8);
    if (jlen > JSON_MAX || blen > BLOB_MAX) {
        snprintf(why, why_cap, "message too large");
        goto fail;
    }
    const uint8_t *payload;
    bool in_region = m->type & M_REGION;
    region_t **slot = NULL; /* the region the message names */
    if (in_region) {
        uint32_t k = (m->type & M_SLOT_MASK) >> M_SLOT_SHIFT;
        m->type &= ~(M_REGION | M_SLOT_MASK);
        if (rx && n == HDR_BYTES && m->type == M_DONE && k == 0)
            slot = &rx->done;
        else if (rx && n == HDR_BYTES && m->type == M_BLS_CALL && k < BLS_SLOTS)
            slot = &rx->bls[k];
        if (!slot) {
            snprintf(why, why_cap, "unexpected region message");
            goto fail;
        }
    }
    if (in_region && n_fds == 0) {
        if (!*slot || (*slot)->size < (uint64_t)jlen + blen) {
            snprintf(why, why_cap, "message outside the shared-memory region");
            goto fail;
        }
        m->region = *slot;
        atomic_fetch_add(&m->region->refs, 1);
        payload = m->region->map;
    } else if (n_fds == 1) {
        struct stat st;
        int seals = fcntl(fds[0], F_GET_SEALS);
        if (n != HDR_BYTES || fstat(fds[0], &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) ||
            (uint64_t)st.st_size < jlen + blen || st.st_size == 0 ||
            (slot && slot != &rx->done && (uint64_t)st.st_size > BLS_REGION_MAX)) {
            snprintf(why, why_cap,
                     "bad shared-memory region (it must be a memfd sealed "
                     "against shrinking, holding the message)");
            goto fail;
        }
        m->map_len = (size_t)st.st_size;
        void *map = mmap(NULL, m->map_len, PROT_READ, MAP_SHARED, fds[0], 0);
        if (map == MAP_FAILED) {
            snprintf(why, why_cap, "cannot map the message region: %s", strerror(errno));
            goto fail;
        }
        m->map = map;
        payload = map;
        populate(map, jlen + blen, MADV_POPULATE_READ);
        if (in_region) { /* the worker's new region: kept for later messages */
            region_t *r = calloc(1, sizeof *r);
            if (!r) abort();
            r->map = map;
            r->size = m->map_len;
            r->fd = -1;
            atomic_init(&r->refs, 2);
            m->map = NULL;
            m->region = r;
            region_unref(*slot);
            *slot = r;
        }
    } else {
        if ((uint64_t)n != HDR_BYTES + (uint64_t)jlen + blen) {
            snprintf(why, why_cap, "message length does not match its header");
            goto fail;
        }
        payload = buf + HDR_BYTES;
    }
    if (m->type == M_DONE || m->type == M_BLS_CALL) {
        /* Binary (apply_done, bls_start): copied, so that the worker cannot
         * change it while it is checked and used. */
        m->meta = malloc(jlen ? jlen : 1);
        if (!m->meta) abort();
        memcpy(m->meta, payload, jlen);
        m->meta_len = jlen;
        m->blob = payload + jlen;
        m->blob_len = (size_t)blen;
        *out = m;
        rc = 1;
        m = NULL;
        goto fail;
    }
    json_error_t jerr;
    m->json = json_loadb((const char *)payload, jlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!m->json || !json_is_object(m->json)) {
        snprintf(why, why_cap, "invalid JSON in message: %s",
                 m->json ? "not an object" : jerr.text);
        goto fail;
    }
    m->blob = payload + jlen;
    m->blob_len = (size_t)blen;
    *out = m;
    rc = 1;
    m = NULL;
fail:
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    msg_free(m);
    return rc;
}

/* Whether p[0..size) is exactly elems serialized BYTES elements. Memory the
 * worker can still write is checked again after it was copied. */
static bool bytes_ok(const uint8_t *p, size_t size, uint64_t elems)
{
    size_t pos = 0;
    uint64_t count = 0;
    while (size - pos >= 4) {
        uint32_t len;
        memcpy(&len, p + pos, 4);
        if (len > size - pos - 4) break;
        pos += 4 + len;
        count++;
    }
    return pos == size && count == elems;
}

static uint64_t elements(const int64_t *shape, size_t rank)
{
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n *= (uint64_t)shape[i];
    return n;
}

static bool check_tensor(const char *name, nereid_datatype_t t, int64_t *shape, size_t rank,
                         const int64_t *dims, int64_t off, int64_t size, const uint8_t *blob,
                         size_t blob_len, tview_t *v, char *why, size_t why_cap);

/* A tensor a worker described: checked against the blob and its type. */
static bool parse_tensor(json_t *d, const uint8_t *blob, size_t blob_len, tview_t *v,
                         int64_t *shape, char *why, size_t why_cap)
{
    const char *name = json_string_value(json_object_get(d, "name"));
    const char *dt = json_string_value(json_object_get(d, "datatype"));
    json_t *js = json_object_get(d, "shape");
    json_t *jo = json_object_get(d, "offset"), *jz = json_object_get(d, "size");
    if (!json_is_object(d) || !name || !*name || strlen(name) > MAX_NAME || !dt ||
        !json_is_array(js) || !json_is_integer(jo) || !json_is_integer(jz)) {
        snprintf(why, why_cap, "malformed tensor description");
        return false;
    }
    nereid_datatype_t t = nereid_datatype_from_name(dt);
    if (t == NEREID_TYPE_INVALID) {
        snprintf(why, why_cap, "tensor '%.256s' has an unknown datatype", name);
        return false;
    }
    size_t rank = json_array_size(js);
    int64_t dims[MAX_RANK];
    for (size_t i = 0; i < rank && i < MAX_RANK; i++) {
        json_t *e = json_array_get(js, i);
        dims[i] = json_is_integer(e) ? json_integer_value(e) : -1;
    }
    return check_tensor(name, t, shape, rank, dims, json_integer_value(jo), json_integer_value(jz),
                        blob, blob_len, v, why, why_cap);
}

/* The checks of a tensor description (name, type, dims of rank, offset and
 * size in blob), whichever encoding it came in: *v and shape on success. */
static bool check_tensor(const char *name, nereid_datatype_t t, int64_t *shape, size_t rank,
                         const int64_t *dims, int64_t off, int64_t size, const uint8_t *blob,
                         size_t blob_len, tview_t *v, char *why, size_t why_cap)
{
    if (rank > MAX_RANK) {
        snprintf(why, why_cap, "tensor '%.256s' has more than %d dimensions", name, MAX_RANK);
        return false;
    }
    unsigned __int128 elems = 1;
    for (size_t i = 0; i < rank; i++) {
        if (dims[i] < 0 || dims[i] > INT64_MAX / 2) {
            snprintf(why, why_cap, "tensor '%.256s' has an invalid shape", name);
            return false;
        }
        shape[i] = dims[i];
        elems *= (uint64_t)shape[i];
        if (elems > ((unsigned __int128)1 << 62)) elems = (unsigned __int128)1 << 62;
    }
    if (off < 0 || size < 0 || (uint64_t)off > blob_len ||
        (uint64_t)size > blob_len - (size_t)off) {
        snprintf(why, why_cap, "tensor '%.256s' lies outside its message", name);
        return false;
    }
    size_t esize = nereid_datatype_byte_size(t);
    const uint8_t *p = blob + off;
    if (t == NEREID_TYPE_BYTES) {
        if (!bytes_ok(p, (size_t)size, (uint64_t)elems)) {
            snprintf(why, why_cap, "BYTES tensor '%.256s' does not hold %llu serialized elements",
                     name, (unsigned long long)elems);
            return false;
        }
    } else if (elems * esize != (unsigned __int128)(uint64_t)size) {
        snprintf(why, why_cap, "tensor '%.256s' has %lld bytes, its shape and datatype need %llu",
                 name, (long long)size, (unsigned long long)(elems * esize));
        return false;
    }
    *v = (tview_t){name, t, shape, rank, p, (size_t)size};
    return true;
}

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
#define X(e, name, size, cfg) +1
static const uint32_t N_DATATYPES = 0 NEREID_DATATYPE_MAP(X);
#undef X

typedef struct bwr {
    uint8_t *p;
    size_t n, cap;
} bwr_t;

static void bw_put(bwr_t *w, const void *src, size_t n)
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

static void bw_u32(bwr_t *w, uint32_t v)
{
    bw_put(w, &v, 4);
}

static void bw_u64(bwr_t *w, uint64_t v)
{
    bw_put(w, &v, 8);
}

static void bw_tensor_where(bwr_t *w, const tview_t *v, uint32_t where, uint64_t offset)
{
    size_t len = strlen(v->name);
    bw_u32(w, (uint32_t)len);
    bw_u32(w, (uint32_t)v->datatype);
    bw_u32(w, (uint32_t)v->rank);
    bw_u32(w, where);
    bw_u64(w, offset);
    bw_u64(w, v->size);
    bw_put(w, v->shape, v->rank * sizeof *v->shape);
    bw_put(w, v->name, len);
}

static void bw_tensor(bwr_t *w, const tview_t *v, uint64_t offset)
{
    bw_tensor_where(w, v, 0, offset);
}

typedef struct brd {
    const uint8_t *p;
    size_t n, pos;
    bool bad; /* read past the end */
} brd_t;

static const uint8_t *br_take(brd_t *r, size_t n)
{
    if (r->bad || n > r->n - r->pos) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *q = r->p + r->pos;
    r->pos += n;
    return q;
}

static uint32_t br_u32(brd_t *r)
{
    uint32_t v = 0;
    const uint8_t *q = br_take(r, 4);
    if (q) memcpy(&v, q, 4);
    return v;
}

static uint64_t br_u64(brd_t *r)
{
    uint64_t v = 0;
    const uint8_t *q = br_take(r, 8);
    if (q) memcpy(&v, q, 8);
    return v;
}

/* The where field of the tensor record at rd (not consumed), or
 * UINT32_MAX when the description ends before it. */
static uint32_t record_where(const brd_t *rd)
{
    uint32_t where = UINT32_MAX;
    if (!rd->bad && rd->n - rd->pos >= 16) memcpy(&where, rd->p + rd->pos + 12, 4);
    return where;
}

/* A tensor record of a DONE, checked as parse_tensor checks a JSON one;
 * name (MAX_NAME + 1 bytes) receives its name. ex/ex_len: the region a
 * record with where >= 1 lies in (the caller's choice by where: the
 * EXECUTE region, or a BLS_RESULT one). */
static bool read_tensor(brd_t *r, const uint8_t *blob, size_t blob_len, const uint8_t *ex,
                        size_t ex_len, tview_t *v, int64_t *shape, char *name, char *why,
                        size_t why_cap)
{
    uint32_t name_len = br_u32(r), dt = br_u32(r), rank = br_u32(r), where = br_u32(r);
    uint64_t off = br_u64(r), size = br_u64(r);
    int64_t dims[MAX_RANK];
    const uint8_t *d = br_take(r, (size_t)rank * sizeof(int64_t));
    const uint8_t *nm = br_take(r, name_len);
    if (r->bad || name_len == 0 || name_len > MAX_NAME ||
        (where > 1 + BLS_SLOTS && (where < BODY_WHERE || where >= BODY_WHERE + BODY_SLOTS)) ||
        (where >= 1 && !ex) || memchr(nm, 0, name_len)) {
        snprintf(why, why_cap, "malformed tensor description");
        return false;
    }
    memcpy(name, nm, name_len);
    name[name_len] = '\0';
    if (dt == NEREID_TYPE_INVALID || dt > N_DATATYPES) {
        snprintf(why, why_cap, "tensor '%.256s' has an unknown datatype", name);
        return false;
    }
    if (rank <= MAX_RANK) memcpy(dims, d, rank * sizeof(int64_t));
    return check_tensor(name, (nereid_datatype_t)dt, shape, rank, dims,
                        off > INT64_MAX ? -1 : (int64_t)off, size > INT64_MAX ? -1 : (int64_t)size,
                        where ? ex : blob, where ? ex_len : blob_len, v, why, why_cap);
}

/* ---- Instances and their workers ---- */

typedef struct sender_slot {
    uint64_t id;
    nereid_response_sender_t *sender;
    struct sender_slot *next;
} sender_slot_t;

typedef struct instance {
    char *name;
    nereid_model_t *model;
    nereid_server_t *server;
    bool decoupled;
    char *init_json; /* the INIT message, kept for restarts */

    /* The current worker; replaced by the instance thread only. */
    pid_t pid;
    int pidfd; /* a worker forked by the zygote: signalled and watched here; -1 when
                  spawned (our child: kill and waitpid) */
    chan_t *chan;
    int epfd;   /* the reader thread waits here: the socket (EPOLLONESHOT, see
                   "Arming the reader") and kickfd */
    int kickfd; /* eventfd: wakes the reader to look at `armed` again */
    pthread_t reader;
    bool reader_running;
    const char *python;            /* interpreter (borrowed from the model or backend) */
    region_t *tx;                  /* EXECUTE inputs (instance thread only) */
    region_t *tx_spare[TX_SPARES]; /* earlier EXECUTE regions, or NULL (instance thread only) */
    rx_regions_t rx;               /* the worker's DONE and BLS_CALL regions (whichever
                                      thread reads) */
    uint8_t *rbuf;                 /* receive buffer (RECV_MAX) of whichever thread reads */
    uint64_t msgs_in;              /* messages received from the worker (whichever thread reads) */
    uint64_t tx_made; /* EXECUTE regions made (their memfd sent), instance thread only */
    /* Request bodies (see "Request bodies"; execute's thread only) */
    region_t *exec_body[BODY_SLOTS];  /* body regions the execute in flight references
                                         (a reference each), else NULL; written under mu
                                         (a BLS call of the execute may name them) */
    region_t *body_held[BODY_SLOTS];  /* body regions the worker says its arrays still
                                         view (a reference each), else NULL */
    uint64_t body_mapped[BODY_SLOTS]; /* id of the body region the current worker has
                                         mapped in each slot; 0: none */
    uint64_t body_inputs;             /* inputs sent by reference to a body region */
    uint64_t tx_switches; /* executes whose region a reply still held (another one taken) */

    /* spin-wait (execute's thread only, but the word: the worker writes it) */
    void *spin_map;                       /* the page shared with the worker, or NULL */
    const _Atomic uint64_t *spin_word;    /* in it: messages the worker has sent */
    _Atomic uint64_t *spin_hint;          /* and: how long (µs) the worker may spin after
                                             the execute just sent (written before EXECUTE) */
    uint64_t spin_hints;                  /* executes that let the worker spin after them */
    uint64_t spin_recent_ns[SPIN_RECENT]; /* EXECUTE -> DONE of the last executes that spun */
    uint64_t spin_n;                      /* executes that spun (so far) */
    uint64_t spin_hits;                   /* ... and saw the answer while spinning */
    uint32_t spin_misses_in_row;
    uint32_t spin_contended_in_row; /* spins in a row that another thread interrupted */
    uint32_t spin_skip;             /* executes left that do not spin (back-off) */

    pthread_mutex_t mu; /* guards what follows */
    pthread_cond_t cv;
    bool dead;            /* the worker is gone (reader thread ended) */
    char *death;          /* why, when it sent something invalid */
    char *pump_fail;      /* a readiness check reading the socket found it broken (why) */
    msg_t *early_done;    /* ... and received execute's DONE, kept for execute */
    msg_t *reply;         /* READY / DONE / FINALIZED for the instance thread */
    uint32_t expect;      /* the reply type the instance thread waits for; 0: none */
    bool exec_reading;    /* execute reads the socket itself (the reader is parked) */
    bool armed;           /* the socket's one-shot registration is armed */
    bool eager_arm;       /* the reader read a message since the last execute: re-arm at
                             the end of the next one */
    uint64_t exec_end_ns; /* when the last execute gave the socket back */
    bool bg_in_recv;      /* the reader thread is receiving */
    bool reaped;          /* the worker was killed and waited for */
    sender_slot_t *senders;
    uint64_t next_sender;
    nereid_batch_t *batch; /* during execute, for cancellation checks */
    region_t *exec_rx;     /* the EXECUTE region of the execute in flight (a reference), or
                              NULL: what a BLS input by reference (where 1) may name */
    size_t bls_inflight;
    struct bls_call *bls_calls; /* in flight, for M_BLS_CANCEL */
    /* BLS result outputs (any thread; logged at fini): written in place by
     * the called model ("BLS results in place"), or copied into the reply */
    _Atomic uint64_t bls_placed_n, bls_placed_bytes, bls_copied_n, bls_copied_bytes;
    _Atomic uint64_t bls_regions_made; /* BLS_RESULT regions sent to the worker */
    /* The model's is_ready() (Triton's user-defined readiness): one check
     * in flight at a time, later checks wait for its answer. */
    bool has_is_ready;
    bool rq_inflight;
    uint64_t rq_answers; /* answers received (a waiter sees its own arrive) */
    bool rq_ready;
    char *rq_error;              /* is_ready() raised or returned a non-bool */
    python_api_t *api;           /* the worker's metrics (python_api.c) */
    atomic_int *model_instances; /* how many the model has (model_state_t) */
} instance_t;

static nereid_error_t *unhealthy(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    nereid_error_t *e =
        in->death ? nereid_error_new(NEREID_ERROR_INTERNAL,
                                     "Stub process '%s' is not healthy: it sent an invalid "
                                     "message: %s",
                                     in->name, in->death)
                  : nereid_error_new(NEREID_ERROR_INTERNAL, "Stub process '%s' is not healthy.",
                                     in->name);
    pthread_mutex_unlock(&in->mu);
    return e;
}

static nereid_error_t *error_from_json(json_t *e)
{
    const char *text = json_string_value(json_object_get(e, "message"));
    json_t *jc = json_object_get(e, "code");
    json_int_t code = json_is_integer(jc) ? json_integer_value(jc) : NEREID_ERROR_INTERNAL;
    if (code < NEREID_ERROR_UNKNOWN || code > NEREID_ERROR_CANCELLED) code = NEREID_ERROR_INTERNAL;
    return nereid_error_new((nereid_error_code_t)code, "%s", text ? text : "");
}

/* Removes and returns the sender with this id (NULL if unknown). */
static nereid_response_sender_t *sender_take(instance_t *in, uint64_t id, bool remove)
{
    pthread_mutex_lock(&in->mu);
    nereid_response_sender_t *s = NULL;
    for (sender_slot_t **p = &in->senders; *p; p = &(*p)->next) {
        if ((*p)->id != id) continue;
        s = (*p)->sender;
        if (remove) {
            sender_slot_t *dead = *p;
            *p = dead->next;
            free(dead);
        }
        break;
    }
    pthread_mutex_unlock(&in->mu);
    return s;
}

/* A decoupled response from the worker. */
static bool on_response(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *js = json_object_get(m->json, "sender"), *jf = json_object_get(m->json, "flags");
    if (!json_is_integer(js) || !json_is_integer(jf) ||
        (json_integer_value(jf) & ~(json_int_t)NEREID_RESPONSE_FLAG_FINAL)) {
        snprintf(why, why_cap, "malformed response");
        return false;
    }
    uint32_t flags = (uint32_t)json_integer_value(jf);
    bool final = flags & NEREID_RESPONSE_FLAG_FINAL;
    nereid_response_sender_t *s = sender_take(in, (uint64_t)json_integer_value(js), final);
    if (!s) return true; /* already closed: the model is told nothing more is sent */
    json_t *err = json_object_get(m->json, "error");
    nereid_error_t *e = NULL;
    if (json_is_object(err)) {
        e = nereid_sender_send(s, flags, error_from_json(err));
    } else if (json_is_true(json_object_get(m->json, "empty"))) {
        e = nereid_sender_send_flags(s, flags);
    } else {
        nereid_error_t *bad =
            python_api_response_parameters(json_object_get(m->json, "parameters"), NULL, 0, s);
        json_t *ts = bad ? NULL : json_object_get(m->json, "tensors");
        size_t i;
        json_t *d;
        json_array_foreach(ts, i, d)
        {
            tview_t v;
            int64_t shape[MAX_RANK];
            char w[512];
            if (!parse_tensor(d, m->blob, m->blob_len, &v, shape, w, sizeof w)) {
                bad = nereid_error_new(NEREID_ERROR_INTERNAL, "Python model '%s': %s", in->name, w);
                break;
            }
            void *buf;
            bad = nereid_sender_output(s, v.name, v.datatype, v.shape, v.rank, v.size, &buf);
            if (bad) break;
            if (v.size) memcpy(buf, v.data, v.size);
            if (v.datatype == NEREID_TYPE_BYTES &&
                !bytes_ok(buf, v.size, elements(v.shape, v.rank))) {
                bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                       "Python model '%s': BYTES tensor '%s' changed while it "
                                       "was read",
                                       in->name, v.name);
                break;
            }
        }
        e = nereid_sender_send(s, flags, bad);
    }
    nereid_error_free(e);
    return true;
}

static void on_log(instance_t *in, msg_t *m)
{
    json_t *jl = json_object_get(m->json, "level");
    const char *text = json_string_value(json_object_get(m->json, "message"));
    const char *file = json_string_value(json_object_get(m->json, "file"));
    json_t *jline = json_object_get(m->json, "line");
    if (!text) return;
    json_int_t lv = json_is_integer(jl) ? json_integer_value(jl) : 0;
    nereid_log_level_t level = lv == 1   ? NEREID_LOG_WARN
                               : lv == 2 ? NEREID_LOG_ERROR
                               : lv == 3 ? NEREID_LOG_VERBOSE
                                         : NEREID_LOG_INFO;
    const char *base = file ? strrchr(file, '/') : NULL;
    json_int_t line = json_is_integer(jline) ? json_integer_value(jline) : 0;
    nereid_log_message(level,
                       base   ? base + 1
                       : file ? file
                              : in->name,
                       line < 0 || line > INT32_MAX ? 0 : (int)line, text);
}

static void on_cancel_query(instance_t *in, msg_t *m)
{
    json_t *id = json_object_get(m->json, "id"), *tok = json_object_get(m->json, "token");
    bool cancelled = false;
    json_t *jr = json_object_get(tok, "request"), *js = json_object_get(tok, "sender");
    if (json_is_integer(js)) {
        pthread_mutex_lock(&in->mu);
        for (sender_slot_t *p = in->senders; p; p = p->next)
            if (p->id == (uint64_t)json_integer_value(js))
                cancelled = nereid_sender_is_cancelled(p->sender);
        pthread_mutex_unlock(&in->mu);
    } else if (json_is_integer(jr)) {
        pthread_mutex_lock(&in->mu);
        json_int_t r = json_integer_value(jr);
        if (in->batch && r >= 0 && (size_t)r < nereid_batch_request_count(in->batch))
            cancelled = nereid_batch_request_is_cancelled(in->batch, (size_t)r);
        pthread_mutex_unlock(&in->mu);
    }
    send_json(in->chan, M_CANCEL_ANSWER,
              json_pack("{s:O, s:b}", "id", id ? id : json_null(), "cancelled", cancelled));
}

/* ---- BLS: a worker's request into any model of the server ----
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
 *
 * BLS regions. A large BLS message (past INLINE_MAX, at most
 * BLS_REGION_MAX) travels in a persistent region, not in a memfd of its
 * own (a fresh memfd costs its page faults, and its unmapping a TLB
 * shootdown, on both sides: ~1.5 ms for 256 KiB each way on a
 * paravirtualized machine). Each side owns the regions it writes and
 * sends each one's memfd once, with the first message in it; a message
 * names its region by slot (0..BLS_SLOTS-1, the M_SLOT bits of its type).
 * The worker decides which slots are free, in both directions, because it
 * alone knows when its arrays die:
 *   - BLS_CALL: the worker writes the message (description and blob) at
 *     offset 0 of one of its regions no call in flight uses; the header
 *     alone travels (and the memfd, sealed against shrinking, when the
 *     region is new). The server maps it read-only, at most BLS_REGION_MAX
 *     bytes, keeps one mapping per slot (rx_regions_t, replaced when a
 *     memfd comes with the slot) and reads the inputs there as from a
 *     memfd. The slot is free again when the call's final BLS_RESULT
 *     arrived.
 *   - BLS_RESULT: the call names a reply slot: one of the server's
 *     regions that no array of the worker's still views and no call in
 *     flight writes. The server writes each response (description, then
 *     blob; or blob, then description: "BLS results in place") there, one
 *     after the other, and sends the header and two u64: the offsets of
 *     the blob and of the description in the region (with the region's memfd, its
 *     own, sealed against shrinking, when it made a new one: none yet in
 *     the slot, or too small). The worker's result arrays are views of the
 *     region; the slot stays taken while any of them lives (weak references
 *     to the array they all view), so kept results never change. A result
 *     larger than BLS_REGION_MAX, or a region past BLS_BUDGET for the
 *     worker, or a call without a reply slot (all taken), uses a memfd of
 *     its own as before.
 * A worker that lies about slots only garbles its own results: the server
 * checks every slot number, offset and length against the region it names
 * and never reads what it wrote into its BLS_RESULT regions.
 *
 * BLS tensors by reference. Two copies of a large tensor are skipped when
 * the model hands on what it was given:
 *   - a BLS input that is a view of the EXECUTE region of the execute in
 *     flight (the model's own input) is a where 1 record: the server
 *     accepts it only while its own execute is in flight (in->exec_rx,
 *     published before the EXECUTE is sent, dropped when DONE arrived),
 *     holds that region until the call's final response (tx_pick then
 *     takes another for the next EXECUTE), and ends a worker naming it
 *     with none in flight. The worker sends it only from the thread
 *     running execute, before DONE, so the socket's order makes it valid;
 *   - a DONE output that is a view of a BLS result is a where 2 + k record:
 *     the response holds the BLS_RESULT region k (a reference) until it is
 *     sent, and bls_send_result gives a new call's results a new region
 *     instead of one a response still holds, whatever slot the worker
 *     offers (it cannot know when the reply went).
 *
 * BLS results in place. A call with a reply slot to a model that is not
 * decoupled (one response) gives its request a response allocator
 * (bls_alloc): each numeric output of VIEW_MIN bytes or more is placed in
 * the reply region, one after the other from offset 0, so the called
 * model (ONNX Runtime's bound outputs, a C backend's memcpy, a Python
 * model's DONE) writes it where the worker will read it. The region is the
 * slot's when no response holds it and it has room, else a new one the
 * call keeps to itself (counted in bls_new_bytes) until its response takes
 * the slot. The response (bls_send_placed) then copies only what was not
 * placed (small, BYTES, no room left) after the placed outputs, writes the
 * description after those, and sends the header with the blob's and the
 * description's offsets. When the region is no longer the slot's (a worker
 * naming one slot for two calls) or the rest does not fit, the response
 * goes as before, without a region (the placed bytes are copied). A failed
 * call's placed bytes are garbage in a region no array of the worker views
 * (the slot is the call's), and a new region that never took the slot is
 * dropped. A decoupled model's several responses, and calls without a
 * reply slot, keep malloc'ed outputs and the copy. */

enum { BLS_OUTPUTS = 0, BLS_ERROR = 1, BLS_EMPTY = 2 };
#define BLS_FIXED (4 * 8 + 9 * 4) /* the fixed fields of a BLS_CALL */

typedef struct bls_call {
    instance_t *in;
    chan_t *chan;
    msg_t *msg; /* holds the inputs' bytes until the final response */
    uint64_t id;
    nereid_cancel_token_t *cancel; /* the request's: cancelled by M_BLS_CANCEL */
    uint8_t *bytes;                /* private copies of BYTES inputs from a memfd */
    region_t *ex;                  /* the EXECUTE region inputs by reference read, or NULL */
    int reply_slot;                /* the worker's choice of our BLS_RESULT region, or -1 */
    size_t reply_used;             /* bytes of it this call's responses took so far */
    struct bls_call *next;         /* in->bls_calls */
    region_t *body[BODY_SLOTS];    /* request body regions inputs by reference read (a
                                      reference each), or NULL */
    /* Outputs placed in the reply region ("BLS results in place"), under
     * chan->bls_mu while the called model allocates (ensemble steps may
     * allocate from several threads), then read by the one response: */
    region_t *dst;   /* where they are (a reference), or NULL: none placed */
    size_t dst_used; /* bytes the placed outputs take, from offset 0 */
    bool dst_new;    /* dst is a new region not yet in bls_tx (counted in bls_new_bytes) */
    bool in_place;   /* the request has bls_alloc as its allocator */
    bool dst_closed; /* a response came: later outputs are malloc'ed (a model that turned
                        decoupled since the call began may send more than one) */
} bls_call_t;

#define BLS_DESC_ROOM 4096 /* what placing keeps free for the rest of a response */

/* Where output bytes go in the region: the next ALIGN boundary. */
static size_t bls_align(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* A place for byte_size bytes in the call's reply region (chan->bls_mu
 * held), or NULL. The first output chooses the region: the slot's when no
 * response holds it and it has room, else a new one (within BLS_BUDGET). */
static uint8_t *bls_place(bls_call_t *call, size_t byte_size)
{
    chan_t *c = call->chan;
    if (!call->dst) {
        region_t *r = c->bls_tx[call->reply_slot];
        if (r && atomic_load(&r->refs) == 1 && r->size >= byte_size + BLS_DESC_ROOM) {
            atomic_fetch_add(&r->refs, 1);
        } else {
            /* Room for another output as large, and the description. */
            size_t size = (2 * byte_size + BLS_DESC_ROOM + 4095) & ~(size_t)4095;
            if (size < (1u << 20)) size = 1u << 20;
            if (size > BLS_REGION_MAX) size = BLS_REGION_MAX;
            if (size < byte_size + BLS_DESC_ROOM) return NULL;
            size_t old = r ? r->size : 0;
            if (c->bls_tx_bytes + c->bls_new_bytes - old + size > BLS_BUDGET) return NULL;
            r = region_new(size, (uint8_t)call->reply_slot);
            if (!r) return NULL;
            c->bls_new_bytes += size;
            call->dst_new = true;
        }
        call->dst = r;
        call->dst_used = 0;
    }
    region_t *r = call->dst;
    size_t off = bls_align(call->dst_used);
    if (off > r->size || r->size - off < byte_size + BLS_DESC_ROOM) return NULL;
    call->dst_used = off + byte_size;
    return r->map + off;
}

/* nereid_alloc_fn of a BLS call's request: large numeric outputs in the
 * reply region (each holds a reference to it, *buffer_userp), the others
 * malloc'ed (*buffer_userp NULL). Any thread. */
static nereid_error_t *bls_alloc(void *userp, const char *name, nereid_datatype_t datatype,
                                 const int64_t *shape, size_t rank, size_t byte_size, void **buffer,
                                 void **buffer_userp)
{
    (void)name;
    (void)shape;
    (void)rank;
    bls_call_t *call = userp;
    *buffer_userp = NULL;
    if (datatype != NEREID_TYPE_BYTES && byte_size >= VIEW_MIN) {
        pthread_mutex_lock(&call->chan->bls_mu);
        uint8_t *p = call->dst_closed ? NULL : bls_place(call, byte_size);
        if (p) atomic_fetch_add(&call->dst->refs, 1);
        region_t *r = call->dst;
        bool fresh = call->dst_new;
        pthread_mutex_unlock(&call->chan->bls_mu);
        if (p) {
            if (fresh) { /* its pages in one call, not one fault each as the model writes */
                size_t start = (size_t)(p - r->map) & ~(size_t)4095;
                populate(r->map + start, (size_t)(p - r->map) + byte_size - start,
                         MADV_POPULATE_WRITE);
            }
            *buffer = p;
            *buffer_userp = r;
            return NULL;
        }
    }
    /* the server's own memory (copied into the BLS_RESULT as before) */
    *buffer = NULL;
    *buffer_userp = NEREID_ALLOC_DECLINED;
    return NULL;
}

/* nereid_release_fn of bls_alloc's buffers: when the response is freed. */
static void bls_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)userp;
    (void)buffer;
    (void)byte_size;
    region_unref(buffer_userp); /* placed outputs only: bls_alloc declines the others */
}

/* Sends a BLS_RESULT: its description in w (freed) and tensors in om. */
static void bls_send(chan_t *c, bwr_t *w, outmsg_t *om)
{
    om->raw = w->p;
    om->raw_len = w->n;
    outmsg_send(c, M_BLS_RESULT, om);
}

/* Sends a call's BLS_RESULT (as bls_send) in the reply region the worker
 * named, when it is large enough to leave the datagram: after the call's
 * earlier responses there, or at the start of a new region (its memfd sent
 * along) when they leave no room. Calls for one request never overlap, so
 * reply_used needs no lock; the slot's table entry does. */
static void bls_send_result(bls_call_t *call, bwr_t *w, outmsg_t *om)
{
    chan_t *c = call->chan;
    size_t total = w->n + om->blob_len;
    if (call->reply_slot < 0 || HDR_BYTES + total <= INLINE_MAX || total > BLS_REGION_MAX) {
        bls_send(c, w, om);
        return;
    }
    uint8_t k = (uint8_t)call->reply_slot;
    uint64_t off = (call->reply_used + ALIGN - 1) / ALIGN * ALIGN;
    int fd = -1;
    pthread_mutex_lock(&c->bls_mu);
    region_t *r = c->bls_tx[k];
    /* A new call's results never go where a response still reads (a DONE
     * output naming this region, kept until the reply is sent): a fresh
     * region takes the slot, the old one lives on in that response. */
    bool held = r && call->reply_used == 0 && atomic_load(&r->refs) > 1;
    if (!r || held || r->size < off || r->size - off < total) {
        size_t size = total < (1u << 19) ? (1u << 20) : 2 * total;
        if (size > BLS_REGION_MAX) size = BLS_REGION_MAX;
        if (held && size < r->size) size = r->size;
        size_t old = r ? r->size : 0;
        r = c->bls_tx_bytes - old + size <= BLS_BUDGET ? region_new(size, k) : NULL;
        if (r) {
            region_unref(c->bls_tx[k]);
            c->bls_tx[k] = r;
            c->bls_tx_bytes = c->bls_tx_bytes - old + size;
            fd = r->fd; /* sent once, with this message */
            r->fd = -1;
            off = 0;
            atomic_fetch_add(&call->in->bls_regions_made, 1);
            populate(r->map, total, MADV_POPULATE_WRITE);
        }
    }
    if (r) atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&c->bls_mu);
    if (!r) { /* over the budget */
        bls_send(c, w, om);
        return;
    }
    outmsg_copy(om, r->map + off, (const char *)w->p, w->n);
    uint8_t d[HDR_BYTES + 16];
    uint64_t blob_off = off + w->n;
    hdr_pack(d, M_BLS_RESULT | M_REGION | (uint32_t)k << M_SLOT_SHIFT, (uint32_t)w->n,
             om->blob_len);
    memcpy(d + HDR_BYTES, &blob_off, 8);
    memcpy(d + HDR_BYTES + 8, &off, 8);
    region_unref(r); /* before the worker can answer: its next call finds the region free */
    send_bytes_with_fd(c, d, sizeof d, fd);
    if (fd >= 0) close(fd);
    call->reply_used = off + total;
    free(w->p);
    free(om->t);
    om->t = NULL;
}

static void bls_result_head(bwr_t *w, uint64_t id, uint32_t status, bool final, uint32_t code,
                            const char *text, size_t params_len, size_t n_out)
{
    size_t len = text ? strlen(text) : 0;
    bw_u64(w, id);
    bw_u32(w, status);
    bw_u32(w, final);
    bw_u32(w, code);
    bw_u32(w, (uint32_t)len);
    bw_u32(w, (uint32_t)params_len);
    bw_u32(w, (uint32_t)n_out);
    bw_put(w, text, len);
}

static void bls_reply_error(chan_t *c, uint64_t id, const char *text, nereid_error_code_t code)
{
    bwr_t w = {0};
    outmsg_t om = {0};
    bls_result_head(&w, id, BLS_ERROR, true, (uint32_t)code, text, 0, 0);
    bls_send(c, &w, &om);
}

static void bls_done(bls_call_t *call)
{
    instance_t *in = call->in;
    if (call->dst) { /* the call's reference (a new region that never took the slot: gone) */
        pthread_mutex_lock(&call->chan->bls_mu);
        if (call->dst_new) call->chan->bls_new_bytes -= call->dst->size;
        pthread_mutex_unlock(&call->chan->bls_mu);
        region_unref(call->dst);
        call->dst = NULL;
    }
    msg_free(call->msg);
    free(call->bytes);
    region_unref(call->ex);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(call->body[s]);
    chan_unref(call->chan);
    pthread_mutex_lock(&in->mu);
    for (bls_call_t **p = &in->bls_calls; *p; p = &(*p)->next)
        if (*p == call) {
            *p = call->next;
            break;
        }
    nereid_cancel_token_free(call->cancel);
    free(call);
    in->bls_inflight--;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

/* The head of a BLS_RESULT with outputs: its fields, then the response's
 * parameters. */
static void bls_outputs_head(bwr_t *w, uint64_t id, nereid_response_t *resp, bool final)
{
    json_t *params = python_api_response_parameters_json(resp);
    char *ptext = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    size_t plen = ptext ? strlen(ptext) : 0;
    bls_result_head(w, id, BLS_OUTPUTS, final, 0, NULL, plen, nereid_response_output_count(resp));
    bw_put(w, ptext, plen);
    free(ptext);
}

/* Output i of resp as *v; true when the called model wrote it within
 * [lo, hi), the placed part of the reply region. */
static bool bls_output(nereid_response_t *resp, size_t i, tview_t *v, uintptr_t lo, uintptr_t hi)
{
    void *unused;
    nereid_response_output(resp, i, &v->name, &v->datatype, &v->shape, &v->rank, &v->data, &v->size,
                           &unused);
    uintptr_t p = (uintptr_t)v->data;
    return v->size && p >= lo && p < hi && v->size <= hi - p;
}

/* Sends resp, whose outputs are (some of them) placed in call->dst: the
 * others copied after them, the description after those; the header names
 * the blob's offset (0) and the description's. Frees resp and drops dst
 * when it returns true; false, nothing sent: the region is not the slot's
 * (any more), or the rest does not fit. */
static bool bls_send_placed(bls_call_t *call, region_t *r, size_t used, nereid_response_t *resp,
                            bool final)
{
    chan_t *c = call->chan;
    uint8_t k = (uint8_t)call->reply_slot;
    size_t n = nereid_response_output_count(resp);
    bwr_t w = {0};
    bls_outputs_head(&w, call->id, resp, final);
    uintptr_t lo = (uintptr_t)r->map, hi = lo + used;
    size_t end = bls_align(used); /* the blob: placed outputs, then the others */
    uint64_t placed_n = 0, placed_bytes = 0, copied_n = 0, copied_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        tview_t v;
        if (bls_output(resp, i, &v, lo, hi)) {
            bw_tensor(&w, &v, (uintptr_t)v.data - lo);
            placed_n++;
            placed_bytes += v.size;
        } else {
            bw_tensor(&w, &v, end);
            end = bls_align(end + v.size);
            copied_n++;
            copied_bytes += v.size;
        }
    }
    size_t meta_off = end;
    int fd = -1;
    bool ok = meta_off <= r->size && r->size - meta_off >= w.n;
    pthread_mutex_lock(&c->bls_mu);
    if (ok && call->dst_new) { /* the new region takes the slot; its memfd goes along */
        region_t *old = c->bls_tx[k];
        size_t old_size = old ? old->size : 0;
        c->bls_new_bytes -= r->size;
        call->dst_new = false;
        ok = c->bls_tx_bytes + c->bls_new_bytes - old_size + r->size <= BLS_BUDGET;
        if (ok) {
            region_unref(old);
            atomic_fetch_add(&r->refs, 1);
            c->bls_tx[k] = r;
            c->bls_tx_bytes = c->bls_tx_bytes - old_size + r->size;
            fd = r->fd;
            r->fd = -1;
            atomic_fetch_add(&call->in->bls_regions_made, 1);
        }
    } else if (ok) {
        ok = c->bls_tx[k] == r;
    }
    pthread_mutex_unlock(&c->bls_mu);
    if (!ok) {
        free(w.p);
        return false;
    }
    size_t off = bls_align(used);
    for (size_t i = 0; i < n; i++) {
        tview_t v;
        if (bls_output(resp, i, &v, lo, hi)) continue;
        if (v.size) memcpy(r->map + off, v.data, v.size);
        off = bls_align(off + v.size);
    }
    memcpy(r->map + meta_off, w.p, w.n);
    uint8_t d[HDR_BYTES + 16];
    uint64_t blob_off = 0, desc_off = meta_off;
    hdr_pack(d, M_BLS_RESULT | M_REGION | (uint32_t)k << M_SLOT_SHIFT, (uint32_t)w.n, end);
    memcpy(d + HDR_BYTES, &blob_off, 8);
    memcpy(d + HDR_BYTES + 8, &desc_off, 8);
    call->reply_used = meta_off + w.n;
    free(w.p);
    instance_t *in = call->in;
    atomic_fetch_add(&in->bls_placed_n, placed_n);
    atomic_fetch_add(&in->bls_placed_bytes, placed_bytes);
    atomic_fetch_add(&in->bls_copied_n, copied_n);
    atomic_fetch_add(&in->bls_copied_bytes, copied_bytes);
    /* The response's and the call's references go before the worker can
     * answer: its next call finds the region free, not held. */
    nereid_response_free(resp);
    pthread_mutex_lock(&c->bls_mu);
    call->dst = NULL;
    pthread_mutex_unlock(&c->bls_mu);
    region_unref(r);
    send_bytes_with_fd(c, d, sizeof d, fd);
    if (fd >= 0) close(fd);
    return true;
}

static void bls_on_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    bls_call_t *call = userp;
    bool final = flags & NEREID_RESPONSE_FINAL;
    bwr_t w = {0};
    outmsg_t om = {0};
    region_t *dst = NULL;
    size_t dst_used = 0;
    if (call->in_place) { /* what the allocations placed, and no more */
        pthread_mutex_lock(&call->chan->bls_mu);
        call->dst_closed = true;
        dst = call->dst;
        dst_used = call->dst_used;
        pthread_mutex_unlock(&call->chan->bls_mu);
    }
    if (resp && dst && call->reply_used == 0 && !nereid_response_error(resp)) {
        if (bls_send_placed(call, dst, dst_used, resp, final)) { /* resp freed */
            if (final) bls_done(call);
            return;
        }
        /* Sent as before, without a region: outputs in dst are copied. */
        call->reply_slot = -1;
    }
    if (!resp) {
        bls_result_head(&w, call->id, BLS_EMPTY, true, 0, NULL, 0, 0);
    } else if (nereid_response_error(resp)) {
        const nereid_error_t *e = nereid_response_error(resp);
        bls_result_head(&w, call->id, BLS_ERROR, final, (uint32_t)nereid_error_code(e),
                        nereid_error_message(e), 0, 0);
    } else {
        bls_outputs_head(&w, call->id, resp, final);
        for (size_t i = 0; i < nereid_response_output_count(resp); i++) {
            tview_t v;
            bls_output(resp, i, &v, 0, 0);
            bw_tensor(&w, &v, outmsg_add_view(&om, &v));
            atomic_fetch_add(&call->in->bls_copied_n, 1);
            atomic_fetch_add(&call->in->bls_copied_bytes, v.size);
        }
    }
    bls_send_result(call, &w, &om);
    if (resp) nereid_response_free(resp);
    if (final) bls_done(call);
}

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
static bool bls_check(const uint8_t *meta, size_t len, bls_req_t *q)
{
    brd_t rd = {meta, len, 0, false};
    q->by_ref = false;
    q->body_mask = 0;
    q->id = br_u64(&rd);
    q->version = (int64_t)br_u64(&rd);
    q->corr = br_u64(&rd);
    q->timeout = br_u64(&rd);
    q->flags = br_u32(&rd);
    q->decoupled = br_u32(&rd);
    q->corr_len = (int32_t)br_u32(&rd);
    q->model_len = br_u32(&rd);
    q->id_len = br_u32(&rd);
    q->params_len = br_u32(&rd);
    q->n_out = br_u32(&rd);
    q->n_in = br_u32(&rd);
    q->reply_slot = (int32_t)br_u32(&rd);
    if (rd.bad || q->decoupled > 1 || q->corr_len < -1 || q->model_len == 0 ||
        q->model_len > MAX_NAME || q->reply_slot < -1 || q->reply_slot >= BLS_SLOTS)
        return false;
    q->model = br_take(&rd, q->model_len);
    q->rid = br_take(&rd, q->id_len);
    q->corr_s = br_take(&rd, q->corr_len < 0 ? 0 : (size_t)q->corr_len);
    q->params = br_take(&rd, q->params_len);
    if (rd.bad || memchr(q->model, 0, q->model_len) || memchr(q->rid, 0, q->id_len) ||
        (q->corr_len > 0 && memchr(q->corr_s, 0, (size_t)q->corr_len)))
        return false;
    q->outs = rd.p + rd.pos;
    for (uint32_t i = 0; i < q->n_out && !rd.bad; i++) {
        uint32_t n = br_u32(&rd);
        const uint8_t *s = br_take(&rd, n);
        if (!rd.bad && (n == 0 || n > MAX_NAME || memchr(s, 0, n))) return false;
    }
    q->ins = rd.p + rd.pos;
    for (uint32_t i = 0; i < q->n_in && !rd.bad; i++) {
        uint32_t name_len = br_u32(&rd), dt = br_u32(&rd);
        uint32_t rank = br_u32(&rd), where = br_u32(&rd);
        br_take(&rd, 16); /* offset, size */
        br_take(&rd, (size_t)rank * sizeof(int64_t));
        br_take(&rd, name_len);
        bool body = where >= BODY_WHERE && where < BODY_WHERE + BODY_SLOTS;
        if ((where > 1 && !body) || (where >= 1 && dt == NEREID_TYPE_BYTES)) return false;
        if (where == 1) q->by_ref = true;
        if (body) q->body_mask |= 1u << (where - BODY_WHERE);
    }
    return !rd.bad && rd.pos == rd.n;
}

/* A NUL-terminated copy of n bytes at s (the description's strings). */
static char *bls_str(const uint8_t *s, size_t n)
{
    char *t = malloc(n + 1);
    if (!t) abort();
    if (n) memcpy(t, s, n);
    t[n] = '\0';
    return t;
}

/* The request's parameters: a JSON object of strings, booleans, integers
 * and numbers (other values are ignored, as before). */
static nereid_error_t *bls_parameters(nereid_request_t *req, const bls_req_t *q)
{
    if (!q->params_len) return NULL;
    json_error_t jerr;
    json_t *jp = json_loadb((const char *)q->params, q->params_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(jp)) {
        json_decref(jp);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "BLS request parameters must be a JSON object");
    }
    nereid_error_t *err = NULL;
    const char *key;
    json_t *val;
    json_object_foreach(jp, key, val)
    {
        if (err) break;
        if (json_is_string(val))
            err = nereid_request_set_parameter_string(req, key, json_string_value(val));
        else if (json_is_boolean(val))
            err = nereid_request_set_parameter_bool(req, key, json_is_true(val));
        else if (json_is_integer(val))
            err = nereid_request_set_parameter_int(req, key, json_integer_value(val));
        else if (json_is_real(val))
            err = nereid_request_set_parameter_double(req, key, json_real_value(val));
    }
    json_decref(jp);
    return err;
}

/* The BYTES inputs of a BLS_CALL whose blob is in the worker's memfd or
 * region: their total size (copied into one private buffer, see
 * bls_inputs). */
static size_t bls_bytes_total(const bls_req_t *q, const msg_t *m)
{
    if (!m->map && !m->region) return 0;
    brd_t rd = {q->ins, m->meta + m->meta_len - q->ins, 0, false};
    size_t total = 0;
    for (uint32_t i = 0; i < q->n_in; i++) {
        uint32_t name_len = br_u32(&rd), dt = br_u32(&rd), rank = br_u32(&rd);
        br_u32(&rd);
        br_u64(&rd);
        uint64_t size = br_u64(&rd);
        br_take(&rd, (size_t)rank * sizeof(int64_t) + name_len);
        if (dt == NEREID_TYPE_BYTES && size <= m->blob_len) total += (size_t)size;
    }
    return total;
}

/* Adds the inputs (records checked here against the blob, or against ex,
 * the EXECUTE region in flight, for where 1, or against body[slot], a
 * request body region of the execute in flight, for where BODY_WHERE +
 * slot) to req. false: the worker described a tensor that does not add up
 * (*why). */
static bool bls_inputs(nereid_request_t *req, const bls_req_t *q, msg_t *m, const region_t *ex,
                       region_t *const *body, uint8_t *bytes, nereid_error_t **err, char *why,
                       size_t why_cap)
{
    brd_t rd = {q->ins, m->meta + m->meta_len - q->ins, 0, false};
    size_t used = 0;
    for (uint32_t i = 0; i < q->n_in && !*err; i++) {
        tview_t v;
        int64_t shape[MAX_RANK];
        char name[MAX_NAME + 1];
        uint32_t where = record_where(&rd);
        const region_t *in_region = where == 1 ? ex
                                    : where >= BODY_WHERE && where < BODY_WHERE + BODY_SLOTS
                                        ? body[where - BODY_WHERE]
                                        : NULL;
        size_t in_len = !in_region ? 0 : where == 1 ? in_region->size : in_region->used;
        if (!read_tensor(&rd, m->blob, m->blob_len, in_region ? in_region->map : NULL, in_len, &v,
                         shape, name, why, why_cap))
            return false;
        if (v.datatype == NEREID_TYPE_BYTES && bytes) {
            memcpy(bytes + used, v.data, v.size);
            v.data = bytes + used;
            used += v.size;
            if (!bytes_ok(v.data, v.size, elements(v.shape, v.rank))) {
                snprintf(why, why_cap, "BYTES tensor '%.256s' changed while it was read", name);
                return false;
            }
        }
        *err = nereid_request_add_input(req, v.name, v.datatype, v.shape, v.rank, v.data, v.size);
    }
    return true;
}

static bool bls_start(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    bls_req_t q;
    if (!bls_check(m->meta, m->meta_len, &q)) {
        snprintf(why, why_cap, "malformed BLS request");
        return false;
    }
    char *model = bls_str(q.model, q.model_len), text[2048];
    chan_t *c = in->chan;
    bool target_decoupled = false;
    nereid_error_t *err =
        nereid_server_model_decoupled(in->server, model, q.version, &target_decoupled);
    if (err) { /* Triton's text: the lookup's error (unknown model, ...) as it is */
        snprintf(text, sizeof text, "Model %s - Error when running inference: %s", model,
                 nereid_error_message(err));
        bls_reply_error(c, q.id, text, nereid_error_code(err));
        nereid_error_free(err);
        free(model);
        msg_free(m);
        return true;
    }
    if (target_decoupled && !q.decoupled) {
        snprintf(text, sizeof text,
                 "Model %s - Error when running inference: Model %s is using the decoupled. The "
                 "current BLS request call doesn't support models using the decoupled "
                 "transaction policy. Please use 'decoupled=True' argument to the 'exec' or "
                 "'async_exec' calls for decoupled models.'",
                 model, model);
        bls_reply_error(c, q.id, text, NEREID_ERROR_INVALID_ARG);
        free(model);
        msg_free(m);
        return true;
    }
    nereid_request_t *req = NULL;
    err = nereid_request_new(in->server, model, q.version, &req);
    if (!err && q.id_len) {
        char *rid = bls_str(q.rid, q.id_len);
        err = nereid_request_set_id(req, rid);
        free(rid);
    }
    if (!err && q.corr_len >= 0) {
        char *cs = bls_str(q.corr_s, (size_t)q.corr_len);
        err = nereid_request_set_correlation_id_string(req, cs);
        free(cs);
    } else if (!err && q.corr) {
        nereid_request_set_correlation_id(req, q.corr);
    }
    if (!err) {
        if (q.flags) nereid_request_set_sequence_flags(req, q.flags & 1, q.flags & 2);
        if (q.timeout) nereid_request_set_timeout_us(req, q.timeout);
        err = bls_parameters(req, &q);
    }
    size_t nbytes = bls_bytes_total(&q, m);
    uint8_t *bytes = nbytes ? malloc(nbytes) : NULL;
    if (nbytes && !bytes) abort();
    /* Inputs by reference: only into the region of the execute in flight
     * and its request body regions (held until the call's final response,
     * so they are not reused). */
    region_t *ex = NULL, *body[BODY_SLOTS] = {0};
    bool body_ok = true;
    if (q.by_ref || q.body_mask) {
        pthread_mutex_lock(&in->mu);
        if (q.by_ref) {
            ex = in->exec_rx;
            if (ex) atomic_fetch_add(&ex->refs, 1);
        }
        for (int s = 0; s < BODY_SLOTS; s++) {
            if (!(q.body_mask >> s & 1)) continue;
            body[s] = in->exec_body[s];
            if (body[s])
                atomic_fetch_add(&body[s]->refs, 1);
            else
                body_ok = false;
        }
        pthread_mutex_unlock(&in->mu);
    }
    bool bad = !body_ok || (q.by_ref && !ex);
    if (bad)
        snprintf(why, why_cap, "%s",
                 !body_ok ? "BLS input in a request body region the execute in flight does not "
                            "read"
                          : "BLS input in the execute region while no execute is in flight");
    else if (!err)
        bad = !bls_inputs(req, &q, m, ex, body, bytes, &err, why, why_cap);
    if (bad) {
        region_unref(ex);
        for (int s = 0; s < BODY_SLOTS; s++)
            region_unref(body[s]);
        nereid_request_free(req);
        free(bytes);
        free(model);
        return false;
    }
    brd_t ro = {q.outs, q.ins - q.outs, 0, false};
    for (uint32_t i = 0; i < q.n_out && !err; i++) {
        uint32_t n = br_u32(&ro);
        char *name = bls_str(br_take(&ro, n), n);
        err = nereid_request_add_requested_output(req, name, 0);
        free(name);
    }
    if (!err) {
        bls_call_t *call = calloc(1, sizeof *call);
        if (!call) abort();
        *call = (bls_call_t){.in = in,
                             .chan = c,
                             .msg = m,
                             .id = q.id,
                             .cancel = nereid_cancel_token_new(),
                             .bytes = bytes,
                             .ex = ex,
                             .reply_slot = q.reply_slot};
        memcpy(call->body, body, sizeof body);
        memset(body, 0, sizeof body);
        nereid_request_set_cancel_token(req, call->cancel);
        atomic_fetch_add(&c->refs, 1);
        pthread_mutex_lock(&in->mu);
        in->bls_inflight++;
        call->next = in->bls_calls;
        in->bls_calls = call;
        pthread_mutex_unlock(&in->mu);
        /* One response into a reply region: the called model writes large
         * outputs there itself ("BLS results in place"). */
        nereid_response_allocator_t place = {
            .alloc_fn = bls_alloc, .release_fn = bls_release, .userp = call};
        call->in_place = q.reply_slot >= 0 && !target_decoupled && BLS_IN_PLACE;
        /* The worker can write its messages' memfds and regions and the
         * EXECUTE region inputs by reference read (ex); not the request
         * bodies' (sealed) nor a datagram's (ours): what is computed from
         * those inputs is not cached. */
        unsigned foreign = m->map || m->region || ex ? NEREID_FOREIGN_INPUTS : 0;
        if (call->in_place) foreign |= NEREID_FOREIGN_OUTPUTS; /* our reply region */
        if (foreign) nereid_request_set_foreign_memory(req, foreign);
        err = nereid_server_infer_stream(in->server, req, call->in_place ? &place : NULL,
                                         bls_on_response, call);
        if (!err) {
            free(model);
            return true;
        }
        call->msg = NULL;
        call->bytes = NULL;
        call->ex = NULL;
        bls_done(call);
    }
    region_unref(ex);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(body[s]);
    nereid_request_free(req);
    free(bytes);
    snprintf(text, sizeof text, "Model %s - Error when running inference: %s", model,
             nereid_error_message(err));
    bls_reply_error(c, q.id, text, nereid_error_code(err));
    nereid_error_free(err);
    free(model);
    msg_free(m);
    return true;
}

/* ResponseIterator.cancel(): cancels the request of the worker's BLS call
 * (the model it went to sees is_cancelled(), queued steps end CANCELLED).
 * An unknown or finished call is ignored, as Triton ignores a cancel after
 * the last response. */
static bool bls_cancel(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *jc = json_object_get(m->json, "call");
    if (!json_is_integer(jc)) {
        snprintf(why, why_cap, "malformed BLS cancel");
        return false;
    }
    pthread_mutex_lock(&in->mu);
    for (bls_call_t *c = in->bls_calls; c; c = c->next)
        if (c->chan == in->chan && c->id == (uint64_t)json_integer_value(jc))
            nereid_request_cancel(c->cancel);
    pthread_mutex_unlock(&in->mu);
    return true;
}

/* ---- pb_utils calls besides inference (python_api.c) ---- */

typedef struct api_job {
    instance_t *in;
    chan_t *chan;
    msg_t *msg;
} api_job_t;

static void api_answer(chan_t *c, json_t *call, json_t *answer)
{
    if (json_is_true(json_object_get(call, "noreply"))) { /* a metric update */
        json_decref(answer);
        return;
    }
    json_t *id = json_object_get(call, "id");
    json_object_set(answer, "id", json_is_integer(id) ? id : json_null());
    send_json(c, M_API_ANSWER, answer);
}

/* Model control may wait for loads and unloads: it runs on a thread of its
 * own, counted with the BLS calls so the instance outlives it. */
static void *api_job_main(void *arg)
{
    api_job_t *job = arg;
    api_answer(job->chan, job->msg->json,
               python_api_model_control(job->in->server, job->msg->json, job->msg->blob,
                                        job->msg->blob_len));
    instance_t *in = job->in;
    msg_free(job->msg);
    chan_unref(job->chan);
    free(job);
    pthread_mutex_lock(&in->mu);
    in->bls_inflight--;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    return NULL;
}

/* The instance whose socket this thread reads (reader_main, or execute in
 * execute_read_done), and how deep in ready_pump it is. */
static _Thread_local instance_t *tls_reading;
static _Thread_local int tls_pump_depth;
static _Thread_local bool tls_exec_reading; /* ... and it is execute */

/* is_model_ready is answered where it arrives (no thread): the lookup is
 * quick, and a Python model's is_ready() runs in that model's worker. When
 * the model asks about itself and defines is_ready(), the answer comes on
 * the socket this thread reads: the check reads it itself (ready_pump).
 * Such a check takes a thread when one already reads (nested), and when
 * the model has other instances: their answers come on sockets that their
 * own reading threads may be blocking in the same check. */
static bool ready_check_inline(instance_t *in, json_t *call)
{
    const char *op = json_string_value(json_object_get(call, "op"));
    const char *model = json_string_value(json_object_get(call, "model"));
    if (!op || !model || strcmp(op, "is_model_ready") != 0) return false;
    if (strcmp(model, nereid_model_name(in->model)) != 0) return true;
    pthread_mutex_lock(&in->mu);
    bool asks_worker = in->has_is_ready;
    pthread_mutex_unlock(&in->mu);
    return !asks_worker ||
           (tls_pump_depth == 0 && (!in->model_instances || atomic_load(in->model_instances) <= 1));
}

static void api_call(instance_t *in, msg_t **m)
{
    if (!python_api_blocks((*m)->json)) {
        api_answer(in->chan, (*m)->json, python_api_metrics(in->api, (*m)->json));
        return;
    }
    if (ready_check_inline(in, (*m)->json)) {
        api_answer(in->chan, (*m)->json,
                   python_api_model_control(in->server, (*m)->json, (*m)->blob, (*m)->blob_len));
        return;
    }
    msg_t *msg = *m;
    *m = NULL;
    msg_own_blob(msg);
    api_job_t *job = malloc(sizeof *job);
    if (!job) abort();
    *job = (api_job_t){in, in->chan, msg};
    atomic_fetch_add(&in->chan->refs, 1);
    pthread_mutex_lock(&in->mu);
    in->bls_inflight++;
    pthread_mutex_unlock(&in->mu);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, api_job_main, job) != 0) api_job_main(job);
    pthread_attr_destroy(&attr);
}

/* ---- The model's is_ready() (Triton's user-defined model readiness) ---- */

#define READY_WAIT_S 5 /* Triton's kUserModelReadinessTimeoutMs */
#define READY_ERROR_MAX 4096

static bool on_ready_answer(instance_t *in, msg_t *m, char *why, size_t why_cap)
{
    json_t *jr = json_object_get(m->json, "ready");
    const char *err = json_string_value(json_object_get(m->json, "error"));
    if (!json_is_boolean(jr) && !err) {
        snprintf(why, why_cap, "malformed readiness answer");
        return false;
    }
    pthread_mutex_lock(&in->mu);
    if (in->rq_inflight) {
        in->rq_inflight = false;
        in->rq_answers++;
        in->rq_ready = json_is_true(jr) && !err;
        free(in->rq_error);
        in->rq_error = err ? strndup(err, READY_ERROR_MAX) : NULL;
        pthread_cond_broadcast(&in->cv);
    }
    pthread_mutex_unlock(&in->mu);
    return true;
}

/* The answer the last is_ready() gave (in->mu held). */
static nereid_error_t *ready_result_locked(instance_t *in)
{
    if (in->rq_error) return nereid_error_new(NEREID_ERROR_INTERNAL, "%s", in->rq_error);
    if (!in->rq_ready)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "Model '%s' is not ready (user-defined check failed).", in->name);
    return NULL;
}

static bool dispatch(instance_t *in, msg_t **m, char *why, size_t why_cap);
static void reader_arm_locked(instance_t *in);
static bool deliver_reply(instance_t *in, msg_t **m, char *why, size_t why_cap);

/* A readiness check on the thread that reads the worker's socket (the
 * model asked about itself from execute or a thread of its own): reads and
 * serves the worker's messages until is_ready()'s answer (answers past
 * `seen`) or the deadline (false). Execute's DONE is kept for it; a broken
 * socket or a malformed message is left in in->pump_fail for the reading
 * loop, which ends the worker. */
static bool ready_pump(instance_t *in, uint64_t seen, const struct timespec *dl)
{
    char why[512] = "";
    tls_pump_depth++;
    for (;;) {
        pthread_mutex_lock(&in->mu);
        bool answered = in->rq_answers != seen, failed = in->pump_fail != NULL;
        pthread_mutex_unlock(&in->mu);
        if (answered || failed) break;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        long long ms =
            (long long)(dl->tv_sec - now.tv_sec) * 1000 + (dl->tv_nsec - now.tv_nsec) / 1000000;
        if (ms <= 0) {
            tls_pump_depth--;
            return false;
        }
        struct pollfd p = {in->chan->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(ms > INT_MAX ? INT_MAX : ms)) <= 0) continue;
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, MSG_DONTWAIT, in->rbuf);
        if (rc == 2) continue;
        bool ok = rc == 1;
        in->msgs_in += ok;
        if (ok && m->type == M_DONE && tls_exec_reading && !in->early_done) {
            in->early_done = m; /* execute_read_done takes it */
            m = NULL;
        } else if (ok && (m->type == M_READY || m->type == M_DONE || m->type == M_FINALIZED)) {
            ok = !tls_exec_reading && deliver_reply(in, &m, why, sizeof why);
            if (!ok && !why[0]) snprintf(why, sizeof why, "an unexpected reply");
        } else if (ok) {
            ok = dispatch(in, &m, why, sizeof why);
        }
        msg_free(m);
        if (!ok) {
            pthread_mutex_lock(&in->mu);
            if (!in->pump_fail) in->pump_fail = strdup(rc == 0 ? "" : why);
            pthread_cond_broadcast(&in->cv);
            pthread_mutex_unlock(&in->mu);
        }
        why[0] = '\0';
    }
    tls_pump_depth--;
    return true;
}

/* A model-ready check (Triton's TRITONBACKEND_ModelInstanceReady): the
 * worker must be alive; a model with is_ready() is asked (in the worker, on
 * a thread of its own, so executes go on), at most once at a time: a check
 * that finds one in flight waits for its answer. Each waits at most 5 s;
 * an is_ready() still running then keeps running and answers later. */
NEREID_EXPORT nereid_error_t *nereid_backend_instance_ready(nereid_instance_t *instance)
{
    instance_t *in = nereid_instance_state(instance);
    if (!in) return NULL;
    pthread_mutex_lock(&in->mu);
    if (in->dead) {
        pthread_mutex_unlock(&in->mu);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Stub process '%s' is not healthy.",
                                in->name);
    }
    if (!in->has_is_ready) {
        pthread_mutex_unlock(&in->mu);
        return NULL;
    }
    bool joined = in->rq_inflight;
    uint64_t seen = in->rq_answers;
    if (!joined) {
        in->rq_inflight = true;
        if (!in->exec_reading) reader_arm_locked(in); /* the answer comes between executes */
        chan_t *c = in->chan;
        atomic_fetch_add(&c->refs, 1);
        pthread_mutex_unlock(&in->mu);
        send_json(c, M_READY_QUERY, json_object());
        chan_unref(c);
        pthread_mutex_lock(&in->mu);
    }
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += READY_WAIT_S;
    bool timed_out = false;
    if (tls_reading == in) { /* nobody else reads the answer: read it here */
        pthread_mutex_unlock(&in->mu);
        timed_out = !ready_pump(in, seen, &dl);
        pthread_mutex_lock(&in->mu);
    }
    while (in->rq_answers == seen && !in->dead && !timed_out && !in->pump_fail)
        timed_out = pthread_cond_timedwait(&in->cv, &in->mu, &dl) == ETIMEDOUT;
    nereid_error_t *e;
    if (in->rq_answers != seen)
        e = ready_result_locked(in);
    else if (in->dead || in->pump_fail)
        e = nereid_error_new(NEREID_ERROR_INTERNAL,
                             "Stub process is not healthy while waiting for user-defined "
                             "is_ready() response");
    else if (joined)
        e = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "Timed out waiting for in-flight is_ready() response");
    else
        e = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                             "Timed out waiting for user-defined is_ready() response");
    pthread_mutex_unlock(&in->mu);
    return e;
}

/* ---- The reader thread ---- */

/* Handles a message that is not a reply (log, decoupled response,
 * cancellation check, BLS call), on whichever thread reads the socket.
 * Takes *m (sets it NULL when kept). false: the worker misbehaved. */
static bool dispatch(instance_t *in, msg_t **m, char *why, size_t why_cap)
{
    switch ((*m)->type) {
    case M_LOG:
        on_log(in, *m);
        return true;
    case M_RESPONSE:
        return on_response(in, *m, why, why_cap);
    case M_CANCEL_QUERY:
        on_cancel_query(in, *m);
        return true;
    case M_BLS_CALL:
        if (!bls_start(in, *m, why, why_cap)) return false;
        *m = NULL; /* the call owns it now */
        return true;
    case M_API_CALL:
        api_call(in, m);
        return true;
    case M_BLS_CANCEL:
        return bls_cancel(in, *m, why, why_cap);
    case M_READY_ANSWER:
        return on_ready_answer(in, *m, why, why_cap);
    default:
        snprintf(why, why_cap, "unknown message type %u", (*m)->type);
        return false;
    }
}

/* The worker is gone or misbehaved: end it (once) and everything it held. */
static void worker_died(instance_t *in, const char *why)
{
    if (why[0]) plog('E', "python backend: worker of '%s': %s", in->name, why);
    pthread_mutex_lock(&in->mu);
    bool first = !in->reaped;
    in->reaped = true;
    /* The first reason wins: recorded before the kill, whose hang-up
     * another reading thread may report while this one waits. */
    if (why[0] && !in->death) in->death = strdup(why);
    pthread_mutex_unlock(&in->mu);
    if (first && in->pidfd >= 0) { /* the zygote reaps it; its end is seen here */
        pidfd_send_signal(in->pidfd, SIGKILL, NULL, 0);
        struct pollfd p = {in->pidfd, POLLIN, 0};
        while (poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
    } else if (first) {
        kill(in->pid, SIGKILL);
        while (waitpid(in->pid, NULL, 0) < 0 && errno == EINTR) {
        }
    }
    python_api_reset(in->api); /* the worker's metric objects are gone */
    pthread_mutex_lock(&in->mu);
    in->dead = true;
    in->rq_inflight = false; /* its is_ready() answer will not come */
    sender_slot_t *senders = in->senders;
    in->senders = NULL;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
    while (senders) {
        sender_slot_t *next = senders->next;
        nereid_error_free(
            nereid_sender_send(senders->sender, NEREID_RESPONSE_FLAG_FINAL, unhealthy(in)));
        free(senders);
        senders = next;
    }
}

/* Hands a reply (READY / DONE / FINALIZED) to the instance thread waiting
 * for it; false (*why) when nobody waits for one of its type. */
static bool deliver_reply(instance_t *in, msg_t **m, char *why, size_t why_cap)
{
    bool ok = true;
    pthread_mutex_lock(&in->mu);
    if (in->reply || (*m)->type != in->expect) {
        ok = false;
        snprintf(why, why_cap, "an unexpected reply");
    } else {
        in->expect = 0;
        in->reply = *m;
        *m = NULL;
        pthread_cond_broadcast(&in->cv);
    }
    pthread_mutex_unlock(&in->mu);
    return ok;
}

/* Whether a readiness check that read the socket (ready_pump) found it
 * broken: its reason in why. */
static bool pump_failed(instance_t *in, char *why, size_t why_cap)
{
    pthread_mutex_lock(&in->mu);
    char *f = in->pump_fail;
    in->pump_fail = NULL;
    pthread_mutex_unlock(&in->mu);
    if (!f) return false;
    snprintf(why, why_cap, "%s", f);
    free(f);
    return true;
}

/* Arming the reader. The reader thread's registration of the socket is
 * EPOLLONESHOT: armed, the worker's next message (or hang-up) wakes the
 * reader once and disarms it; disarmed, a message wakes nobody but a thread
 * blocked in recvmsg. Execute reads the socket itself, so the registration
 * must be disarmed while it does, or the worker's DONE would wake the
 * reader too (a second wake-up, on another CPU, per request). Disarming and
 * re-arming around every execute is two epoll_ctl calls per request (4 µs
 * here); instead an execute leaves the registration disarmed when it ends,
 * and the reader arms it once no execute has run for LAZY_ARM_NS: while
 * requests keep coming, no epoll_ctl at all. The price is that a message
 * the worker sends between executes (a thread's log line, a decoupled
 * response, a BLS call) waits up to LAZY_ARM_NS to be read; so an execute
 * re-arms at once when it ends for decoupled models, when the reader has
 * read such a message since the last execute (the model sends between
 * executes), and while the server waits for an answer outside execute
 * (is_ready(), BLS and model control calls in flight). Every change of
 * `armed` is made under in->mu, and only while no execute reads. */
#define LAZY_ARM_NS (2 * 1000 * 1000)

/* Arms the registration (in->mu held; no execute reads). */
static void reader_arm_locked(instance_t *in)
{
    if (in->armed) return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = in->chan->fd};
    if (epoll_ctl(in->epfd, EPOLL_CTL_MOD, in->chan->fd, &ev) != 0)
        abort(); /* our own registration: cannot fail */
    in->armed = true;
}

/* Arms the registration unless an execute reads (that execute re-arms when
 * it ends, if anyone still waits): for a thread about to wait for a
 * message outside execute. */
static void reader_arm(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    if (!in->exec_reading) reader_arm_locked(in);
    pthread_mutex_unlock(&in->mu);
}

/* The reader thread: serves the worker's messages between executes (during
 * one, the instance thread reads the socket itself and this thread stays
 * parked, so an answer reaches execute without a thread hand-off). */
static void *reader_main(void *arg)
{
    instance_t *in = arg;
    char why[512] = "";
    for (;;) {
        int timeout_ms = -1;
        pthread_mutex_lock(&in->mu);
        if (!in->armed) { /* an execute left it disarmed: arm it once they stop */
            uint64_t idle_ns = in->exec_reading ? 0 : nereid_now_ns() - in->exec_end_ns;
            if (!in->exec_reading && idle_ns >= LAZY_ARM_NS)
                reader_arm_locked(in);
            else
                timeout_ms = (int)((LAZY_ARM_NS - idle_ns + 999999) / 1000000);
        }
        pthread_mutex_unlock(&in->mu);
        struct epoll_event evs[2];
        int n = epoll_wait(in->epfd, evs, 2, timeout_ms);
        if (n < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "epoll_wait failed: %s", strerror(errno));
            break;
        }
        bool readable = false;
        for (int i = 0; i < n; i++) {
            if (evs[i].data.fd == in->kickfd) {
                eventfd_t v;
                eventfd_read(in->kickfd, &v);
            } else {
                readable = true;
            }
        }
        if (!readable) continue;
        pthread_mutex_lock(&in->mu);
        in->armed = false; /* it fired */
        while (in->exec_reading)
            pthread_cond_wait(&in->cv, &in->mu);
        in->bg_in_recv = true;
        pthread_mutex_unlock(&in->mu);
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, MSG_DONTWAIT, in->rbuf);
        bool ok = rc == 1;
        in->msgs_in += ok;
        tls_reading = in;
        if (ok && (m->type == M_READY || m->type == M_DONE || m->type == M_FINALIZED))
            ok = deliver_reply(in, &m, why, sizeof why);
        else if (ok)
            ok = dispatch(in, &m, why, sizeof why);
        tls_reading = NULL;
        msg_free(m);
        ok = ok && !pump_failed(in, why, sizeof why);
        /* Only now may execute read: a decoupled sender's responses are sent
         * in order and never from two threads at once. */
        pthread_mutex_lock(&in->mu);
        in->bg_in_recv = false;
        if (rc == 1) in->eager_arm = true;
        if (!in->exec_reading && (rc == 1 || rc == 2)) reader_arm_locked(in); /* the next one */
        pthread_cond_broadcast(&in->cv);
        pthread_mutex_unlock(&in->mu);
        if (rc == 2) continue;
        if (!ok) break;
        why[0] = '\0';
    }
    worker_died(in, why);
    return NULL;
}

/* Execute takes the socket from the reader thread: a receive the reader
 * already started is waited for, and an armed registration is disarmed
 * (so the worker's messages wake the executing thread only); the reader is
 * kicked to arm it again once executes stop. */
static void exec_reading_begin(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->exec_reading = true;
    while (in->bg_in_recv)
        pthread_cond_wait(&in->cv, &in->mu);
    /* Kicked unless the end re-arms it for sure. */
    bool kick = in->armed && !in->decoupled && !in->eager_arm;
    if (in->armed) {
        struct epoll_event ev = {.events = 0, .data.fd = in->chan->fd};
        if (epoll_ctl(in->epfd, EPOLL_CTL_MOD, in->chan->fd, &ev) != 0) abort();
        in->armed = false;
    }
    pthread_mutex_unlock(&in->mu);
    if (kick) eventfd_write(in->kickfd, 1); /* it may wait with no timeout */
}

/* Gives the socket back to the reader thread: re-armed at once when
 * messages are expected between executes, else by the reader later
 * ("Arming the reader"). */
static void exec_reading_end(instance_t *in)
{
    pthread_mutex_lock(&in->mu);
    in->exec_reading = false;
    in->exec_end_ns = nereid_now_ns();
    if (in->decoupled || in->eager_arm || in->rq_inflight || in->bls_inflight)
        reader_arm_locked(in);
    in->eager_arm = false;
    pthread_cond_broadcast(&in->cv);
    pthread_mutex_unlock(&in->mu);
}

/* ---- spin-wait: waiting for the worker's answer without sleeping ----
 *
 * A worker answers a small execute in tens of µs; a thread that blocks in
 * recvmsg for that answer sleeps, and waking it costs several µs (more when
 * its CPU went idle on a virtual machine). So execute's thread first watches a word in a page it
 * shares with the worker (M_SPIN_PAGE, sent at the worker's start only when
 * spin-wait-us > 0): the worker writes there how many messages it has sent,
 * after each sendmsg. While that is not more than the server has received,
 * the thread spins (pause, no syscall; sched_yield now and then, so a
 * runnable thread on its CPU is not kept waiting), at most until a budget,
 * then blocks in recvmsg as before. The word is only a hint: a worker that
 * writes nonsense makes the server spin for nothing or not at all, never
 * read a message that is not there.
 *
 * Budget: spin-wait-us, or 1.5x the median EXECUTE -> DONE time of the
 * instance's last SPIN_RECENT executes that spun when that is shorter. An
 * instance whose median is longer than spin-wait-us does not spin (it
 * probes one execute in SPIN_PROBE_EVERY); SPIN_MISSES_MAX spins in a row
 * that ran out stop spinning for SPIN_PROBE_EVERY executes, and so do
 * SPIN_CONTENDED_MAX spins in a row that another thread interrupted
 * (spin_wait). No spin unless this
 * is the only Python execute in flight in the process, for one request
 * (spin_hint_set), nor when the instance's previous execute ended under
 * SPIN_MIN_GAP_NS ago (requests queue: the CPU has other work).
 *
 * The worker's side: the page also carries a hint the server writes before
 * each EXECUTE, how long the worker may spin for its next request once it
 * has answered this one (spin-wait-us when this execute is alone, else 0);
 * the worker spins at most that, and stops (and backs off) when threads
 * wait for a CPU (nereid_python_stub.py, Worker.spin_recv). That side is
 * what lowers the latency (it removes the worker's wake-up for EXECUTE).
 *
 * On by default (200 µs) where the process may use 2 CPUs or more: with the
 * hint and the worker's load check it lowers the latency at 1 connection
 * and keeps the throughput at 4 (docs/performance.md, "Merged main,
 * session 12"). */
#define SPIN_PROBE_EVERY 32
#define SPIN_MIN_GAP_NS (15 * 1000)
#define SPIN_CONTENDED_NS (4 * 1000)
#define SPIN_MISSES_MAX 4
#define SPIN_CONTENDED_MAX 2 /* interrupted spins in a row that stop spinning */

static atomic_int g_executing; /* python executes in flight in the process */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* This execute's spin budget (ns; 0: block at once). Execute's thread. */
static uint64_t spin_budget_ns(instance_t *in, uint64_t now_ns, bool alone)
{
    uint64_t max = g_backend->spin_max_ns;
    if (!max || !in->spin_word) return 0;
    if (in->spin_skip) {
        in->spin_skip--;
        return 0;
    }
    if (!alone) return 0;
    /* exec_end_ns is written by executes only (under mu, for the reader) */
    if (now_ns - in->exec_end_ns < SPIN_MIN_GAP_NS) return 0; /* requests queue: CPU is busy */
    if (in->spin_n < SPIN_RECENT) return max;                 /* still learning */
    uint64_t sorted[SPIN_RECENT];
    memcpy(sorted, in->spin_recent_ns, sizeof sorted);
    qsort(sorted, SPIN_RECENT, sizeof *sorted, cmp_u64);
    uint64_t median = sorted[SPIN_RECENT / 2];
    if (median > max) { /* too slow to wait for spinning: probe now and then */
        in->spin_skip = SPIN_PROBE_EVERY - 1;
        return max;
    }
    return median * 3 / 2 < max ? median * 3 / 2 : max;
}

/* Tells the worker, before EXECUTE, whether it may spin for its next
 * request once it has answered this one: only when this is the only
 * Python execute in flight in the process, for one request (else the CPU
 * it would spin on is wanted by another instance's worker and the threads
 * that feed it). The worker adds its own checks (Worker.spin_recv).
 * Execute's thread. */
static void spin_hint_set(instance_t *in, bool alone)
{
    if (!in->spin_hint) return;
    uint64_t us = alone ? g_backend->spin_max_ns / 1000 : 0;
    in->spin_hints += us != 0;
    atomic_store_explicit(in->spin_hint, us, memory_order_relaxed); /* sendmsg orders it */
}

/* Records how an execute that spun went: its EXECUTE -> DONE time, and
 * whether the answer came while spinning or another thread wanted the CPU
 * (then, the second time in a row, no spin for SPIN_PROBE_EVERY executes:
 * a lone interruption, e.g. a timer's thread run once, is not contention,
 * and backing off for it lost a third of the spins at FP32[65536], where the reader
 * thread's lazy re-arm check, every ~2 ms, came every few requests;
 * docs/performance.md, "The server's spin, interrupted"). */
static void spin_record(instance_t *in, uint64_t took_ns, bool hit, bool contended)
{
    in->spin_recent_ns[in->spin_n++ % SPIN_RECENT] = took_ns;
    in->spin_hits += hit;
    in->spin_misses_in_row = hit ? 0 : in->spin_misses_in_row + 1;
    in->spin_contended_in_row = contended ? in->spin_contended_in_row + 1 : 0;
    if (in->spin_contended_in_row >= SPIN_CONTENDED_MAX ||
        in->spin_misses_in_row >= SPIN_MISSES_MAX) {
        in->spin_misses_in_row = 0;
        in->spin_contended_in_row = 0;
        in->spin_skip = SPIN_PROBE_EVERY;
    }
}

/* Spins until the worker has sent a message not received yet (1), until_ns
 * passed (0), or another thread wanted this CPU (-1: a sched_yield, or the
 * time between two checks, took over SPIN_CONTENDED_NS, and the worker's
 * message has not come meanwhile). */
static int spin_wait(const instance_t *in, uint64_t until_ns)
{
    const _Atomic uint64_t *w = in->spin_word;
    uint64_t last = nereid_now_ns();
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(w, memory_order_acquire) > in->msgs_in) return 1;
        cpu_relax();
        if (i % 32 == 0) {
            uint64_t now = nereid_now_ns();
            bool away = now - last > SPIN_CONTENDED_NS; /* this thread was preempted */
            if (!away && i % 64 == 0) { /* a thread that wants this CPU runs meanwhile */
                sched_yield();
                uint64_t after = nereid_now_ns();
                away = after - now > SPIN_CONTENDED_NS;
                now = after;
            }
            /* The thread that ran meanwhile may have been the worker itself
             * (woken on this CPU): then its answer is there. */
            if (away) return atomic_load_explicit(w, memory_order_acquire) > in->msgs_in ? 1 : -1;
            if (now >= until_ns) return 0;
            last = now;
        }
    }
}

/* The page for the word, sent to a new worker before INIT (a payload in a
 * memfd, as any large message: JSON {"spin_us":N} padded to 24 bytes, then
 * a 16-byte blob: the worker's word, and the hint the server writes before
 * each EXECUTE). Sealed against shrinking: the worker cannot make the
 * server's reads fault. Without it (spin-wait-us=0, or no memory) neither
 * side ever spins. */
#define SPIN_PAGE_BYTES 4096
#define SPIN_JSON_BYTES 24 /* {"spin_us":N} with N <= SPIN_WAIT_US_MAX, padded */
static void spin_page_send(instance_t *in)
{
    if (!g_backend->spin_max_ns) return;
    int fd = memfd_create("nereid-python-spin", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return;
    void *map = MAP_FAILED;
    if (ftruncate(fd, SPIN_PAGE_BYTES) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        map = mmap(NULL, SPIN_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) {
        /* JSON {"spin_us":N} padded to SPIN_JSON_BYTES: the worker spins as
         * long for its next message (the word follows, 8-byte aligned) */
        char js[SPIN_JSON_BYTES + 1];
        int n = snprintf(js, sizeof js, "{\"spin_us\":%llu}",
                         (unsigned long long)(g_backend->spin_max_ns / 1000));
        memset(js + n, ' ', SPIN_JSON_BYTES - (size_t)n);
        memcpy(map, js, SPIN_JSON_BYTES);
        uint8_t hdr[HDR_BYTES];
        hdr_pack(hdr, M_SPIN_PAGE, SPIN_JSON_BYTES, 16);
        if (send_with_fd(in->chan, hdr, fd) == 0) {
            in->spin_map = map;
            in->spin_word = (const _Atomic uint64_t *)((uint8_t *)map + SPIN_JSON_BYTES);
            in->spin_hint = (_Atomic uint64_t *)((uint8_t *)map + SPIN_JSON_BYTES + 8);
        } else {
            munmap(map, SPIN_PAGE_BYTES);
        }
    }
    close(fd);
}

static void spin_page_drop(instance_t *in)
{
    if (in->spin_map) munmap(in->spin_map, SPIN_PAGE_BYTES);
    in->spin_map = NULL;
    in->spin_word = NULL;
    in->spin_hint = NULL;
}

/* Execute's side: takes the socket from the reader thread, reads until the
 * worker's DONE (serving everything else on the way), spinning first until
 * spin_until_ns (0: not at all; *spun: whether it did, *hit: and saw a
 * message come, *contended: or stopped for another thread). NULL when the worker died or misbehaved
 * (it is then ended). */
static msg_t *execute_read_done(instance_t *in, uint64_t spin_until_ns, bool *spun, bool *hit,
                                bool *contended)
{
    char why[512] = "";
    msg_t *done = NULL;
    tls_reading = in;
    tls_exec_reading = true;
    *spun = *hit = *contended = false;
    for (;;) {
        if (spin_until_ns) { /* before each message, until a spin runs out */
            int r = spin_wait(in, spin_until_ns);
            *spun = true;
            *hit = r == 1;
            *contended = r < 0;
            if (r != 1) spin_until_ns = 0;
        }
        msg_t *m;
        int rc = msg_recv_into(in->chan->fd, &in->rx, &m, why, sizeof why, 0, in->rbuf);
        if (rc <= 0) break;
        in->msgs_in++;
        if (m->type == M_DONE) {
            done = m;
            break;
        }
        bool ok = m->type != M_READY && m->type != M_FINALIZED;
        if (!ok)
            snprintf(why, sizeof why, "an unexpected reply");
        else
            ok = dispatch(in, &m, why, sizeof why);
        msg_free(m);
        if (ok && pump_failed(in, why, sizeof why)) ok = false;
        if (ok && in->early_done) { /* a readiness check read it */
            done = in->early_done;
            in->early_done = NULL;
            break;
        }
        if (!ok) break;
        why[0] = '\0';
    }
    tls_reading = NULL;
    tls_exec_reading = false;
    exec_reading_end(in);
    if (!done) worker_died(in, why);
    return done;
}

/* Announces the reply the next message sent asks for: any other reply,
 * or one nobody waits for, is a protocol error. */
static void expect_reply(instance_t *in, uint32_t type)
{
    pthread_mutex_lock(&in->mu);
    in->expect = type;
    pthread_mutex_unlock(&in->mu);
}

/* Waits for the worker's reply of type want (or its end). timeout_s 0 =
 * no limit. NULL when the worker died or the time ran out. */
static msg_t *wait_reply(instance_t *in, uint32_t want, long timeout_s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_s;
    pthread_mutex_lock(&in->mu);
    while (!in->reply && !in->dead) {
        if (timeout_s) {
            if (pthread_cond_timedwait(&in->cv, &in->mu, &dl) == ETIMEDOUT) break;
        } else {
            pthread_cond_wait(&in->cv, &in->mu);
        }
    }
    msg_t *m = in->reply;
    in->reply = NULL;
    in->expect = 0;
    pthread_mutex_unlock(&in->mu);
    if (m && m->type != want) {
        msg_free(m);
        m = NULL;
    }
    return m;
}

/* Ends the current worker (if any) and joins its reader. */
/* A worker's end (or start): its body-region holds and mappings are gone. */
static void body_forget(instance_t *in)
{
    for (int s = 0; s < BODY_SLOTS; s++) {
        region_unref(in->body_held[s]);
        in->body_held[s] = NULL;
        in->body_mapped[s] = 0;
    }
}

static void worker_stop(instance_t *in)
{
    if (!in->reader_running) return;
    shutdown(in->chan->fd, SHUT_RDWR);
    pthread_mutex_lock(&in->mu);
    reader_arm_locked(in);    /* the hang-up wakes the reader (no execute reads now) */
    in->has_is_ready = false; /* readiness checks stop using in->chan */
    if (in->pidfd >= 0)       /* a pidfd names its process even after it was reaped */
        pidfd_send_signal(in->pidfd, SIGKILL, NULL, 0);
    else if (!in->reaped)
        kill(in->pid, SIGKILL); /* once reaped, the pid may be another's */
    pthread_mutex_unlock(&in->mu);
    pthread_join(in->reader, NULL);
    in->reader_running = false;
    close(in->epfd);
    in->epfd = -1;
    close(in->kickfd);
    in->kickfd = -1;
    spin_page_drop(in);
    body_forget(in);
    if (in->pidfd >= 0) close(in->pidfd);
    in->pidfd = -1;
    chan_unref(in->chan);
    in->chan = NULL;
    pthread_mutex_lock(&in->mu);
    msg_free(in->reply);
    in->reply = NULL;
    msg_free(in->early_done);
    in->early_done = NULL;
    free(in->pump_fail);
    in->pump_fail = NULL;
    pthread_mutex_unlock(&in->mu);
}

static nereid_error_t *worker_init(instance_t *in, const char *init_json, msg_t **ready);

/* posix_spawn's argv[0] with sock as its fd 3 and no other fd above 2.
 * Returns posix_spawn's error number. */
static int spawn_with_socket(const char *exe, char *const argv[], int sock, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sock, 3);
    posix_spawn_file_actions_addclosefrom_np(&fa, 4);
    int rc = posix_spawn(pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

/* ---- The zygote ----
 *
 * One pre-started python3 running nereid_python_stub.py as a zygote (numpy
 * and pb_utils already imported) forks the workers of models that use the
 * backend's interpreter: an instance then starts in a few milliseconds, not
 * an interpreter start and a numpy import. A FORK request is the instance
 * name with the worker's socket end (SCM_RIGHTS); the answer is the child's
 * pid (4 bytes) with a pidfd for it. The child is the zygote's, which lets
 * the kernel reap it, and dies with it (so killing the server's children
 * ends every worker, as Triton's QA expects of its stubs); the pidfd lets
 * this library kill it and see it end without the pid being reused. A zygote that ends is started
 * again on the next request; one that never forked a worker disables the
 * zygote, and workers are spawned as fresh interpreters, as they are for
 * an EXECUTION_ENV_PATH interpreter or with --backend-config=python,zygote=false. */

#define ZYGOTE_WAIT_MS 60000 /* the first answer waits for python3 and numpy to start */

/* Ends the zygote (and with it the workers it forked, which have
 * PR_SET_PDEATHSIG). Called with zy_mu held or at fini. */
static void zygote_end(backend_state_t *st)
{
    if (st->zy_fd < 0) return;
    close(st->zy_fd);
    st->zy_fd = -1;
    kill(st->zy_pid, SIGKILL); /* our child, not reaped yet: the pid is still its */
    while (waitpid(st->zy_pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

static int zygote_start(backend_state_t *st)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -1;
    /* The blank argument makes room for a child's command line
     * ("triton_python_backend_stub <instance>", set by the child). */
    char room[256];
    memset(room, ' ', sizeof room - 1);
    room[sizeof room - 1] = '\0';
    char *argv[] = {st->python, "-u", st->stub, "nereid_python_zygote", room, NULL};
    int rc = spawn_with_socket(st->python, argv, sv[1], &st->zy_pid);
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        return -1;
    }
    st->zy_fd = sv[0];
    st->zy_served = false;
    return 0;
}

/* One FORK exchange with the running zygote. 1: forked; 0: the zygote
 * answered but has no worker (it ended at once); -1: the zygote failed. */
static int zygote_ask(backend_state_t *st, const char *name, int sock, pid_t *pid, int *pidfd)
{
    fd_cmsg_t u;
    struct iovec iov = {(void *)name, strlen(name)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    attach_fd(&mh, &u, sock);
    if (sendmsg(st->zy_fd, &mh, MSG_NOSIGNAL) != (ssize_t)iov.iov_len) return -1;
    struct pollfd p = {st->zy_fd, POLLIN, 0};
    int pr;
    while ((pr = poll(&p, 1, ZYGOTE_WAIT_MS)) < 0 && errno == EINTR) {
    }
    if (pr <= 0) return -1;
    int32_t answer;
    iov = (struct iovec){&answer, sizeof answer};
    memset(&u, 0, sizeof u);
    mh = (struct msghdr){
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(st->zy_fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    int fd = -1;
    struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    if (n != sizeof answer || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (answer <= 0 || fd < 0) {
        if (fd >= 0) close(fd);
        return 0;
    }
    *pid = answer;
    *pidfd = fd;
    return 1;
}

/* Forks a worker for instance `name` around its socket end sock. 0 with
 * *pid and *pidfd; -1 when no zygote can do it (the caller spawns one). */
static int zygote_fork(backend_state_t *st, const char *name, int sock, pid_t *pid, int *pidfd)
{
    int rc = -1;
    pthread_mutex_lock(&st->zy_mu);
    for (int attempt = 0; attempt < 2 && !st->zy_off; attempt++) {
        if (st->zy_fd < 0 && zygote_start(st) != 0) {
            st->zy_off = true;
            break;
        }
        int r = zygote_ask(st, name, sock, pid, pidfd);
        if (r == 1) {
            st->zy_served = true;
            rc = 0;
            break;
        }
        if (r == 0) break;
        bool served = st->zy_served;
        zygote_end(st);
        if (!served) {
            plog('W', "python backend: the zygote process failed to start; workers are "
                      "started as fresh interpreters");
            st->zy_off = true;
        }
    }
    pthread_mutex_unlock(&st->zy_mu);
    return rc;
}

/* Starts a worker and sends it init_json (INIT). On success the worker's
 * READY message is returned (caller frees). */
static nereid_error_t *worker_start(instance_t *in, const char *init_json, msg_t **ready)
{
    *ready = NULL;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: socketpair: %s",
                                strerror(errno));
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    int kickfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epfd < 0 || kickfd < 0) {
        nereid_error_t *e =
            nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: %s: %s",
                             epfd < 0 ? "epoll_create1" : "eventfd", strerror(errno));
        if (epfd >= 0) close(epfd);
        if (kickfd >= 0) close(kickfd);
        close(sv[0]);
        close(sv[1]);
        return e;
    }
    char *python = (char *)(in->python ? in->python : g_backend->python);
    pid_t pid = -1;
    int rc = 0, pidfd = -1;
    if (in->python || zygote_fork(g_backend, in->name, sv[1], &pid, &pidfd) != 0) {
        char *argv[] = {python,   "-u", g_backend->stub, "triton_python_backend_stub",
                        in->name, NULL};
        rc = spawn_with_socket(python, argv, sv[1], &pid);
    }
    close(sv[1]);
    if (rc != 0) {
        close(sv[0]);
        close(epfd);
        close(kickfd);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "python backend: cannot start '%s' for '%s': %s", python, in->name,
                                strerror(rc));
    }
    in->pid = pid;
    in->pidfd = pidfd;
    body_forget(in);
    region_unref(in->tx);
    rx_regions_clear(&in->rx);
    in->tx = NULL;
    for (int i = 0; i < TX_SPARES; i++) {
        region_unref(in->tx_spare[i]);
        in->tx_spare[i] = NULL;
    }
    in->chan = chan_new(sv[0]);
    if (!in->chan) abort();
    in->epfd = epfd;
    in->kickfd = kickfd;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = sv[0]};
    struct epoll_event kev = {.events = EPOLLIN, .data.fd = kickfd};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sv[0], &ev) != 0 ||
        epoll_ctl(epfd, EPOLL_CTL_ADD, kickfd, &kev) != 0)
        abort(); /* only ENOMEM */
    pthread_mutex_lock(&in->mu);
    in->armed = true;
    in->eager_arm = false;
    in->dead = false;
    in->reaped = false;
    free(in->death);
    in->death = NULL;
    pthread_mutex_unlock(&in->mu);
    in->msgs_in = 0;
    spin_page_send(in);
    if (pthread_create(&in->reader, NULL, reader_main, in) != 0) abort();
    in->reader_running = true;
    return worker_init(in, init_json, ready);
}

/* Sends INIT (init_json) to the running worker and waits for READY. On
 * failure the worker is stopped. */
static nereid_error_t *worker_init(instance_t *in, const char *init_json, msg_t **ready)
{
    *ready = NULL;
    json_error_t jerr;
    expect_reply(in, M_READY);
    reader_arm(in);
    send_json(in->chan, M_INIT, json_loads(init_json, 0, &jerr));
    msg_t *m = wait_reply(in, M_READY, 0);
    if (!m) {
        nereid_error_t *e = unhealthy(in);
        worker_stop(in);
        return e;
    }
    json_t *e = json_object_get(m->json, "error");
    if (json_is_string(e)) {
        nereid_error_t *err = nereid_error_new(NEREID_ERROR_INTERNAL, "%s", json_string_value(e));
        msg_free(m);
        worker_stop(in);
        return err;
    }
    pthread_mutex_lock(&in->mu);
    in->has_is_ready = json_is_true(json_object_get(m->json, "is_ready"));
    pthread_mutex_unlock(&in->mu);
    *ready = m;
    return NULL;
}

/* ---- Model ---- */

typedef struct model_state {
    char *file;   /* <model dir>/<version>/model.py */
    char *python; /* EXECUTION_ENV_PATH's interpreter, or NULL: the backend's */
    /* The worker that ran auto_complete_config, kept for the first instance
     * (named after it) so a model starts one interpreter, not two. */
    pthread_mutex_t mu;
    instance_t *spare;
    atomic_int instances; /* initialized and not finalized */
    /* Request body regions ("Request bodies"): frontends take them, execute
     * finds its inputs in them. A slot's region is replaced only while
     * nobody but the pool holds it (refs == 1). */
    pthread_mutex_t body_mu;    /* guards what follows */
    region_t *body[BODY_SLOTS]; /* a reference each, or NULL */
    size_t body_bytes;          /* their sizes together (<= BODY_BUDGET) */
    atomic_bool body_any;       /* some region was made (else execute does not look) */
    uint64_t body_made;         /* regions made */
    uint64_t body_taken;        /* bodies received into a region */
    uint64_t body_missed;       /* bodies offered none (no free slot or room) */
} model_state_t;

static void instance_free(instance_t *in)
{
    spin_page_drop(in);
    body_forget(in);
    for (int s = 0; s < BODY_SLOTS; s++)
        region_unref(in->exec_body[s]);
    region_unref(in->exec_rx);
    region_unref(in->tx);
    rx_regions_clear(&in->rx);
    for (int i = 0; i < TX_SPARES; i++)
        region_unref(in->tx_spare[i]);
    free(in->rbuf);
    free(in->init_json);
    free(in->name);
    free(in->death);
    free(in->rq_error);
    python_api_free(in->api);
    pthread_mutex_destroy(&in->mu);
    pthread_cond_destroy(&in->cv);
    free(in);
}

static instance_t *instance_new(const char *name, nereid_model_t *model)
{
    instance_t *in = calloc(1, sizeof *in);
    if (!in) abort();
    in->name = strdup(name);
    in->model = model;
    in->server = nereid_model_server(model);
    in->decoupled = nereid_model_decoupled(model);
    in->pidfd = -1;
    in->epfd = -1;
    in->kickfd = -1;
    in->rbuf = malloc(RECV_MAX);
    if (!in->rbuf) abort();
    pthread_mutex_init(&in->mu, NULL);
    pthread_cond_init(&in->cv, NULL);
    in->api = python_api_new();
    model_state_t *ms = nereid_model_state(model);
    in->python = ms ? ms->python : NULL;
    return in;
}

/* A model's EXECUTION_ENV_PATH: an unpacked environment directory (its
 * bin/python3 runs the workers; $$TRITON_MODEL_DIRECTORY is the model's
 * directory) or a conda-pack archive, extracted first (python_env.c).
 * *python NULL: not set. */
static nereid_error_t *execution_env(nereid_model_t *model, char **python)
{
    *python = NULL;
    const char *env = nereid_model_parameter(model, "EXECUTION_ENV_PATH");
    if (!env || !*env) return NULL;
    const char *var = "$$TRITON_MODEL_DIRECTORY";
    const char *at = strstr(env, var);
    char path[PATH_MAX];
    if (at)
        snprintf(path, sizeof path, "%.*s%s%s", (int)(at - env), env, nereid_model_directory(model),
                 at + strlen(var));
    else
        snprintf(path, sizeof path, "%s", env);
    char exe[PATH_MAX + 16];
    struct stat st;
    char *extracted = NULL;
    if (stat(path, &st) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Failed to get the canonical path for %s.",
                                path);
    if (S_ISREG(st.st_mode)) {
        /* a conda-pack archive, extracted as Triton extracts it */
        nereid_error_t *err = python_env_extract(path, &extracted);
        if (err) return err;
    }
    snprintf(exe, sizeof exe, "%s/bin/python3", extracted ? extracted : path);
    free(extracted);
    if (stat(exe, &st) == 0 && access(exe, X_OK) == 0) {
        *python = strdup(exe);
        return NULL;
    }
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "EXECUTION_ENV_PATH '%s': no executable bin/python3 in the "
                            "environment (a directory, or a conda-pack .tar.gz archive)",
                            path);
}

/* The name Triton gives the first instance: <first group's name>_0. */
static char *first_instance_name(nereid_model_t *model)
{
    json_error_t jerr;
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, &jerr);
    const char *g = json_string_value(
        json_object_get(json_array_get(json_object_get(cfg, "instance_group"), 0), "name"));
    char *name = NULL;
    if (g && asprintf(&name, "%s_0", g) < 0) name = NULL;
    json_decref(cfg);
    return name;
}

static const char *kind_name(nereid_instance_kind_t k)
{
    return k == NEREID_INSTANCE_KIND_GPU     ? "GPU"
           : k == NEREID_INSTANCE_KIND_MODEL ? "MODEL"
                                             : "CPU";
}

static char *init_message(nereid_model_t *model, const char *file, const char *instance,
                          const char *kind, int device, bool auto_complete)
{
    char version[32], dev[32];
    snprintf(version, sizeof version, "%lld", (long long)nereid_model_version(model));
    snprintf(dev, sizeof dev, "%d", device);
    json_t *args = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "model_config",
                             nereid_model_config_json(model), "model_instance_kind", kind,
                             "model_instance_name", instance, "model_instance_device_id", dev,
                             "model_repository", nereid_model_directory(model), "model_version",
                             version, "model_name", nereid_model_name(model));
    json_error_t jerr;
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, &jerr);
    json_t *o = json_pack("{s:s, s:s, s:b, s:b, s:o, s:o}", "model_file", file, "instance",
                          instance, "decoupled", nereid_model_decoupled(model), "auto_complete",
                          auto_complete, "args", args, "config", cfg ? cfg : json_object());
    /* pb_utils.get_model_dir(): the version directory, also for a
     * Python-based backend whose model.py lives elsewhere */
    char *vdir = nereid_model_file_path(model, "model.py");
    char *slash = vdir ? strrchr(vdir, '/') : NULL;
    if (slash) {
        *slash = '\0';
        json_object_set_new(o, "model_dir", json_string(vdir));
    }
    free(vdir);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* A Python-based backend (Triton's layout: `backend: "<name>"` with
 * <backend-directory>/<name>/model.py, which the core loads through this
 * backend): that model.py; NULL for a `backend: "python"` model. */
static char *python_based_backend_file(nereid_model_t *model)
{
    json_t *cfg = json_loads(nereid_model_config_json(model), 0, NULL);
    const char *name = json_string_value(json_object_get(cfg, "backend"));
    const char *dir = nereid_backend_config(nereid_model_backend(model), "backend-directory");
    char *file = NULL;
    if (name && *name && strcmp(name, "python") != 0 && dir && !strchr(name, '/')) {
        size_t n = strlen(dir) + strlen(name) + sizeof "//model.py";
        file = malloc(n);
        if (!file) abort();
        snprintf(file, n, "%s/%s/model.py", dir, name);
    }
    json_decref(cfg);
    return file;
}

/* Triton's IsValidIdentifier: characters a stub name must not contain. */
static const char *const BAD_NAME_CHARS = ";|&$`<>()[]{}\\\"'*?~#!";

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    /* Triton names its auto-complete stub after the model and checks that
     * name before anything of the model is read (StubLauncher::Launch). */
    if (nereid_model_autocomplete_allowed(model) &&
        strpbrk(nereid_model_name(model), BAD_NAME_CHARS))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Invalid stub name: contains invalid characters");

    char *python = NULL;
    nereid_error_t *env_err = execution_env(model, &python);
    if (env_err) return env_err;
    char *file = python_based_backend_file(model);
    if (!file) file = nereid_model_file_path(model, "model.py");
    if (!file) return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    size_t len = strlen(file);
    if (len < 3 || strcmp(file + len - 3, ".py") != 0) {
        const char *base = strrchr(file, '/');
        nereid_error_t *e = nereid_error_new(
            NEREID_ERROR_INVALID_ARG, "Model name must end with '.py'. Model name is \"%s\".",
            base ? base + 1 : file);
        free(file);
        free(python);
        return e;
    }
    if (access(file, R_OK) != 0) {
        nereid_error_t *e = nereid_error_new(NEREID_ERROR_INTERNAL,
                                             "Failed to preinitialize Python stub: Python model "
                                             "file not found in '%s'",
                                             file);
        free(file);
        free(python);
        return e;
    }
    model_state_t *st = calloc(1, sizeof *st);
    if (!st) abort();
    st->file = file;
    st->python = python;
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_init(&st->body_mu, NULL);
    nereid_model_set_state(model, st);
    /* An execute is a message to the worker and a wait for its answer: run
     * on the request's own thread when an instance is idle, a hand-off to
     * the instance thread and back costs more than the wait. */
    nereid_model_set_inline_max_us(model, INLINE_MAX_US);
    if (!nereid_model_autocomplete_allowed(model)) return NULL;
    /* auto_complete_config runs in a worker before the config is final. */
    char *first = first_instance_name(model);
    instance_t *tmp = instance_new(first ? first : nereid_model_name(model), model);
    char *init = init_message(model, file, tmp->name, "CPU", 0, true);
    msg_t *ready;
    nereid_error_t *e = worker_start(tmp, init, &ready);
    free(init);
    if (!e) {
        json_t *cfg = json_object_get(ready->json, "config");
        if (json_is_object(cfg)) {
            char *s = json_dumps(cfg, JSON_COMPACT);
            e = nereid_model_set_config(model, s);
            free(s);
        }
        msg_free(ready);
    }
    char *now_first = e ? NULL : first_instance_name(model);
    if (!e && first && now_first && strcmp(first, now_first) == 0) {
        st->spare = tmp;
    } else {
        worker_stop(tmp);
        instance_free(tmp);
    }
    free(first);
    free(now_first);
    return e; /* on error the core calls model fini */
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    model_state_t *st = nereid_model_state(model);
    if (st) {
        if (st->spare) {
            worker_stop(st->spare);
            instance_free(st->spare);
        }
        pthread_mutex_destroy(&st->mu);
        plog('V',
             "python backend: '%s' request body regions: %llu made, %llu bodies received "
             "in them, %llu offered none",
             nereid_model_name(model), (unsigned long long)st->body_made,
             (unsigned long long)st->body_taken, (unsigned long long)st->body_missed);
        for (int i = 0; i < BODY_SLOTS; i++)
            region_unref(st->body[i]); /* one a reply still sends lives on */
        pthread_mutex_destroy(&st->body_mu);
        free(st->python);
        free(st->file);
        free(st);
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    nereid_model_t *model = nereid_instance_model(instance);
    model_state_t *ms = nereid_model_state(model);
    const char *name = nereid_instance_name(instance);
    if (strpbrk(name, BAD_NAME_CHARS))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Invalid stub name: contains invalid characters");
    pthread_mutex_lock(&ms->mu);
    instance_t *in = ms->spare && strcmp(ms->spare->name, name) == 0 ? ms->spare : NULL;
    if (in) ms->spare = NULL;
    pthread_mutex_unlock(&ms->mu);
    if (!in) in = instance_new(name, model);
    in->init_json = init_message(model, ms->file, name, kind_name(nereid_instance_kind(instance)),
                                 nereid_instance_device_id(instance), false);
    msg_t *ready;
    nereid_error_t *e = in->reader_running ? worker_init(in, in->init_json, &ready)
                                           : worker_start(in, in->init_json, &ready);
    if (e) {
        instance_free(in);
        return e;
    }
    msg_free(ready);
    in->model_instances = &ms->instances;
    atomic_fetch_add(&ms->instances, 1);
    nereid_instance_set_state(instance, in);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    instance_t *in = nereid_instance_state(instance);
    if (!in) return NULL;
    atomic_fetch_sub(in->model_instances, 1);
    if (in->reader_running) {
        /* finalize() runs in the worker; a worker that does not answer in
         * time is killed. */
        expect_reply(in, M_FINALIZED);
        reader_arm(in);
        if (send_json(in->chan, M_FINALIZE, json_object()) == 0)
            msg_free(wait_reply(in, M_FINALIZED, g_backend->finalize_wait_s));
        worker_stop(in);
    }
    pthread_mutex_lock(&in->mu);
    while (in->bls_inflight)
        pthread_cond_wait(&in->cv, &in->mu);
    pthread_mutex_unlock(&in->mu);
    plog('V',
         "python backend: '%s' spin-wait: %llu executes spun, %llu answered while spinning, "
         "%llu let the worker spin after them",
         in->name, (unsigned long long)in->spin_n, (unsigned long long)in->spin_hits,
         (unsigned long long)in->spin_hints);
    plog('V', "python backend: '%s' EXECUTE regions: %llu made, %llu switches to another", in->name,
         (unsigned long long)in->tx_made, (unsigned long long)in->tx_switches);
    plog('V', "python backend: '%s' request body regions: %llu inputs referenced", in->name,
         (unsigned long long)in->body_inputs);
    if (atomic_load(&in->bls_placed_n) + atomic_load(&in->bls_copied_n))
        plog('V',
             "python backend: '%s' BLS result outputs: %llu written in place by the called model "
             "(%llu bytes), %llu copied (%llu bytes); %llu result regions made",
             in->name, (unsigned long long)atomic_load(&in->bls_placed_n),
             (unsigned long long)atomic_load(&in->bls_placed_bytes),
             (unsigned long long)atomic_load(&in->bls_copied_n),
             (unsigned long long)atomic_load(&in->bls_copied_bytes),
             (unsigned long long)atomic_load(&in->bls_regions_made));
    instance_free(in);
    return NULL;
}

/* ---- Request bodies (backend ABI 1.10) ----
 *
 * The HTTP frontend receives an inference body for a Python model into one
 * of the model's body regions (nereid_backend_model_body_alloc), so the
 * inputs, which borrow the body, already lie in shared memory the workers
 * map: execute references them (where = BODY_WHERE + slot, offset in the
 * region) instead of copying them into the EXECUTE region, and an output
 * that is a view of such an input (an identity) comes back the same way and
 * goes to the reply as a view of the region.
 *
 * - Per model BODY_SLOTS regions, BODY_BUDGET bytes together; a body under
 *   BODY_MIN, over half the budget, for a decoupled model, or finding no
 *   free slot and no room gets none (the frontend uses its own memory,
 *   inputs are copied as before).
 * - A region is a memfd sealed F_SEAL_SHRINK | F_SEAL_GROW |
 *   F_SEAL_FUTURE_WRITE | F_SEAL_SEAL once the server mapped it writable:
 *   a worker can map it read-only only (and cannot write(), ftruncate() or
 *   mprotect() its way in), so the body the server parsed is the body the
 *   request reads (no TOCTOU through a hostile worker).
 * - Each worker gets a region's memfd once, in an M_BODY_MAP message (the
 *   slot in M_SLOT_SHIFT bits) sent just before the first EXECUTE that
 *   references it (instance_t.body_mapped: the region's id per slot,
 *   forgotten when the worker ends; a new worker gets them again).
 * - Lifetime: a region is free (taken by the next body) when the pool's
 *   reference is its only one. Others: the frontend's (the body, until the
 *   reply is sent and the connection's request state freed), the execute
 *   in flight's (instance_t.exec_body), a response output that views it
 *   (until the reply is sent), and the worker's holds: each DONE says in
 *   bits 16-23 of its kind which body slots the worker's arrays may still
 *   view (the execute's own always, earlier ones while an array of theirs
 *   lives: a model that keeps an input past execute); the server keeps a
 *   reference for each (instance_t.body_held) until a later DONE leaves
 *   the bit out or the worker ends. So a kept input never changes, as it
 *   cannot in Triton, where an input tensor lives as long as its object.
 *   (The EXECUTE region has no such rule: a model that keeps an input
 *   array from it past execute may see it overwritten by the next EXECUTE;
 *   only a response output viewing it keeps it.)
 * - The worker is untrusted: a DONE record naming a body slot this execute
 *   does not reference, or an offset and size outside the body in it, and
 *   a hold on a slot neither this execute nor an earlier hold names, end
 *   the worker. */

/* A new request body region of size bytes for slot: mapped writable here,
 * then sealed so that nobody maps it writable again. NULL when that fails. */
static region_t *body_region_new(size_t size, uint8_t slot)
{
    static _Atomic uint64_t next_id = 1;
    int fd = memfd_create("nereid-body", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    uint8_t *map = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0)
        map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)) {
        munmap(map, size);
        map = MAP_FAILED;
    }
    if (map == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    populate(map, size, MADV_POPULATE_WRITE);
    region_t *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->map = map;
    r->size = size;
    r->fd = fd;
    r->slot = slot;
    r->id = atomic_fetch_add(&next_id, 1);
    atomic_init(&r->refs, 1);
    return r;
}

/* backend.h: memory for a request body of byte_size bytes, a region of the
 * model's pool (the handle is the region, with a reference), or NULL. */
NEREID_EXPORT void *nereid_backend_model_body_alloc(nereid_model_t *model, size_t byte_size,
                                                    void **data)
{
    *data = NULL;
    model_state_t *ms = nereid_model_state(model);
    if (!ms || byte_size < BODY_MIN || byte_size > BODY_BUDGET / 2 || nereid_model_decoupled(model))
        return NULL;
    pthread_mutex_lock(&ms->body_mu);
    int best = -1, empty = -1, small = -1;
    for (int s = 0; s < BODY_SLOTS; s++) {
        region_t *r = ms->body[s];
        if (!r) {
            if (empty < 0) empty = s;
        } else if (atomic_load(&r->refs) != 1) {
            continue; /* in use */
        } else if (r->size >= byte_size) {
            if (best < 0 || r->size < ms->body[best]->size) best = s;
        } else if (small < 0 || r->size < ms->body[small]->size) {
            small = s;
        }
    }
    region_t *r = best >= 0 ? ms->body[best] : NULL;
    if (!r) {
        size_t size = BODY_REGION_MIN;
        while (size < byte_size)
            size *= 2;
        /* an empty slot, else a free region too small for this body */
        int s = empty >= 0 && ms->body_bytes + size <= BODY_BUDGET ? empty : small;
        size_t gone = s >= 0 && ms->body[s] ? ms->body[s]->size : 0;
        if (s >= 0 && ms->body_bytes - gone + size <= BODY_BUDGET &&
            (r = body_region_new(size, (uint8_t)s))) {
            region_unref(ms->body[s]);
            ms->body[s] = r;
            ms->body_bytes = ms->body_bytes - gone + size;
            ms->body_made++;
            atomic_store(&ms->body_any, true);
        }
    }
    if (r) {
        atomic_fetch_add(&r->refs, 1);
        r->used = byte_size;
        ms->body_taken++;
        *data = r->map;
    } else {
        ms->body_missed++;
    }
    pthread_mutex_unlock(&ms->body_mu);
    return r;
}

/* backend.h: the frontend is done with the body; the region is free again
 * once nothing else holds it. */
NEREID_EXPORT void nereid_backend_model_body_release(void *handle)
{
    region_unref(handle);
}

/* The body region input v lies in, referenced by this execute (its memfd
 * sent to the worker first when it has not got it), or NULL: v is copied. */
static region_t *body_ref(instance_t *in, model_state_t *ms, const tview_t *v)
{
    if (in->decoupled || !ms || !v->size || nereid_datatype_byte_size(v->datatype) == 0 ||
        !atomic_load_explicit(&ms->body_any, memory_order_relaxed))
        return NULL;
    const uint8_t *d = v->data;
    region_t *r = NULL;
    pthread_mutex_lock(&ms->body_mu);
    for (int s = 0; s < BODY_SLOTS && !r; s++) {
        region_t *b = ms->body[s];
        if (b && d >= b->map && d < b->map + b->used && v->size <= b->used - (size_t)(d - b->map))
            r = b;
    }
    pthread_mutex_unlock(&ms->body_mu);
    if (!r) return NULL;
    /* The request's body holds r: it stays in its slot while this runs.
     * Published under in->mu: a BLS call of this execute may name it. */
    if (!in->exec_body[r->slot]) {
        atomic_fetch_add(&r->refs, 1);
        pthread_mutex_lock(&in->mu);
        in->exec_body[r->slot] = r;
        pthread_mutex_unlock(&in->mu);
    } else if (in->exec_body[r->slot] != r) {
        return NULL;
    }
    if (in->body_mapped[r->slot] != r->id) {
        uint8_t hdr[HDR_BYTES];
        hdr_pack(hdr, M_BODY_MAP | (uint32_t)r->slot << M_SLOT_SHIFT, 0, 0);
        if (send_with_fd(in->chan, hdr, r->fd) == 0) in->body_mapped[r->slot] = r->id;
    }
    in->body_inputs++;
    return r;
}

/* After execute's DONE: the worker's holds become held (a bit: the slot's
 * region is referenced until a later DONE clears it), and the execute's own
 * references go. held was checked by apply_done (0 when there was none). */
static void body_settle(instance_t *in, uint32_t held)
{
    for (int s = 0; s < BODY_SLOTS; s++) {
        bool keep = held >> s & 1;
        region_t *now = in->exec_body[s];
        if (!now && !in->body_held[s]) continue;
        pthread_mutex_lock(&in->mu);
        in->exec_body[s] = NULL;
        pthread_mutex_unlock(&in->mu);
        if (keep && now && in->body_held[s] != now) {
            region_unref(in->body_held[s]);
            in->body_held[s] = now;
            now = NULL;
        } else if (!keep && in->body_held[s]) {
            region_unref(in->body_held[s]);
            in->body_held[s] = NULL;
        }
        region_unref(now);
    }
}

/* ---- Execute ---- */

static json_t *request_parameters(nereid_batch_t *batch, size_t r)
{
    json_t *o = json_object();
    for (size_t i = 0; i < nereid_batch_request_parameter_count(batch, r); i++) {
        const char *name;
        nereid_parameter_type_t type;
        const void *value;
        if (nereid_batch_request_parameter(batch, r, i, &name, &type, &value)) continue;
        json_object_set_new(o, name, python_api_parameter_json((int)type, value));
    }
    return o;
}

static void fail_all(nereid_batch_t *batch, nereid_error_t *err)
{
    for (size_t r = 0; r < nereid_batch_request_count(batch); r++)
        nereid_batch_set_request_error(
            batch, r, nereid_error_new(nereid_error_code(err), "%s", nereid_error_message(err)));
    nereid_error_free(err);
}

/* The worker's answer to a non-decoupled execute. false: it is malformed. */
/* pb_utils' set_release_flags(RESCHEDULE): request r runs again in a later
 * batch; where the core refuses (no iterative_sequence), the request fails
 * with the core's (Triton's) text. */
static void reschedule(nereid_batch_t *batch, size_t r)
{
    nereid_error_t *err = nereid_batch_request_reschedule(batch, r);
    if (err) nereid_batch_set_request_error(batch, r, err);
}

/* A DONE's text (len bytes at t) as an error of code. */
static nereid_error_t *text_error(const uint8_t *t, uint32_t len, uint32_t code)
{
    if (code > NEREID_ERROR_CANCELLED) code = NEREID_ERROR_INTERNAL;
    return nereid_error_new((nereid_error_code_t)code, "%.*s", (int)(len > INT_MAX ? INT_MAX : len),
                            (const char *)t);
}

/* Response r of a DONE (kind 0): its status, outputs and parameters. A
 * tensor that does not add up fails request r; a description that cannot
 * be read is the worker's fault (false). */
static bool apply_response(instance_t *in, nereid_batch_t *batch, size_t r, brd_t *rd, msg_t *m,
                           char *why, size_t why_cap)
{
    uint32_t status = br_u32(rd), n_out = br_u32(rd), params_len = br_u32(rd);
    uint32_t code = br_u32(rd), err_len = br_u32(rd);
    const uint8_t *err_text = br_take(rd, err_len), *params = br_take(rd, params_len);
    if (rd->bad || status > RESP_RESCHEDULE || (status != RESP_OUTPUTS && n_out)) {
        snprintf(why, why_cap, "malformed execute answer");
        return false;
    }
    if (status == RESP_ERROR) {
        nereid_batch_set_request_error(batch, r, text_error(err_text, err_len, code));
        return true;
    }
    if (status == RESP_RESCHEDULE) {
        reschedule(batch, r);
        return true;
    }
    nereid_error_t *bad = NULL;
    const uint8_t *ex = in->tx ? in->tx->map : NULL;
    size_t ex_len = in->tx ? in->tx->size : 0;
    char name[MAX_NAME + 1];
    for (uint32_t i = 0; i < n_out; i++) {
        tview_t v;
        int64_t shape[MAX_RANK];
        char w[512];
        /* where 2 + k: the BLS_RESULT region in slot k as it is now (a
         * reference: the response keeps it, bls_send_result writes no new
         * call's result into a region a response still reads). */
        uint32_t where = record_where(rd);
        if (where >= BODY_WHERE && where != UINT32_MAX) {
            /* An output in a request body region: it must be one this
             * execute references, and lie in its body. */
            region_t *br =
                where < BODY_WHERE + BODY_SLOTS ? in->exec_body[where - BODY_WHERE] : NULL;
            if (!br || !read_tensor(rd, m->blob, m->blob_len, br->map, br->used, &v, shape, name, w,
                                    sizeof w)) {
                snprintf(why, why_cap, "malformed execute answer: %s",
                         br ? w : "an output in a request body region the execute does not read");
                nereid_error_free(bad);
                return false;
            }
            if (bad) continue;
            if (v.size >= VIEW_MIN && nereid_datatype_byte_size(v.datatype) != 0) {
                atomic_fetch_add(&br->refs, 1);
                bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape,
                                                       v.rank, v.data, v.size, region_release, br);
                if (bad) region_unref(br);
                continue;
            }
            void *buf;
            bad = nereid_batch_request_output(batch, r, v.name, v.datatype, v.shape, v.rank, v.size,
                                              &buf);
            if (!bad && v.size) memcpy(buf, v.data, v.size);
            if (!bad && v.datatype == NEREID_TYPE_BYTES &&
                !bytes_ok(buf, v.size, elements(v.shape, v.rank)))
                bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                       "Python model '%s': BYTES tensor '%s' is malformed",
                                       in->name, v.name);
            continue;
        }
        region_t *res_region = NULL;
        if (where >= 2 && where < 2 + BLS_SLOTS) {
            pthread_mutex_lock(&in->chan->bls_mu);
            res_region = in->chan->bls_tx[where - 2];
            if (res_region) atomic_fetch_add(&res_region->refs, 1);
            pthread_mutex_unlock(&in->chan->bls_mu);
        }
        bool ok = res_region ? read_tensor(rd, m->blob, m->blob_len, res_region->map,
                                           res_region->size, &v, shape, name, w, sizeof w)
                             : read_tensor(rd, m->blob, m->blob_len, where == 1 ? ex : NULL, ex_len,
                                           &v, shape, name, w, sizeof w);
        if (!ok) {
            region_unref(res_region);
            if (rd->bad) {
                snprintf(why, why_cap, "malformed execute answer: %s", w);
                nereid_error_free(bad);
                return false;
            }
            if (!bad)
                bad = nereid_error_new(NEREID_ERROR_INTERNAL, "Python model '%s': %s", in->name, w);
            continue;
        }
        if (bad) {
            region_unref(res_region);
            continue;
        }
        if (res_region && nereid_datatype_byte_size(v.datatype) != 0) {
            bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape, v.rank,
                                                   v.data, v.size, region_release, res_region);
            if (bad) region_unref(res_region);
            continue;
        }
        const uint8_t *d = v.data;
        if (ex && d >= ex && d < ex + ex_len && v.size >= VIEW_MIN &&
            nereid_datatype_byte_size(v.datatype) != 0) {
            /* A view of an input (in our EXECUTE region): the response keeps
             * the region (tx_pick does not reuse it until released). */
            atomic_fetch_add(&in->tx->refs, 1);
            bad = nereid_batch_request_output_view(batch, r, v.name, v.datatype, v.shape, v.rank,
                                                   v.data, v.size, region_release, in->tx);
            if (bad) region_unref(in->tx);
            continue;
        }
        void *buf;
        bad = nereid_batch_request_output(batch, r, v.name, v.datatype, v.shape, v.rank, v.size,
                                          &buf);
        if (!bad && v.size) memcpy(buf, v.data, v.size);
        region_unref(res_region);
        if (!bad && v.datatype == NEREID_TYPE_BYTES &&
            !bytes_ok(buf, v.size, elements(v.shape, v.rank)))
            bad = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "Python model '%s': BYTES tensor '%s' changed while it "
                                   "was read",
                                   in->name, v.name);
    }
    if (!bad && params_len) {
        json_error_t jerr;
        json_t *jp = json_loadb((const char *)params, params_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(jp)) {
            json_decref(jp);
            snprintf(why, why_cap, "malformed execute answer: response parameters");
            return false;
        }
        bad = python_api_response_parameters(jp, batch, r, NULL);
        json_decref(jp);
    }
    if (bad) nereid_batch_set_request_error(batch, r, bad);
    return true;
}

/* Walks a DONE description for n requests without applying it: whether
 * every count and length fits and nothing is left over (a tensor's
 * contents are checked later, per request). */
static bool done_check(const uint8_t *meta, size_t len, size_t n, bool decoupled)
{
    brd_t rd = {meta, len, 0, false};
    uint32_t kind = br_u32(&rd) & 0xFFFF; /* above: body holds, checked by apply_done */
    bool ok = !rd.bad;
    if (ok && kind == DONE_ERROR) {
        ok = br_take(&rd, br_u32(&rd)) != NULL;
    } else if (ok && kind == DONE_DECOUPLED && decoupled) {
        uint32_t k = br_u32(&rd);
        ok = !rd.bad && k <= n;
        for (uint32_t i = 0; ok && i < k; i++)
            ok = br_u32(&rd) < n && !rd.bad;
    } else if (ok && kind == DONE_RESPONSES && !decoupled) {
        ok = br_u32(&rd) == n && !rd.bad;
        for (size_t r = 0; ok && r < n; r++) {
            uint32_t status = br_u32(&rd), n_out = br_u32(&rd), params_len = br_u32(&rd);
            br_u32(&rd); /* error code */
            br_take(&rd, br_u32(&rd));
            br_take(&rd, params_len);
            ok = !rd.bad && status <= RESP_RESCHEDULE && (status == RESP_OUTPUTS || !n_out);
            for (uint32_t i = 0; ok && i < n_out; i++) {
                uint32_t name_len = br_u32(&rd);
                br_u32(&rd); /* datatype */
                uint32_t rank = br_u32(&rd);
                br_take(&rd, 4 + 16); /* where, offset, size */
                br_take(&rd, (size_t)rank * sizeof(int64_t));
                br_take(&rd, name_len);
                ok = !rd.bad;
            }
        }
    } else {
        ok = false;
    }
    return ok && rd.pos == rd.n;
}

/* Makes in->tx a region no response output still reads (an output view
 * holds a reference until the frontend sent its reply): the current one
 * when free, else a free spare (the worker has it mapped in its slot),
 * else none (outmsg_send_region makes a new one, in the slot tx_free_slot
 * gives). The busy one becomes a spare while there is room. */
static void tx_pick(instance_t *in)
{
    if (!in->tx || atomic_load(&in->tx->refs) == 1) return;
    region_t *busy = in->tx;
    in->tx = NULL;
    in->tx_switches++;
    for (int i = 0; i < TX_SPARES && !in->tx; i++) {
        region_t *r = in->tx_spare[i];
        if (r && atomic_load(&r->refs) == 1) {
            in->tx = r;
            in->tx_spare[i] = NULL;
        }
    }
    for (int i = 0; i < TX_SPARES && busy; i++) {
        if (!in->tx_spare[i]) {
            in->tx_spare[i] = busy;
            busy = NULL;
        }
    }
    region_unref(busy);
}

/* The lowest slot no spare region uses (there is always one: TX_SPARES
 * spares, TX_SPARES + 1 slots); a new EXECUTE region takes it, replacing
 * in->tx, whose slot is then free too. */
static uint8_t tx_free_slot(const instance_t *in)
{
    unsigned used = 0;
    for (int i = 0; i < TX_SPARES; i++)
        if (in->tx_spare[i]) used |= 1u << in->tx_spare[i]->slot;
    uint8_t s = 0;
    while (used & 1u << s)
        s++;
    return s;
}

/* The name of the model's o-th output. */
static const char *model_output_name(const instance_t *in, size_t o)
{
    const char *name;
    nereid_datatype_t dt;
    const int64_t *dims;
    size_t rank;
    nereid_model_output(in->model, o, &name, &dt, &dims, &rank);
    return name;
}

/* The worker's answer to an execute (DONE). false: it is malformed.
 * *held: the body slots the worker holds (see "Request bodies"). */
static bool apply_done(instance_t *in, nereid_batch_t *batch, msg_t *m, uint32_t *held, char *why,
                       size_t why_cap)
{
    size_t n = nereid_batch_request_count(batch);
    *held = 0;
    if (!done_check(m->meta, m->meta_len, n, in->decoupled)) {
        snprintf(why, why_cap, "malformed execute answer");
        return false;
    }
    brd_t rd = {m->meta, m->meta_len, 0, false};
    uint32_t kind = br_u32(&rd);
    uint32_t holds = kind >> 16, may = 0;
    kind &= 0xFFFF;
    for (int s = 0; s < BODY_SLOTS; s++)
        if (in->exec_body[s] || in->body_held[s]) may |= 1u << s;
    if (holds & ~may) {
        snprintf(why, why_cap,
                 "malformed execute answer: a hold on a request body region it "
                 "was not given");
        return false;
    }
    if (kind == DONE_ERROR) {
        uint32_t len = br_u32(&rd);
        fail_all(batch, text_error(br_take(&rd, len), len, NEREID_ERROR_INTERNAL));
    } else if (kind == DONE_DECOUPLED) {
        /* Requests released with RESCHEDULE (before execute returned, as
         * Triton requires of decoupled models). */
        uint32_t k = br_u32(&rd);
        for (uint32_t i = 0; i < k; i++)
            reschedule(batch, br_u32(&rd));
    } else {
        br_u32(&rd); /* n, checked */
        for (size_t r = 0; r < n; r++)
            if (!apply_response(in, batch, r, &rd, m, why, why_cap)) return false;
    }
    *held = holds;
    return true;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    instance_t *in = nereid_instance_state(instance);
    size_t n = nereid_batch_request_count(batch);
    pthread_mutex_lock(&in->mu);
    bool dead = in->dead;
    pthread_mutex_unlock(&in->mu);
    if (dead || !in->reader_running) {
        /* The worker died since the last call: start a new one. */
        worker_stop(in);
        msg_t *ready;
        nereid_error_t *e = worker_start(in, in->init_json, &ready);
        if (e) return e;
        msg_free(ready);
        plog('I', "python backend: restarted the worker of '%s'", in->name);
    }
    outmsg_t om = {0};
    bwr_t w = {0};
    model_state_t *ms = nereid_model_state(in->model);
    bw_u32(&w, (uint32_t)n);
    size_t n_in = nereid_batch_input_count(batch);
    tview_t *ins = calloc(n_in ? n_in : 1, sizeof *ins);
    if (!ins) abort();
    for (size_t r = 0; r < n; r++) {
        size_t k = 0;
        for (size_t i = 0; i < n_in; i++) {
            tview_t *v = &ins[k];
            v->name = nereid_batch_input_name(batch, i);
            nereid_error_t *e = nereid_batch_request_input(batch, r, v->name, &v->datatype,
                                                           &v->shape, &v->rank, &v->data, &v->size);
            if (e) {
                nereid_error_free(e);
                continue;
            }
            k++;
        }
        uint32_t n_out = 0;
        for (size_t o = 0; o < nereid_model_output_count(in->model); o++)
            n_out += nereid_batch_request_output_requested(batch, r, model_output_name(in, o));
        const char *id = nereid_batch_request_id(batch, r);
        uint64_t corr, timeout_us;
        const char *corr_str;
        uint32_t flags;
        nereid_batch_request_sequence(batch, r, &corr, &corr_str, &flags, &timeout_us);
        char *params = NULL;
        if (nereid_batch_request_parameter_count(batch, r)) {
            json_t *jp = request_parameters(batch, r);
            params = json_dumps(jp, JSON_COMPACT);
            json_decref(jp);
        }
        int64_t sender_id = -1;
        if (in->decoupled) {
            nereid_response_sender_t *s;
            nereid_error_t *e = nereid_batch_request_sender(batch, r, &s);
            if (e) {
                nereid_batch_set_request_error(batch, r, e);
            } else {
                /* A rescheduled request comes back with the sender it had:
                 * it keeps its slot (one slot per sender). */
                pthread_mutex_lock(&in->mu);
                sender_slot_t *slot = in->senders;
                while (slot && slot->sender != s)
                    slot = slot->next;
                if (!slot) {
                    slot = calloc(1, sizeof *slot);
                    if (!slot) abort();
                    slot->id = ++in->next_sender;
                    slot->sender = s;
                    slot->next = in->senders;
                    in->senders = slot;
                }
                sender_id = (int64_t)slot->id;
                pthread_mutex_unlock(&in->mu);
            }
        }
        size_t id_len = id ? strlen(id) : 0, corr_len = corr_str ? strlen(corr_str) : 0;
        size_t params_len = params ? strlen(params) : 0;
        bw_u32(&w, (uint32_t)k);
        bw_u32(&w, n_out);
        bw_u32(&w, flags);
        bw_u32(&w, (uint32_t)id_len);
        bw_u32(&w, corr_str ? (uint32_t)corr_len : UINT32_MAX);
        bw_u32(&w, (uint32_t)params_len);
        bw_u64(&w, corr);
        bw_u64(&w, timeout_us);
        bw_u64(&w, (uint64_t)sender_id);
        bw_put(&w, id, id_len);
        bw_put(&w, corr_str, corr_len);
        bw_put(&w, params, params_len);
        free(params);
        for (size_t o = 0; o < nereid_model_output_count(in->model); o++) {
            const char *name = model_output_name(in, o);
            if (!nereid_batch_request_output_requested(batch, r, name)) continue;
            bw_u32(&w, (uint32_t)strlen(name));
            bw_put(&w, name, strlen(name));
        }
        for (size_t i = 0; i < k; i++) {
            region_t *br = body_ref(in, ms, &ins[i]);
            if (br)
                bw_tensor_where(&w, &ins[i], BODY_WHERE + br->slot,
                                (uint64_t)((const uint8_t *)ins[i].data - br->map));
            else
                bw_tensor(&w, &ins[i], outmsg_add_view(&om, &ins[i]));
        }
    }
    free(ins);
    om.raw = w.p;
    om.raw_len = w.n;
    pthread_mutex_lock(&in->mu);
    in->batch = batch;
    pthread_mutex_unlock(&in->mu);
    /* The only python execute in flight, with one request (a batch of
     * several already means requests queue). */
    bool alone = atomic_fetch_add_explicit(&g_executing, 1, memory_order_relaxed) == 0 && n == 1;
    spin_hint_set(in, alone);
    uint64_t spin_ns = spin_budget_ns(in, nereid_now_ns(), alone);
    exec_reading_begin(in);
    tx_pick(in);
    om.publish = &in->exec_rx;
    om.publish_mu = &in->mu;
    int rc = outmsg_send_region(in->chan, M_EXECUTE, &om, &in->tx, tx_free_slot(in));
    if (in->tx && in->tx->fresh) {
        in->tx->fresh = false;
        in->tx_made++;
    }
    uint64_t input_end = nereid_now_ns();
    msg_t *m = NULL;
    bool spun = false, hit = false, contended = false;
    if (rc == 0) {
        m = execute_read_done(in, spin_ns ? input_end + spin_ns : 0, &spun, &hit, &contended);
    } else {
        exec_reading_end(in);
    }
    uint64_t infer_end = nereid_now_ns();
    atomic_fetch_sub_explicit(&g_executing, 1, memory_order_relaxed);
    if (spun && m) spin_record(in, infer_end - input_end, hit, contended);
    pthread_mutex_lock(&in->mu);
    in->batch = NULL;
    region_t *ex_done = in->exec_rx;
    in->exec_rx = NULL;
    pthread_mutex_unlock(&in->mu);
    region_unref(ex_done);
    if (!m) {
        body_settle(in, 0);
        worker_stop(in);
        if (!in->decoupled) fail_all(batch, unhealthy(in));
        return NULL;
    }
    char why[512];
    uint32_t held = 0;
    bool done_ok = apply_done(in, batch, m, &held, why, sizeof why);
    body_settle(in, held);
    if (!done_ok) {
        plog('E', "python backend: worker of '%s': %s", in->name, why);
        pthread_mutex_lock(&in->mu);
        if (!in->death) in->death = strdup(why);
        pthread_mutex_unlock(&in->mu);
        fail_all(batch, unhealthy(in));
        worker_stop(in);
    }
    msg_free(m);
    nereid_batch_report_compute(batch, input_end, infer_end);
    return NULL;
}
