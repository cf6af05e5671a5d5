/*
 * This file contains the python backend's side of the wire format
 * (python_wire.h, which both sides agree on): regions and the socket
 * channel, building and sending messages (inline in the datagram, in a
 * memfd of their own, or in a persistent region named by slot), receiving
 * one, and the checks of what a worker sends — header and sizes, memfd
 * seals, JSON, tensor descriptions, and the binary DONE and BLS_CALL
 * descriptions (done_check, bls_check) walked whole before anything of
 * them is used. Nothing here knows an instance or a model: the protocol's
 * unit test (tests/unit/backends/test_python_protocol.c) builds this file
 * alone. The worker is untrusted: every datagram is size-checked, a memfd
 * must be sealed against shrinking before it is mapped, and every name,
 * datatype, shape, offset and size is checked before a byte is copied.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "python_wire.h"

void region_unref(region_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    munmap(r->map, r->size);
    if (r->fd >= 0) close(r->fd);
    free(r);
}

void region_release(void *userp)
{
    region_unref(userp);
}

void rx_regions_clear(rx_regions_t *rx)
{
    region_unref(rx->done);
    rx->done = NULL;
    for (int i = 0; i < BLS_SLOTS; i++) {
        region_unref(rx->bls[i]);
        rx->bls[i] = NULL;
    }
}

void msg_free(msg_t *m)
{
    if (!m) return;
    json_decref(m->json);
    free(m->meta);
    if (m->map) munmap(m->map, m->map_len);
    region_unref(m->region);
    free(m->buf);
    free(m);
}

void msg_own_blob(msg_t *m)
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

chan_t *chan_new(int fd)
{
    chan_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    pthread_mutex_init(&c->send_mu, NULL);
    pthread_mutex_init(&c->bls_mu, NULL);
    atomic_init(&c->refs, 1);
    return c;
}

void chan_unref(chan_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    close(c->fd);
    for (int i = 0; i < BLS_SLOTS; i++)
        region_unref(c->bls_tx[i]);
    pthread_mutex_destroy(&c->send_mu);
    pthread_mutex_destroy(&c->bls_mu);
    free(c);
}

size_t outmsg_add_view(outmsg_t *m, const tview_t *v)
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

int outmsg_send(chan_t *c, uint32_t type, outmsg_t *m)
{
    return outmsg_send_region(c, type, m, NULL, 0);
}

void outmsg_copy(const outmsg_t *m, uint8_t *dst, const char *js, size_t jlen)
{
    memcpy(dst, js, jlen);
    size_t off = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->t[i].size) memcpy(dst + jlen + off, m->t[i].data, m->t[i].size);
        off = (off + m->t[i].size + ALIGN - 1) / ALIGN * ALIGN;
    }
}

void attach_fd(struct msghdr *mh, fd_cmsg_t *u, int fd)
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

int send_bytes_with_fd(chan_t *c, const uint8_t *d, size_t len, int fd)
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

int send_with_fd(chan_t *c, const uint8_t *hdr, int fd)
{
    return send_bytes_with_fd(c, hdr, HDR_BYTES, fd);
}

/* A fresh memfd mapping's pages are faulted in with one call instead of
 * one fault each as they are touched (each fault costs tens of µs on a
 * paravirtualized machine): what a message is about to write or read, at
 * most POPULATE_MAX (a worker's memfd may be sparse and far larger). */
#define POPULATE_MAX (64u << 20)
void populate(void *map, size_t len, int advice)
{
    (void)madvise(map, len < POPULATE_MAX ? len : POPULATE_MAX, advice); /* best effort */
}

region_t *region_new(size_t size, uint8_t slot)
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

int outmsg_send_region(chan_t *c, uint32_t type, outmsg_t *m, region_t **tx, uint8_t new_slot)
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

int send_json(chan_t *c, uint32_t type, json_t *obj)
{
    outmsg_t m = {.obj = obj};
    return outmsg_send(c, type, &m);
}

int msg_recv(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap)
{
    return msg_recv_flags(fd, rx, out, why, why_cap, 0);
}

int msg_recv_flags(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap, int flags)
{
    return msg_recv_into(fd, rx, out, why, why_cap, flags, NULL);
}

/* Where a message's payload is: the region it names (a region message
 * without a descriptor), the memfd it carries (mapped; a region message's
 * memfd becomes the worker's new region), or the datagram after the
 * header. NULL (why set) when the message does not fit its header. */
static const uint8_t *msg_payload(msg_t *m, rx_regions_t *rx, const uint8_t *buf, ssize_t n,
                                  const int *fds, int n_fds, uint32_t jlen, uint64_t blen,
                                  char *why, size_t why_cap)
{
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
            return NULL;
        }
    }
    if (in_region && n_fds == 0) {
        if (!*slot || (*slot)->size < (uint64_t)jlen + blen) {
            snprintf(why, why_cap, "message outside the shared-memory region");
            return NULL;
        }
        m->region = *slot;
        atomic_fetch_add(&m->region->refs, 1);
        return m->region->map;
    } else if (n_fds == 1) {
        struct stat st;
        int seals = fcntl(fds[0], F_GET_SEALS);
        if (n != HDR_BYTES || fstat(fds[0], &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) ||
            (uint64_t)st.st_size < jlen + blen || st.st_size == 0 ||
            (slot && slot != &rx->done && (uint64_t)st.st_size > BLS_REGION_MAX)) {
            snprintf(why, why_cap,
                     "bad shared-memory region (it must be a memfd sealed "
                     "against shrinking, holding the message)");
            return NULL;
        }
        m->map_len = (size_t)st.st_size;
        void *map = mmap(NULL, m->map_len, PROT_READ, MAP_SHARED, fds[0], 0);
        if (map == MAP_FAILED) {
            snprintf(why, why_cap, "cannot map the message region: %s", strerror(errno));
            return NULL;
        }
        m->map = map;
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
        return map;
    } else {
        if ((uint64_t)n != HDR_BYTES + (uint64_t)jlen + blen) {
            snprintf(why, why_cap, "message length does not match its header");
            return NULL;
        }
        return buf + HDR_BYTES;
    }
}

/* The message's metadata and blob: binary metadata (DONE, BLS_CALL) copied,
 * any other parsed as a JSON object. False (why set) when it is not one. */
static bool msg_decode(msg_t *m, const uint8_t *payload, uint32_t jlen, uint64_t blen, char *why,
                       size_t why_cap)
{
    if (m->type == M_DONE || m->type == M_BLS_CALL) {
        /* Binary (apply_done, bls_start): copied, so that the worker cannot
         * change it while it is checked and used. */
        m->meta = malloc(jlen ? jlen : 1);
        if (!m->meta) abort();
        memcpy(m->meta, payload, jlen);
        m->meta_len = jlen;
        m->blob = payload + jlen;
        m->blob_len = (size_t)blen;
        return true;
    }
    json_error_t jerr;
    m->json = json_loadb((const char *)payload, jlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!m->json || !json_is_object(m->json)) {
        snprintf(why, why_cap, "invalid JSON in message: %s",
                 m->json ? "not an object" : jerr.text);
        return false;
    }
    m->blob = payload + jlen;
    m->blob_len = (size_t)blen;
    return true;
}

int msg_recv_into(int fd, rx_regions_t *rx, msg_t **out, char *why, size_t why_cap, int flags,
                  uint8_t *scratch)
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
    /* A failed recvmsg leaves the control buffer as it was (stack bytes,
     * possibly an earlier message's SCM_RIGHTS): no fd is read from it,
     * or fail would close a number another part of the server now owns. */
    for (struct cmsghdr *cm = n < 0 ? NULL : CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
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
    const uint8_t *payload = msg_payload(m, rx, buf, n, fds, n_fds, jlen, blen, why, why_cap);
    if (!payload || !msg_decode(m, payload, jlen, blen, why, why_cap)) goto fail;
    *out = m;
    rc = 1;
    m = NULL;
fail:
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    msg_free(m);
    return rc;
}

bool bytes_ok(const uint8_t *p, size_t size, uint64_t elems)
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

uint64_t elements(const int64_t *shape, size_t rank)
{
    uint64_t n = 1;
    for (size_t i = 0; i < rank; i++)
        n *= (uint64_t)shape[i];
    return n;
}

static bool check_tensor(const char *name, nereid_datatype_t t, int64_t *shape, size_t rank,
                         const int64_t *dims, int64_t off, int64_t size, const uint8_t *blob,
                         size_t blob_len, tview_t *v, char *why, size_t why_cap);

bool parse_tensor(json_t *d, const uint8_t *blob, size_t blob_len, tview_t *v, int64_t *shape,
                  char *why, size_t why_cap)
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

size_t bls_bytes_total(const bls_req_t *q, const msg_t *m)
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

void bls_result_head(bwr_t *w, uint64_t id, uint32_t status, bool final, uint32_t code,
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

#define X(e, name, size, cfg) +1
static const uint32_t N_DATATYPES = 0 NEREID_DATATYPE_MAP(X);
#undef X

void bw_tensor_where(bwr_t *w, const tview_t *v, uint32_t where, uint64_t offset)
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

void bw_tensor(bwr_t *w, const tview_t *v, uint64_t offset)
{
    bw_tensor_where(w, v, 0, offset);
}

bool read_tensor(brd_t *r, const uint8_t *blob, size_t blob_len, const uint8_t *ex, size_t ex_len,
                 tview_t *v, int64_t *shape, char *name, char *why, size_t why_cap)
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

bool bls_check(const uint8_t *meta, size_t len, bls_req_t *q)
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

bool done_check(const uint8_t *meta, size_t len, size_t n, bool decoupled)
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
