/*
 * This file contains the onnxruntime backend: it serves platform
 * "onnxruntime_onnx" models on ONNX Runtime's CPU execution provider, the way
 * Triton's onnxruntime backend does. The runtime library is dlopened at
 * backend init (NEREID_ORT_LIBRARY, else libonnxruntime.so.1 next to this
 * backend, else the source tree's third_party copy, else the system's), so
 * the server builds and runs without it; model loads then fail with the
 * reason.
 *
 * One OrtEnv per backend, with the intra-op and inter-op thread pools that
 * all sessions share unless their model sets its own thread counts; one
 * OrtSession per model, made at model init, that its instances run on
 * (ONNX Runtime's Run is thread-safe) and that models with identical bytes
 * share; a model with thread pools of its own, or every model with
 * share-sessions=0, gets one session per instance as in Triton (the one
 * from model init goes to the first instance). Inputs are wrapped around
 * the core's buffers without a copy; outputs whose shape is known before the run (static dims plus
 * the batch dimension) are bound to the core's output buffers so ONNX Runtime writes straight into
 * them, other outputs are allocated by ONNX Runtime and copied. Should a model's declared output
 * shape prove wrong, that run fails and the instance stops binding outputs.
 *
 * Here: loading the runtime, the backend, model and instance entry points.
 * Session options and shared sessions are ort_session.c, the config against
 * the session (autofill, validation, binding) ort_config.c, execute
 * ort_execute.c; onnxruntime.h holds what they share.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gnutls/crypto.h>
#include <jansson.h>

#include "onnxruntime.h"

/* The model's config as JSON, parsed once for as long as its text stays the
 * same (model init reads it in several places; autofill replaces it).
 * Owned by m until config_drop; NULL when it cannot be parsed. */
json_t *config_of(ort_model_t *m, const nereid_model_t *model)
{
    const char *text = nereid_model_config_json(model);
    if (!text) return NULL;
    if (!m->config_text || strcmp(m->config_text, text) != 0) {
        json_decref(m->config);
        free(m->config_text);
        m->config = json_loads(text, 0, NULL);
        m->config_text = strdup(text);
    }
    return m->config;
}

static void config_drop(ort_model_t *m)
{
    json_decref(m->config);
    m->config = NULL;
    free(m->config_text);
    m->config_text = NULL;
}

/* ---- helpers ------------------------------------------------------------ */

static const struct {
    nereid_datatype_t datatype;
    int elem_type;
} type_map[] = {
    {NEREID_TYPE_BOOL, ORT_ELEM_BOOL},     {NEREID_TYPE_UINT8, ORT_ELEM_UINT8},
    {NEREID_TYPE_UINT16, ORT_ELEM_UINT16}, {NEREID_TYPE_UINT32, ORT_ELEM_UINT32},
    {NEREID_TYPE_UINT64, ORT_ELEM_UINT64}, {NEREID_TYPE_INT8, ORT_ELEM_INT8},
    {NEREID_TYPE_INT16, ORT_ELEM_INT16},   {NEREID_TYPE_INT32, ORT_ELEM_INT32},
    {NEREID_TYPE_INT64, ORT_ELEM_INT64},   {NEREID_TYPE_FP16, ORT_ELEM_FLOAT16},
    {NEREID_TYPE_FP32, ORT_ELEM_FLOAT},    {NEREID_TYPE_FP64, ORT_ELEM_DOUBLE},
    {NEREID_TYPE_BYTES, ORT_ELEM_STRING},  {NEREID_TYPE_BF16, ORT_ELEM_BFLOAT16},
};

int elem_from_datatype(nereid_datatype_t dt)
{
    for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
        if (type_map[i].datatype == dt) return type_map[i].elem_type;
    return ORT_ELEM_UNDEFINED;
}

nereid_datatype_t datatype_from_elem(int elem)
{
    for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
        if (type_map[i].elem_type == elem) return type_map[i].datatype;
    return NEREID_TYPE_INVALID;
}

/* "TYPE_FP32" for an ORT element type ("TYPE_INVALID" when unmapped). */
const char *config_type_name(int elem)
{
    static const char *const names[] = {
#define X(e, name, size, cfg) [NEREID_TYPE_##e] = cfg,
        NEREID_DATATYPE_MAP(X)
#undef X
    };
    nereid_datatype_t dt = datatype_from_elem(elem);
    return dt == NEREID_TYPE_INVALID ? "TYPE_INVALID" : names[dt];
}

/* Converts an ORT status to a Nereid error (Triton's "onnx runtime error"
 * wording) and releases the status. NULL stays NULL. */
nereid_error_t *ort_error(const ort_api_t *api, OrtStatus *status)
{
    if (!status) return NULL;
    nereid_error_t *err = nereid_error_new(NEREID_ERROR_INTERNAL, "onnx runtime error %d: %s",
                                           api->GetErrorCode(status), api->GetErrorMessage(status));
    api->ReleaseStatus(status);
    return err;
}

/* Appends "[d0,d1,...]" to buf. */
void shape_string(char *buf, size_t size, const int64_t *dims, size_t rank)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (size_t i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

void *grow(void *p, size_t *cap, size_t need, size_t elem_size)
{
    if (need <= *cap) return p;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(p, n * elem_size);
    if (!q) return NULL;
    *cap = n;
    return q;
}

/* ---- backend ------------------------------------------------------------ */

static int try_load(ort_backend_t *b, const char *path, char *why, size_t why_size)
{
    return ort_api_load(&b->api, path, why, why_size);
}

/* Finds and loads the runtime: NEREID_ORT_LIBRARY, this backend's directory,
 * the source tree's third_party copy, then the dynamic linker's search. */
static void load_runtime(ort_backend_t *b)
{
    char why[512] = "";
    const char *env = getenv("NEREID_ORT_LIBRARY");
    if (env && *env) {
        if (try_load(b, env, why, sizeof(why)) != 0)
            snprintf(b->load_error, sizeof(b->load_error), "%s (from NEREID_ORT_LIBRARY)", why);
        return;
    }
    char candidates[3][PATH_MAX];
    size_t n = 0;
    Dl_info info;
    if (dladdr((void *)load_runtime, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        int len = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(candidates[n++], PATH_MAX, "%.*s/%s", len, slash ? info.dli_fname : ".",
                 ORT_LIBRARY_NAME);
    }
#ifdef NEREID_ORT_FALLBACK_PATH
    snprintf(candidates[n++], PATH_MAX, "%s", NEREID_ORT_FALLBACK_PATH);
#endif
    for (size_t i = 0; i < n; i++)
        if (access(candidates[i], R_OK) == 0 && try_load(b, candidates[i], why, sizeof(why)) == 0)
            return;
    if (try_load(b, ORT_LIBRARY_NAME, why, sizeof(why)) == 0) return;
    snprintf(b->load_error, sizeof(b->load_error),
             "ONNX Runtime library not found (looked for %s next to the backend%s and in the "
             "system paths; run scripts/setup.sh or set NEREID_ORT_LIBRARY): %s",
             ORT_LIBRARY_NAME,
#ifdef NEREID_ORT_FALLBACK_PATH
             " and at " NEREID_ORT_FALLBACK_PATH,
#else
             "",
#endif
             why);
}

/* One environment whose intra-op and inter-op thread pools every session
 * shares (sessions opt in with DisablePerSessionThreads), sized by ONNX
 * Runtime (one thread per physical core, the caller counting as one). The
 * pools block when idle instead of spin-waiting: a thousand idle models cost
 * no CPU, and a spin after one model's run would take the core another
 * model's instance thread needs. */
static nereid_error_t *create_env(ort_backend_t *b, int intra, int inter)
{
    const ort_api_t *api = &b->api;
    if (!b->global_pools) return ort_error(api, api->CreateEnv(ORT_LOG_WARNING, "nereid", &b->env));
    OrtThreadingOptions *tp = NULL;
    ORT_TRY(api, api->CreateThreadingOptions(&tp));
    OrtStatus *st = api->SetGlobalIntraOpNumThreads(tp, intra);
    if (!st) st = api->SetGlobalInterOpNumThreads(tp, inter);
    if (!st) st = api->SetGlobalSpinControl(tp, 0);
    if (!st) st = api->CreateEnvWithGlobalThreadPools(ORT_LOG_WARNING, "nereid", tp, &b->env);
    api->ReleaseThreadingOptions(tp);
    return ort_error(api, st);
}

NEREID_EXPORT uint32_t nereid_backend_abi_version(void)
{
    return NEREID_BACKEND_ABI_VERSION;
}

/* --backend-config=onnxruntime,<key>=<value>: Triton's enable-global-threadpool
 * (default 1 here, 0 in Triton) with its intra_op_thread_count and
 * inter_op_thread_count (the shared pools' sizes, 0 = ONNX Runtime's
 * choice), and Nereid's share-sessions (default 1). */
static nereid_error_t *read_backend_config(ort_backend_t *b, nereid_backend_t *backend, int *intra,
                                           int *inter)
{
    const char *v;
    nereid_error_t *err;
    b->global_pools = b->share_sessions = true;
    *intra = *inter = 0;
    if ((v = nereid_backend_config(backend, "enable-global-threadpool")) &&
        (err = parse_bool(v, &b->global_pools)))
        return err;
    if ((v = nereid_backend_config(backend, "share-sessions")) &&
        (err = parse_bool(v, &b->share_sessions)))
        return err;
    if ((v = nereid_backend_config(backend, "intra_op_thread_count")) &&
        (err = parse_int(v, intra)))
        return err;
    if ((v = nereid_backend_config(backend, "inter_op_thread_count")) &&
        (err = parse_int(v, inter)))
        return err;
    if (*intra < 0 || *inter < 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "onnxruntime thread counts must not be negative");
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_init(nereid_backend_t *backend)
{
    ort_backend_t *b = calloc(1, sizeof(*b));
    if (!b) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    pthread_mutex_init(&b->shared_lock, NULL);
    int intra, inter;
    nereid_error_t *err = read_backend_config(b, backend, &intra, &inter);
    if (err) {
        pthread_mutex_destroy(&b->shared_lock);
        free(b);
        return err;
    }
    nereid_backend_set_state(backend, b);
    load_runtime(b);
    if (b->load_error[0]) return NULL; /* model loads report it */
    const ort_api_t *api = &b->api;
    err = create_env(b, intra, inter);
    if (!err)
        err = ort_error(
            api, api->CreateCpuMemoryInfo(ORT_ARENA_ALLOCATOR, ORT_MEM_TYPE_DEFAULT, &b->cpu_info));
    if (!err) err = ort_error(api, api->GetAllocatorWithDefaultOptions(&b->allocator));
    if (err) {
        snprintf(b->load_error, sizeof(b->load_error), "ONNX Runtime initialization failed: %s",
                 nereid_error_message(err));
        nereid_error_free(err);
    }
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_fini(nereid_backend_t *backend)
{
    ort_backend_t *b = nereid_backend_state(backend);
    if (!b) return NULL;
    if (b->api.dl) {
        if (b->cpu_info) b->api.ReleaseMemoryInfo(b->cpu_info);
        if (b->env) b->api.ReleaseEnv(b->env);
        /* The library stays loaded: ONNX Runtime keeps thread-local and
         * static state that does not survive dlclose. */
    }
    pthread_mutex_destroy(&b->shared_lock);
    free(b);
    nereid_backend_set_state(backend, NULL);
    return NULL;
}

/* ---- model lifecycle ------------------------------------------------------ */

static void model_free(ort_model_t *m)
{
    if (!m) return;
    config_drop(m);
    const ort_api_t *api = &m->backend->api;
    if (m->shared) shared_release(m->backend, m->shared);
    if (m->spare) api->ReleaseSession(m->spare);
    if (m->options) api->ReleaseSessionOptions(m->options);
    for (size_t i = 0; m->outputs && i < m->n_outputs; i++)
        free(m->outputs[i].dims);
    free(m->outputs);
    free(m->input_names);
    free(m->input_datatypes);
    free(m->input_elem_types);
    free(m->path);
    for (size_t i = 0; i < m->n_seq_names; i++)
        free(m->seq_names[i]);
    free(m->seq_names);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static nereid_error_t *create_session(ort_model_t *m, OrtSession **out)
{
    return ort_build_session(m, NULL, 0, out);
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_init(nereid_model_t *model)
{
    ort_backend_t *b = nereid_backend_state(nereid_model_backend(model));
    const char *name = nereid_model_name(model);
    if (!b || b->load_error[0])
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "unable to load model '%s': onnxruntime backend unavailable: %s",
                                name, b ? b->load_error : "not initialized");
    ort_model_t *m = calloc(1, sizeof(*m));
    if (!m) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    m->backend = b;
    pthread_mutex_init(&m->lock, NULL);

    nereid_error_t *err = NULL;
    ort_tensor_t *in = NULL, *out = NULL, *inits = NULL;
    size_t n_in = 0, n_out = 0, n_inits = 0;
    struct stat st;

    m->path = nereid_model_file_path(model, ORT_DEFAULT_FILENAME);
    if (!m->path) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        goto fail;
    }
    if (stat(m->path, &st) == 0 && S_ISDIR(st.st_mode)) { /* <file>.onnx/model.onnx layout */
        char *p;
        if (asprintf(&p, "%s/%s", m->path, ORT_DEFAULT_FILENAME) < 0) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            goto fail;
        }
        free(m->path);
        m->path = p;
    }
    if (access(m->path, R_OK) != 0) {
        err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "unable to find '%s' for model '%s'",
                               m->path, name);
        goto fail;
    }
    if ((err = make_session_options(m, model))) goto fail;
    OrtSession *session;
    if ((err = shared_open(m, &session))) goto fail;
    if (!session) {
        if ((err = create_session(m, &m->spare))) goto fail;
        session = m->spare;
    }
    if ((err = session_tensors(b, session, TENSORS_INPUTS, &in, &n_in))) goto fail;
    if ((err = session_tensors(b, session, TENSORS_OUTPUTS, &out, &n_out))) goto fail;
    if ((err = session_tensors(b, session, TENSORS_INITIALIZERS, &inits, &n_inits))) goto fail;

    if (nereid_model_autocomplete_allowed(model) &&
        (nereid_model_input_count(model) == 0 || nereid_model_output_count(model) == 0))
        if ((err = autofill(model, in, n_in, out, n_out))) goto fail;
    if ((err = bind_config(m, model, in, n_in, inits, n_inits, out, n_out))) goto fail;

    tensors_free(in, n_in);
    tensors_free(out, n_out);
    tensors_free(inits, n_inits);
    config_drop(m);
    nereid_model_set_state(model, m);
    return NULL;
fail:
    tensors_free(in, n_in);
    tensors_free(out, n_out);
    tensors_free(inits, n_inits);
    model_free(m);
    return err;
}

NEREID_EXPORT nereid_error_t *nereid_backend_model_fini(nereid_model_t *model)
{
    model_free(nereid_model_state(model));
    nereid_model_set_state(model, NULL);
    return NULL;
}

/* ---- instance ------------------------------------------------------------- */

static void instance_free(ort_instance_t *s)
{
    if (!s) return;
    if (s->session && !s->borrowed) s->model->backend->api.ReleaseSession(s->session);
    free(s->in_values);
    free(s->in_names);
    free(s->out_names);
    free(s->out_values);
    free(s->out_index);
    free(s->out_bound);
    free(s->strings);
    free(s->offsets);
    free(s);
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_init(nereid_instance_t *instance)
{
    ort_model_t *m = nereid_model_state(nereid_instance_model(instance));
    if (!m) return nereid_error_new(NEREID_ERROR_INTERNAL, "onnxruntime model state missing");
    ort_instance_t *s = calloc(1, sizeof(*s));
    if (!s) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    s->model = m;
    size_t n = m->n_outputs + 1;
    s->in_values = calloc(m->n_inputs + 1, sizeof(*s->in_values));
    s->in_names = calloc(m->n_inputs + 1, sizeof(*s->in_names));
    s->out_names = calloc(n, sizeof(*s->out_names));
    s->out_values = calloc(n, sizeof(*s->out_values));
    s->out_index = calloc(n, sizeof(*s->out_index));
    s->out_bound = calloc(n, sizeof(*s->out_bound));
    if (!s->in_values || !s->in_names || !s->out_names || !s->out_values || !s->out_index ||
        !s->out_bound) {
        instance_free(s);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    if (m->shared || (!m->own_pools && m->backend->share_sessions)) {
        /* One session for all the model's instances (ONNX Runtime's Run is
         * thread-safe; they share the environment's pools either way). */
        s->session = m->shared ? m->shared->session : m->spare;
        s->borrowed = true;
        nereid_instance_set_state(instance, s);
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    s->session = m->spare;
    m->spare = NULL;
    pthread_mutex_unlock(&m->lock);
    if (!s->session) {
        nereid_error_t *err = create_session(m, &s->session);
        if (err) {
            instance_free(s);
            return err;
        }
    }
    nereid_instance_set_state(instance, s);
    return NULL;
}

NEREID_EXPORT nereid_error_t *nereid_backend_instance_fini(nereid_instance_t *instance)
{
    instance_free(nereid_instance_state(instance));
    nereid_instance_set_state(instance, NULL);
    return NULL;
}
