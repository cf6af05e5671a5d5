/*
 * This file contains the onnxruntime backend's sessions: session options
 * from a model's config and parameters, and sessions shared by models whose
 * model file and options are identical.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gnutls/crypto.h>

#include "nereid/common.h"
#include "onnxruntime.h"

/* ---- model: session options from the config ----------------------------- */

static bool alone_in_dir(const char *path);

/* Triton's ParseIntValue. */
nereid_error_t *parse_int(const char *value, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (end == value || errno || v < INT_MIN || v > INT_MAX)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to convert '%s' to integral number", value);
    *out = (int)v;
    return NULL;
}

/* Triton's ParseBoolValue. */
nereid_error_t *parse_bool(const char *value, bool *out)
{
    if (!strcasecmp(value, "true") || !strcasecmp(value, "on") || !strcmp(value, "1")) {
        *out = true;
        return NULL;
    }
    if (!strcasecmp(value, "false") || !strcasecmp(value, "off") || !strcmp(value, "0")) {
        *out = false;
        return NULL;
    }
    return nereid_error_new(NEREID_ERROR_INVALID_ARG, "failed to convert '%s' to boolean value",
                            value);
}

/* config.optimization.graph.level, 0 when absent; *set: whether the config
 * has optimization.graph at all. */
static int graph_level(ort_model_t *m, const nereid_model_t *model, bool *set)
{
    json_t *root = config_of(m, model);
    json_t *graph = json_object_get(json_object_get(root, "optimization"), "graph");
    json_t *level = json_object_get(graph, "level");
    *set = json_is_object(graph);
    int v = 0;
    if (json_is_integer(level))
        v = (int)json_integer_value(level);
    else if (json_is_string(level))
        v = atoi(json_string_value(level));
    return v;
}

/* Appends one session setting to the model's options key. */
static void key_add(ort_model_t *m, const char *name, const char *value)
{
    size_t len = strlen(m->options_key);
    int n = snprintf(m->options_key + len, sizeof(m->options_key) - len, "%s=%s;", name, value);
    if (n < 0 || (size_t)n >= sizeof(m->options_key) - len)
        m->unshared = true; /* too long to compare: the model keeps its sessions */
}

nereid_error_t *make_session_options(ort_model_t *m, nereid_model_t *model)
{
    const ort_api_t *api = &m->backend->api;
    ORT_TRY(api, api->CreateSessionOptions(&m->options));

    /* A tiny model whose config leaves the level to the backend gets the
     * basic optimizations: the extended and layout ones cost it ~20 % more
     * session time and ~30 KiB more per session, for ~0.3 us a run. Only a
     * file alone in its directory counts as small: beside other files it
     * may keep its weights outside (ONNX external data). */
    struct stat st;
    m->alone = alone_in_dir(m->path);
    off_t size = m->alone && stat(m->path, &st) == 0 ? st.st_size : ORT_SMALL_MODEL_BYTES + 1;
    bool level_set;
    int level = graph_level(m, model, &level_set);
    if (!level_set && size <= ORT_TINY_MODEL_BYTES) level = -1;
    char level_text[16];
    snprintf(level_text, sizeof(level_text), "%d", level);
    key_add(m, "level", level_text);
    int ort_level = level == -1  ? ORT_ENABLE_BASIC
                    : level == 1 ? ORT_ENABLE_EXTENDED
                    : level == 2 ? ORT_DISABLE_ALL
                                 : ORT_ENABLE_ALL;
    ORT_TRY(api, api->SetSessionGraphOptimizationLevel(m->options, ort_level));

    /* A model that sets a thread count gets pools of its own, as in Triton's
     * onnxruntime backend (they block when idle too); others share the
     * environment's. */
    const char *v;
    int n;
    nereid_error_t *err;
    bool own_pools = !m->backend->global_pools;
    static const char *const keyed[] = {"intra_op_thread_count", "inter_op_thread_count",
                                        "execution_mode", "enable_mem_arena", "enable_mem_pattern"};
    for (size_t i = 0; i < sizeof(keyed) / sizeof(keyed[0]); i++)
        if ((v = nereid_model_parameter(model, keyed[i]))) key_add(m, keyed[i], v);
    if ((v = nereid_model_parameter(model, "intra_op_thread_count"))) {
        if ((err = parse_int(v, &n))) return err;
        ORT_TRY(api, api->SetIntraOpNumThreads(m->options, n));
        own_pools = true;
    }
    if ((v = nereid_model_parameter(model, "inter_op_thread_count"))) {
        if ((err = parse_int(v, &n))) return err;
        ORT_TRY(api, api->SetInterOpNumThreads(m->options, n));
        own_pools = true;
    }
    m->own_pools = own_pools;
    if (own_pools) {
        m->unshared = true; /* pools of its own are what the user asked for */
        ORT_TRY(api,
                api->AddSessionConfigEntry(m->options, "session.intra_op.allow_spinning", "0"));
        ORT_TRY(api,
                api->AddSessionConfigEntry(m->options, "session.inter_op.allow_spinning", "0"));
    } else {
        ORT_TRY(api, api->DisablePerSessionThreads(m->options));
    }
    if ((v = nereid_model_parameter(model, "execution_mode"))) {
        if ((err = parse_int(v, &n))) return err;
        if (n != 0 && n != 1)
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "Invalid configuration value provided. Expected values for  "
                                    "execution_mode are 0 or 1 but got %s .",
                                    v);
        ORT_TRY(api, api->SetSessionExecutionMode(m->options, n ? ORT_PARALLEL : ORT_SEQUENTIAL));
    }
    bool on;
    if ((v = nereid_model_parameter(model, "enable_mem_arena"))) {
        if ((err = parse_bool(v, &on))) return err;
        ORT_TRY(api, on ? api->EnableCpuMemArena(m->options) : api->DisableCpuMemArena(m->options));
    } else if (size <= ORT_SMALL_MODEL_BYTES) {
        key_add(m, "small", "1");
        ORT_TRY(api, api->DisableCpuMemArena(m->options));
    }
    if ((v = nereid_model_parameter(model, "enable_mem_pattern"))) {
        if ((err = parse_bool(v, &on))) return err;
        ORT_TRY(api, on ? api->EnableMemPattern(m->options) : api->DisableMemPattern(m->options));
    }
    return NULL;
}

/* ---- shared sessions ------------------------------------------------------ */

/* Whether path is the only entry of its directory: a model with sibling files
 * may keep its weights in them (ONNX external data), which its bytes do not
 * cover, so it is not shared. */
static bool alone_in_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    /* getdents64 into a stack buffer: opendir's 32 KiB buffer, allocated
     * and freed per model, was a visible share of loading a thousand. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return false;
    size_t n = 0;
    char buf[2048] __attribute__((aligned(8)));
    ssize_t got;
    while (n < 2 && (got = getdents64(fd, buf, sizeof buf)) > 0)
        for (ssize_t off = 0; off < got && n < 2;) {
            const struct dirent64 *ent = (const struct dirent64 *)(buf + off);
            if (ent->d_reclen == 0) break;
            if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) n++;
            off += ent->d_reclen;
        }
    close(fd);
    return n == 1;
}

/* Reads the model file into memory and hashes it. Returns false (nothing
 * allocated) when it cannot be read or is too large to share. */
static bool read_model_file(const char *path, uint8_t **data, size_t *len,
                            uint8_t digest[ORT_DIGEST_BYTES])
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        (uint64_t)st.st_size > ORT_SHARE_MAX_BYTES) {
        close(fd);
        return false;
    }
    size_t size = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(size);
    while (buf && got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf || got != size || gnutls_hash_fast(GNUTLS_DIG_SHA256, buf, size, digest) != 0) {
        free(buf);
        return false;
    }
    *data = buf;
    *len = size;
    return true;
}

/* Creates the entry's session from the bytes the entry's digest was taken
 * of, so what a model gets is what its bytes say, even if the file changes
 * meanwhile. With entry->lock held. */
static nereid_error_t *shared_fill(ort_model_t *m, ort_shared_t *e, const uint8_t *data, size_t len)
{
    if (e->session) return NULL;
    return ort_build_session(m, data, len, &e->session);
}

/* The bucket of a digest (SHA-256: its first bytes are as good as any). */
static size_t shared_bucket(const uint8_t digest[ORT_DIGEST_BYTES])
{
    return ((size_t)digest[0] | (size_t)digest[1] << 8) % ORT_SHARED_BUCKETS;
}

typedef struct session_call {
    ort_model_t *m;
    const void *data; /* the model file's bytes, or NULL: read m->path */
    size_t len;
    OrtSession **out;
} session_call_t;

static void *session_call_main(void *p)
{
    session_call_t *c = p;
    const ort_api_t *api = &c->m->backend->api;
    OrtEnv *env = c->m->backend->env;
    if (c->data) return api->CreateSessionFromArray(env, c->data, c->len, c->m->options, c->out);
    return api->CreateSession(env, c->m->path, c->m->options, c->out);
}

/* Builds a session from the model file's bytes (data, len) or, data NULL,
 * from m->path. Building one (parsing, graph optimization, weight copies)
 * takes a core for a while; it runs nicer than the threads that serve
 * requests (nereid_run_niced), so a model loading beside traffic takes the
 * CPU that inference leaves. Not for a model with thread pools of its own:
 * ONNX Runtime starts them here, and they would keep the priority. */
nereid_error_t *ort_build_session(ort_model_t *m, const void *data, size_t len, OrtSession **out)
{
    session_call_t c = {m, data, len, out};
    if (m->own_pools) return ort_error(&m->backend->api, session_call_main(&c));
    return ort_error(&m->backend->api, nereid_run_niced(10, session_call_main, &c));
}

/* Finds or adds the entry for (digest, m->options_key) and takes a
 * reference. */
static ort_shared_t *shared_acquire(ort_backend_t *b, const uint8_t digest[ORT_DIGEST_BYTES],
                                    const char *options_key)
{
    ort_shared_t **bucket = &b->shared[shared_bucket(digest)];
    pthread_mutex_lock(&b->shared_lock);
    ort_shared_t *e = *bucket;
    while (e &&
           (memcmp(e->digest, digest, ORT_DIGEST_BYTES) || strcmp(e->options_key, options_key)))
        e = e->next;
    if (!e && (e = calloc(1, sizeof(*e)))) {
        memcpy(e->digest, digest, ORT_DIGEST_BYTES);
        e->options_key = strdup(options_key);
        if (!e->options_key) {
            free(e);
            e = NULL;
        } else {
            pthread_mutex_init(&e->lock, NULL);
            e->next = *bucket;
            *bucket = e;
        }
    }
    if (e) e->refs++;
    pthread_mutex_unlock(&b->shared_lock);
    return e;
}

/* Drops a reference; the last one releases the entry's sessions. */
void shared_release(ort_backend_t *b, ort_shared_t *e)
{
    pthread_mutex_lock(&b->shared_lock);
    bool last = --e->refs == 0;
    if (last)
        for (ort_shared_t **p = &b->shared[shared_bucket(e->digest)]; *p; p = &(*p)->next)
            if (*p == e) {
                *p = e->next;
                break;
            }
    pthread_mutex_unlock(&b->shared_lock);
    if (!last) return;
    if (e->session) b->api.ReleaseSession(e->session);
    free(e->options_key);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* Shares the entry for the model's bytes and options when the model can
 * be shared (its file alone in its directory, m->alone, no thread pools of
 * its own);
 * *session is then borrowed from the entry. Otherwise leaves m->shared NULL
 * and *session NULL: the model makes its session itself. */
nereid_error_t *shared_open(ort_model_t *m, OrtSession **session)
{
    ort_backend_t *b = m->backend;
    *session = NULL;
    if (!b->share_sessions || m->unshared || !m->alone) return NULL;
    uint8_t *data, digest[ORT_DIGEST_BYTES];
    size_t len;
    if (!read_model_file(m->path, &data, &len, digest)) return NULL;
    ort_shared_t *e = shared_acquire(b, digest, m->options_key);
    if (!e) {
        free(data);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    pthread_mutex_lock(&e->lock);
    nereid_error_t *err = shared_fill(m, e, data, len);
    if (!err) *session = e->session;
    pthread_mutex_unlock(&e->lock);
    free(data);
    if (err) {
        shared_release(b, e);
        return err;
    }
    m->shared = e;
    return NULL;
}
