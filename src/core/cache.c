/*
 * This file contains the response cache (Triton's local cache, cache.h).
 *
 * Key: the model's name and version, every input (sorted by name) with its
 * name, datatype, shape and bytes, and the requested output names (sorted;
 * none = all outputs). Triton hashes only names and bytes and trusts the
 * hash; here the whole key is kept in the entry and compared, so different
 * requests never share an entry. Requested outputs are part of the key
 * because the backend computes only those: a request for other outputs must
 * not be served from that response. Classification is applied by the
 * frontend to the raw outputs, so it is not part of the key.
 *
 * Cost: an entry counts against the size budget as Triton packs the
 * response (per output: name, datatype, shape, byte size and bytes, with
 * their length fields) plus the key bytes kept for the comparison. An entry
 * larger than the budget is not inserted (Triton's error is logged);
 * otherwise least recently used entries are evicted until it fits.
 *
 * Threads: one mutex guards the table, the LRU list and the counters.
 * Entries are reference counted so a hit copies its outputs outside the
 * lock while eviction may unlink the entry.
 */
#include "core/cache.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/server_internal.h"
#include "core/util.h"

#define CACHE_DIRECTORY "/opt/tritonserver/caches" /* Triton's default, for its error text */

typedef struct cache_output {
    const char *name;
    nereid_datatype_t datatype;
    int64_t shape[NEREID_MAX_RANK];
    size_t rank;
    const unsigned char *data;
    size_t byte_size;
} cache_output_t;

typedef struct cache_entry {
    struct cache_entry *chain;       /* hash bucket */
    struct cache_entry *prev, *next; /* LRU list, head = most recently used */
    uint64_t hash;
    uint64_t cost;
    _Atomic int refs; /* the table's (while linked) and each hit's in progress */
    const unsigned char *key;
    size_t key_len;
    size_t n_outputs;
    cache_output_t outputs[]; /* then the key, names and data in the same block */
} cache_entry_t;

struct response_cache {
    pthread_mutex_t lock;
    uint64_t size, used;
    cache_entry_t **buckets;
    size_t n_buckets, n_entries;
    cache_entry_t *lru_head, *lru_tail;
    uint64_t seed;
    uint64_t lookups, hits, misses, evictions; /* under the lock */
    _Atomic uint64_t lookup_ns, insert_ns;
};

/* A miss waiting for its response: wraps the request's callback. */
typedef struct cache_pending {
    response_cache_t *cache;
    model_t *model;
    nereid_complete_fn done;
    void *userp;
    uint64_t hash;
    uint64_t lookup_ns;
    size_t key_len;
    unsigned char key[];
} cache_pending_t;

/* ---- Creation ---- */

/* std::stoull as Triton's local cache applies it to the size string:
 * leading space, an optional sign (a minus wraps), then decimal digits. */
static bool parse_stoull(const char *s, uint64_t *out)
{
    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = neg ? (uint64_t)0 - v : v;
    return true;
}

nereid_error_t *cache_create(const char *name, const char *config_json, response_cache_t **out)
{
    *out = NULL;
    if (strcmp(name, "local") != 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to find 'libtritoncache_%s.so' for cache. Searched: %s",
                                name, CACHE_DIRECTORY);
    LOG_INFO("Initializing LocalCache with config: %s", config_json);
    json_t *doc = json_loads(config_json, JSON_DECODE_ANY, NULL);
    json_t *size_json = json_is_object(doc) ? json_object_get(doc, "size") : NULL;
    uint64_t size = 0;
    nereid_error_t *err = NULL;
    if (!size_json) {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Failed to initialize LocalCache: config didn't contain a valid "
                               "'size' field.");
    } else if (json_is_string(size_json)) {
        if (!parse_stoull(json_string_value(size_json), &size))
            err =
                nereid_error_new(NEREID_ERROR_INTERNAL, "Failed to initialize LocalCache: stoull");
    } else if (json_is_integer(size_json) && json_integer_value(size_json) >= 0 &&
               json_integer_value(size_json) <= UINT32_MAX) {
        size = (uint64_t)json_integer_value(size_json);
    } else {
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Failed to initialize LocalCache: 'size' config must be a string "
                               "or uint type");
    }
    json_decref(doc);
    if (err) return err;
    response_cache_t *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->size = size;
    c->n_buckets = 64;
    c->buckets = xcalloc(c->n_buckets, sizeof *c->buckets);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->seed = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)c;
    LOG_INFO("Response Cache is created at '%p' with size %" PRIu64, (void *)c, size);
    *out = c;
    return NULL;
}

static void entry_unref(cache_entry_t *e)
{
    if (atomic_fetch_sub(&e->refs, 1) == 1) free(e);
}

void cache_destroy(response_cache_t *c)
{
    if (!c) return;
    for (cache_entry_t *e = c->lru_head, *next; e; e = next) {
        next = e->next;
        entry_unref(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

bool cache_enabled(const model_t *m)
{
    return m->server && m->server->cache && m->config->response_cache &&
           m->config->response_cache->enable;
}

/* ---- Keys ---- */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Folds n bytes into h (no final mix: mix64 ends a hash). */
static inline __attribute__((always_inline)) uint64_t hash_fold(uint64_t h, const unsigned char *p,
                                                                size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h ^= w * 0x87c37b91114253d5ULL;
        h = ((h << 31) | (h >> 33)) * 0x4cf5ad432745937fULL;
    }
    if (n) {
        uint64_t tail = 0;
        memcpy(&tail, p, n);
        h ^= (tail ^ ((uint64_t)n << 59)) * 0x87c37b91114253d5ULL;
        h = ((h << 31) | (h >> 33)) * 0x4cf5ad432745937fULL;
    }
    return h;
}

/* A request's key, read in its canonical order (inputs and requested
 * outputs sorted by name) to measure, write, hash or compare it without
 * building it first: a hit never copies its inputs. */
typedef enum key_mode { KEY_MEASURE, KEY_WRITE, KEY_HASH, KEY_COMPARE } key_mode_t;

typedef struct key_walk {
    key_mode_t mode;
    unsigned char *out;       /* KEY_WRITE */
    const unsigned char *cmp; /* KEY_COMPARE: the stored key, cmp_len bytes */
    size_t cmp_len;
    size_t n; /* bytes so far */
    uint64_t hash;
    bool differs; /* KEY_COMPARE */
} key_walk_t;

static inline __attribute__((always_inline)) void put(key_walk_t *w, const void *src, size_t n)
{
    switch (w->mode) {
    case KEY_MEASURE:
        break;
    case KEY_WRITE:
        if (n) memcpy(w->out + w->n, src, n);
        break;
    case KEY_HASH:
        w->hash = hash_fold(w->hash, src, n);
        break;
    case KEY_COMPARE:
        if (!w->differs && (w->cmp_len - w->n < n || memcmp(w->cmp + w->n, src, n) != 0))
            w->differs = true;
        if (w->differs) return;
        break;
    }
    w->n += n;
}

static inline __attribute__((always_inline)) void put_u64(key_walk_t *w, uint64_t v)
{
    put(w, &v, sizeof v);
}

static inline __attribute__((always_inline)) void put_str(key_walk_t *w, const char *s)
{
    size_t n = strlen(s);
    put_u64(w, n);
    put(w, s, n);
}

/* req's inputs and requested output names in the key's order. */
typedef struct key_order {
    const req_input_t *in_small[8], **in;
    const char *out_small[8], **out;
} key_order_t;

static void order_init(key_order_t *k, const nereid_request_t *req)
{
    k->in = req->n_inputs <= 8 ? k->in_small : xmalloc(req->n_inputs * sizeof *k->in);
    k->out = req->n_out_names <= 8 ? k->out_small : xmalloc(req->n_out_names * sizeof *k->out);
    /* Insertion sorts: a request has a few inputs and outputs. */
    for (size_t i = 0; i < req->n_inputs; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(k->in[j - 1]->name, req->inputs[i].name) > 0; j--)
            k->in[j] = k->in[j - 1];
        k->in[j] = &req->inputs[i];
    }
    for (size_t i = 0; i < req->n_out_names; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(k->out[j - 1], req->out_names[i]) > 0; j--)
            k->out[j] = k->out[j - 1];
        k->out[j] = req->out_names[i];
    }
}

static void order_free(key_order_t *k)
{
    if (k->in != k->in_small) free(k->in);
    if (k->out != k->out_small) free(k->out);
}

static inline __attribute__((always_inline)) void
walk_key(key_walk_t *w, const nereid_request_t *req, const key_order_t *k)
{
    const model_t *m = req->model;
    put_str(w, m->name);
    put_u64(w, (uint64_t)m->version);
    put_u64(w, req->n_inputs);
    for (size_t i = 0; i < req->n_inputs; i++) {
        const req_input_t *in = k->in[i];
        put_str(w, in->name);
        put_u64(w, (uint64_t)in->datatype);
        put_u64(w, in->rank);
        put(w, in->shape, in->rank * sizeof *in->shape);
        put_u64(w, in->byte_size);
        put(w, in->data, in->byte_size);
    }
    put_u64(w, req->n_out_names);
    for (size_t i = 0; i < req->n_out_names; i++)
        put_str(w, k->out[i]);
}

/* A pending miss record holding req's key. */
static cache_pending_t *pending_new(response_cache_t *c, const nereid_request_t *req,
                                    const key_order_t *k, uint64_t hash)
{
    key_walk_t w = {.mode = KEY_MEASURE};
    walk_key(&w, req, k);
    cache_pending_t *p = xmalloc(sizeof *p + w.n);
    p->cache = c;
    p->key_len = w.n;
    p->hash = hash;
    w = (key_walk_t){.mode = KEY_WRITE, .out = p->key};
    walk_key(&w, req, k);
    return p;
}

/* ---- Table ---- */

static cache_entry_t **bucket(response_cache_t *c, uint64_t hash)
{
    return &c->buckets[hash & (c->n_buckets - 1)];
}

static cache_entry_t *find_locked(response_cache_t *c, uint64_t hash, const unsigned char *key,
                                  size_t key_len)
{
    for (cache_entry_t *e = *bucket(c, hash); e; e = e->chain)
        if (e->hash == hash && e->key_len == key_len && memcmp(e->key, key, key_len) == 0) return e;
    return NULL;
}

/* find_locked for the key of req, compared without building it. */
static cache_entry_t *find_request_locked(response_cache_t *c, uint64_t hash,
                                          const nereid_request_t *req, const key_order_t *k)
{
    for (cache_entry_t *e = *bucket(c, hash); e; e = e->chain) {
        if (e->hash != hash) continue;
        key_walk_t w = {.mode = KEY_COMPARE, .cmp = e->key, .cmp_len = e->key_len};
        walk_key(&w, req, k);
        if (!w.differs && w.n == e->key_len) return e;
    }
    return NULL;
}

static void lru_unlink(response_cache_t *c, cache_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->lru_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(response_cache_t *c, cache_entry_t *e)
{
    e->prev = NULL;
    e->next = c->lru_head;
    if (c->lru_head) c->lru_head->prev = e;
    c->lru_head = e;
    if (!c->lru_tail) c->lru_tail = e;
}

static void grow_locked(response_cache_t *c)
{
    size_t n = c->n_buckets * 2;
    cache_entry_t **b = xcalloc(n, sizeof *b);
    for (size_t i = 0; i < c->n_buckets; i++)
        for (cache_entry_t *e = c->buckets[i], *next; e; e = next) {
            next = e->chain;
            e->chain = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

/* Unlinks the least recently used entry. */
static void evict_locked(response_cache_t *c)
{
    cache_entry_t *e = c->lru_tail;
    for (cache_entry_t **pp = bucket(c, e->hash); *pp; pp = &(*pp)->chain)
        if (*pp == e) {
            *pp = e->chain;
            break;
        }
    lru_unlink(c, e);
    c->used -= e->cost;
    c->n_entries--;
    c->evictions++;
    LOG_VERBOSE("Evicting key [%" PRIu64 "] from cache.", e->hash);
    entry_unref(e);
}

/* Triton's packed size of one output: name, datatype, shape, byte size and
 * data, each variable part with its length field. */
static uint64_t packed_output_size(const char *name, nereid_datatype_t dt, size_t rank,
                                   size_t byte_size)
{
    return 4 + strlen(name) + 4 + strlen(nereid_datatype_name(dt)) + 4 + rank * 8 + 8 + byte_size;
}

typedef enum insert_result { INSERTED, EXISTS, TOO_LARGE } insert_result_t;

/* One output of a response, read through the public accessors. */
typedef struct resp_view {
    const char *name;
    nereid_datatype_t datatype;
    const int64_t *shape;
    size_t rank;
    const void *data;
    size_t byte_size;
} resp_view_t;

static resp_view_t view_output(const nereid_response_t *resp, size_t i)
{
    resp_view_t v;
    nereid_response_output(resp, i, &v.name, &v.datatype, &v.shape, &v.rank, &v.data, &v.byte_size,
                           NULL);
    return v;
}

/* Inserts resp's outputs under p's key. */
static insert_result_t insert(response_cache_t *c, const cache_pending_t *p,
                              const nereid_response_t *resp, uint64_t *cost_out)
{
    size_t n_outputs = nereid_response_output_count(resp);
    uint64_t cost = 4 + p->key_len; /* Triton's output count field, and the key */
    size_t block = sizeof(cache_entry_t) + n_outputs * sizeof(cache_output_t) + p->key_len;
    for (size_t i = 0; i < n_outputs; i++) {
        resp_view_t v = view_output(resp, i);
        cost += 8 + packed_output_size(v.name, v.datatype, v.rank, v.byte_size);
        block += strlen(v.name) + 1 + v.byte_size;
    }
    *cost_out = cost;
    pthread_mutex_lock(&c->lock);
    bool exists = find_locked(c, p->hash, p->key, p->key_len) != NULL;
    pthread_mutex_unlock(&c->lock);
    if (exists) return EXISTS;
    if (cost > c->size) return TOO_LARGE;
    /* Copy outside the lock; a concurrent insert of the same key is checked
     * again below. */
    cache_entry_t *e = xmalloc(block);
    memset(e, 0, sizeof *e);
    e->hash = p->hash;
    e->cost = cost;
    atomic_init(&e->refs, 1);
    e->n_outputs = n_outputs;
    unsigned char *q = (unsigned char *)&e->outputs[n_outputs];
    memcpy(q, p->key, p->key_len);
    e->key = q;
    e->key_len = p->key_len;
    q += p->key_len;
    for (size_t i = 0; i < n_outputs; i++) {
        resp_view_t v = view_output(resp, i);
        cache_output_t *co = &e->outputs[i];
        size_t n = strlen(v.name) + 1;
        memcpy(q, v.name, n);
        co->name = (const char *)q;
        q += n;
        co->datatype = v.datatype;
        co->rank = v.rank < NEREID_MAX_RANK ? v.rank : NEREID_MAX_RANK;
        memcpy(co->shape, v.shape, co->rank * sizeof *v.shape);
        co->byte_size = v.byte_size;
        if (v.byte_size) memcpy(q, v.data, v.byte_size);
        co->data = q;
        q += v.byte_size;
    }
    pthread_mutex_lock(&c->lock);
    if (find_locked(c, p->hash, p->key, p->key_len)) {
        pthread_mutex_unlock(&c->lock);
        free(e);
        return EXISTS;
    }
    while (c->used + cost > c->size && c->lru_tail)
        evict_locked(c);
    if (c->n_entries >= c->n_buckets) grow_locked(c);
    cache_entry_t **b = bucket(c, e->hash);
    e->chain = *b;
    *b = e;
    lru_push_front(c, e);
    c->used += cost;
    c->n_entries++;
    pthread_mutex_unlock(&c->lock);
    return INSERTED;
}

/* ---- Requests ---- */

/* Fills output slot o of req's response from the cached output. */
static nereid_error_t *fill_output(nereid_request_t *req, resp_output_t *o,
                                   const cache_output_t *co)
{
    nereid_error_t *err =
        request_alloc_output(req, o, co->datatype, co->shape, co->rank, co->byte_size);
    if (err) return err;
    if (co->byte_size) memcpy(o->data, co->data, co->byte_size);
    request_output_set_filled(o);
    return NULL;
}

/* Whether an output of resp lies in memory another process can write (a
 * foreign allocator's, server.h): the response is then not stored. */
static bool foreign_outputs(const nereid_response_t *resp)
{
    for (size_t i = 0; i < resp->n_outputs; i++)
        if (resp->outputs[i].foreign) return true;
    return false;
}

/* A miss in model m's statistics: Triton adds the miss's time (lookup, and
 * insertion when there was one) to the request's duration. */
static void count_miss(model_t *m, uint64_t ns)
{
    stats_add(&m->stats.cache_miss, ns);
    atomic_fetch_add(&m->stats.success.ns, ns);
}

static void on_miss_done(nereid_response_t *resp, void *userp)
{
    cache_pending_t *p = userp;
    response_cache_t *c = p->cache;
    if (!nereid_response_error(resp) && foreign_outputs(resp)) {
        count_miss(p->model, p->lookup_ns); /* nothing inserted */
    } else if (!nereid_response_error(resp)) {
        uint64_t t0 = util_now_ns(), cost;
        insert_result_t r = insert(c, p, resp, &cost);
        uint64_t insert_ns = util_now_ns() - t0;
        atomic_fetch_add(&c->insert_ns, insert_ns);
        /* Triton counts a miss unless another request inserted the key
         * first (the response holds the model's reference). */
        if (r != EXISTS) count_miss(p->model, p->lookup_ns + insert_ns);
        if (r == TOO_LARGE)
            LOG_ERROR("Failed to insert key [%" PRIu64 "] into response cache: Requested "
                      "byte_size: %" PRIu64 " is greater than total cache size: %" PRIu64,
                      p->hash, cost, c->size);
    }
    nereid_complete_fn done = p->done;
    void *done_userp = p->userp;
    free(p);
    done(resp, done_userp);
}

bool cache_lookup(nereid_request_t *req)
{
    model_t *m = req->model;
    if (!cache_enabled(m)) return false;
    response_cache_t *c = m->server->cache;
    key_order_t k;
    order_init(&k, req);
    key_walk_t w = {.mode = KEY_HASH, .hash = c->seed};
    walk_key(&w, req, &k);
    uint64_t hash = mix64(w.hash);
    /* Triton's lookup time starts after the key is computed. */
    uint64_t t0 = util_now_ns();
    pthread_mutex_lock(&c->lock);
    c->lookups++;
    cache_entry_t *e = find_request_locked(c, hash, req, &k);
    if (e) {
        c->hits++;
        lru_unlink(c, e);
        lru_push_front(c, e);
        atomic_fetch_add(&e->refs, 1);
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->lock);
    if (!e && (req->foreign & NEREID_FOREIGN_INPUTS)) {
        /* Not stored (server.h, nereid_request_set_foreign_memory): a miss
         * with its lookup time, as a miss whose insertion another made. */
        order_free(&k);
        uint64_t ns = util_now_ns() - t0;
        atomic_fetch_add(&c->lookup_ns, ns);
        count_miss(m, ns);
        return false;
    }
    if (!e) {
        cache_pending_t *p = pending_new(c, req, &k, hash);
        order_free(&k);
        p->lookup_ns = util_now_ns() - t0;
        atomic_fetch_add(&c->lookup_ns, p->lookup_ns);
        p->model = m;
        p->done = req->done_fn;
        p->userp = req->done_userp;
        req->done_fn = on_miss_done;
        req->done_userp = p;
        return false;
    }
    order_free(&k);
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < request_output_count(req) && !err; i++) {
        resp_output_t *o = request_output_at(req, i);
        for (size_t j = 0; j < e->n_outputs; j++)
            if (strcmp(e->outputs[j].name, o->name) == 0) {
                err = fill_output(req, o, &e->outputs[j]);
                break;
            }
    }
    entry_unref(e);
    /* The hit's duration includes copying the outputs (as Triton's). */
    uint64_t hit_ns = util_now_ns() - t0;
    atomic_fetch_add(&c->lookup_ns, hit_ns);
    if (err)
        request_set_error(req, err); /* the caller's request_finish fails the request */
    else
        stats_add(&m->stats.cache_hit, hit_ns);
    /* Triton's hit: queue time ends where the lookup starts; no compute. */
    req->t_compute_start_ns = t0;
    return true;
}

void cache_forget(nereid_request_t *req)
{
    if (req->done_fn != on_miss_done) return;
    cache_pending_t *p = req->done_userp;
    req->done_fn = p->done;
    req->done_userp = p->userp;
    free(p);
}

/* ---- Metrics ---- */

void cache_read_counters(response_cache_t *c, cache_counters_t *out)
{
    pthread_mutex_lock(&c->lock);
    *out = (cache_counters_t){.entries = c->n_entries,
                              .used_bytes = c->used,
                              .size = c->size,
                              .lookups = c->lookups,
                              .hits = c->hits,
                              .misses = c->misses,
                              .evictions = c->evictions};
    pthread_mutex_unlock(&c->lock);
}

void cache_metrics_text(FILE *out, response_cache_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    double util = c->size ? (double)c->used / (double)c->size : 0;
    uint64_t v[] = {c->n_entries,
                    c->hits,
                    c->misses,
                    c->lookups,
                    c->evictions,
                    atomic_load(&c->lookup_ns) / 1000,
                    atomic_load(&c->insert_ns) / 1000};
    pthread_mutex_unlock(&c->lock);
    static const char *const families[][2] = {
        {"nv_cache_num_entries", "Number of responses stored in response cache"},
        {"nv_cache_num_hits", "Number of cache hits in response cache"},
        {"nv_cache_num_misses", "Number of cache misses in response cache"},
        {"nv_cache_num_lookups", "Number of cache lookups in response cache"},
        {"nv_cache_num_evictions", "Number of cache evictions in response cache"},
        {"nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds"},
        {"nv_cache_insertion_duration", "Total cache insertion duration, in microseconds"},
    };
    fprintf(out,
            "# HELP nv_cache_util Cache utilization [0.0 - 1.0]\n# TYPE nv_cache_util gauge\n"
            "nv_cache_util %g\n",
            util);
    for (size_t i = 0; i < ARRAY_LEN(families); i++)
        fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %" PRIu64 "\n", families[i][0],
                families[i][1], families[i][0], families[i][0], v[i]);
}
