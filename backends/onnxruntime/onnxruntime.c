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
 * OrtSession per instance (the session made at model init to read the
 * model's inputs and outputs is handed to the first instance). Inputs are wrapped around the core's
 * buffers without a copy; outputs whose shape is known before the run (static dims plus the batch
 * dimension) are bound to the core's output buffers so ONNX Runtime writes
 * straight into them, other outputs are allocated by ONNX Runtime and copied.
 * Should a model's declared output shape prove wrong, that run fails and the
 * instance stops binding outputs.
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

#include "nereid/backend.h"
#include "ort_api.h"

#define ORT_DEFAULT_FILENAME "model.onnx"
#define ORT_LIBRARY_NAME "libonnxruntime.so.1"
#define ORT_DEFAULT_MAX_BATCH_SIZE 4          /* Triton's default-max-batch-size */
#define ORT_SHARE_MAX_BYTES ((size_t)1 << 31) /* protobuf's limit: larger files are not shared */
#define ORT_DIGEST_BYTES 32                   /* SHA-256 */

/* Sessions shared by models whose model file bytes and session options are
 * identical (the same model copied into many tenants' directories): slot i
 * serves instance i of each such model, so a model's instances still run on
 * sessions of their own, and a thousand copies of one model cost one
 * session per instance slot. ONNX Runtime's Run is thread-safe, so
 * instances of different models may run one session at once. */
typedef struct ort_shared {
    struct ort_shared *next;
    uint8_t digest[ORT_DIGEST_BYTES]; /* SHA-256 of the model file */
    char *options_key;                /* the session options, as text */
    int refs;                         /* models using it; under the backend's shared_lock */
    pthread_mutex_t lock;             /* guards sessions and their creation */
    OrtSession **sessions;            /* slot i: NULL until an instance i needs it */
    size_t n_sessions;
} ort_shared_t;

typedef struct ort_backend {
    ort_api_t api;
    OrtEnv *env;
    OrtMemoryInfo *cpu_info;
    OrtAllocator *allocator; /* ORT's default CPU allocator (not owned) */
    bool global_pools;       /* sessions share the env's pools (enable-global-threadpool) */
    bool share_sessions;     /* identical models share sessions (share-sessions) */
    pthread_mutex_t shared_lock;
    ort_shared_t *shared;  /* list, under shared_lock */
    char load_error[1024]; /* non-empty when the runtime is unavailable */
} ort_backend_t;

/* One model input or output as the session declares it. */
typedef struct ort_tensor {
    char *name;
    int elem_type; /* ORT_ELEM_* */
    int64_t *dims; /* model dims, -1 for symbolic/unknown */
    size_t rank;
} ort_tensor_t;

/* A config output bound to the session. */
typedef struct ort_output {
    const char *name; /* borrowed from the model's config */
    nereid_datatype_t datatype;
    int elem_type;
    const int64_t *config_dims; /* config dims (for scalar model outputs) */
    size_t config_rank;
    bool shape_known; /* all dims static apart from the batch dimension */
    bool flat;        /* a BATCH_SCATTER_WITH_INPUT_SHAPE target: produced flat */
    int64_t *dims;    /* model dims; dims[0] replaced by the batch size */
    size_t rank;
} ort_output_t;

typedef struct ort_model {
    ort_backend_t *backend;
    char *path; /* the .onnx file */
    OrtSessionOptions *options;
    int64_t max_batch_size;
    size_t n_inputs, n_outputs;
    size_t n_cfg_inputs;      /* the config's inputs, first in input_names; then injected ones */
    const char **input_names; /* borrowed from the model's config */
    nereid_datatype_t *input_datatypes;
    int *input_elem_types;
    ort_output_t *outputs;
    pthread_mutex_t lock;
    OrtSession *spare;     /* session from model init, taken by the first instance */
    ort_shared_t *shared;  /* non-NULL: instances borrow this entry's sessions */
    size_t next_slot;      /* the shared slot the next instance takes (under lock) */
    char options_key[256]; /* the session options as text (the sharing key's second half) */
    bool unshared;         /* options that rule sharing out (own thread pools) */
    char **seq_names;      /* owned names of sequence control/state tensors */
    size_t n_seq_names;
    json_t *config;    /* during model init: the config's JSON, parsed once per text */
    char *config_text; /* the text config was parsed from (autofill replaces it) */
} ort_model_t;

/* The model's config as JSON, parsed once for as long as its text stays the
 * same (model init reads it in several places; autofill replaces it).
 * Owned by m until config_drop; NULL when it cannot be parsed. */
static json_t *config_of(ort_model_t *m, const nereid_model_t *model)
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

typedef struct ort_instance {
    ort_model_t *model;
    OrtSession *session;
    bool borrowed;   /* session belongs to the model's shared entry */
    bool no_prebind; /* a bound output's shape once disagreed: let ORT allocate */
    /* Per-execute scratch, grown as needed and reused. */
    OrtValue **in_values;
    const char **in_names; /* the inputs fed to this run (optional ones may be absent) */
    const char **out_names;
    OrtValue **out_values;
    size_t *out_index;
    bool *out_bound;
    char *strings; /* staging for STRING outputs */
    size_t strings_cap;
    size_t *offsets;
    size_t offsets_cap;
} ort_instance_t;

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

static int elem_from_datatype(nereid_datatype_t dt)
{
    for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
        if (type_map[i].datatype == dt) return type_map[i].elem_type;
    return ORT_ELEM_UNDEFINED;
}

static nereid_datatype_t datatype_from_elem(int elem)
{
    for (size_t i = 0; i < sizeof(type_map) / sizeof(type_map[0]); i++)
        if (type_map[i].elem_type == elem) return type_map[i].datatype;
    return NEREID_TYPE_INVALID;
}

/* "TYPE_FP32" for an ORT element type ("TYPE_INVALID" when unmapped). */
static const char *config_type_name(int elem)
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
static nereid_error_t *ort_error(const ort_api_t *api, OrtStatus *status)
{
    if (!status) return NULL;
    nereid_error_t *err = nereid_error_new(NEREID_ERROR_INTERNAL, "onnx runtime error %d: %s",
                                           api->GetErrorCode(status), api->GetErrorMessage(status));
    api->ReleaseStatus(status);
    return err;
}

#define ORT_TRY(api, call)                                                                         \
    do {                                                                                           \
        nereid_error_t *err_ = ort_error((api), (call));                                           \
        if (err_) return err_;                                                                     \
    } while (0)

/* Appends "[d0,d1,...]" to buf. */
static void shape_string(char *buf, size_t size, const int64_t *dims, size_t rank)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (size_t i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
}

static void *grow(void *p, size_t *cap, size_t need, size_t elem_size)
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

static nereid_error_t *parse_bool(const char *value, bool *out);
static nereid_error_t *parse_int(const char *value, int *out);

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

/* ---- model: session options from the config ----------------------------- */

/* Triton's ParseIntValue. */
static nereid_error_t *parse_int(const char *value, int *out)
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
static nereid_error_t *parse_bool(const char *value, bool *out)
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

/* config.optimization.graph.level, 0 when absent. */
static int graph_level(ort_model_t *m, const nereid_model_t *model)
{
    json_t *root = config_of(m, model);
    json_t *level =
        json_object_get(json_object_get(json_object_get(root, "optimization"), "graph"), "level");
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

static nereid_error_t *make_session_options(ort_model_t *m, nereid_model_t *model)
{
    const ort_api_t *api = &m->backend->api;
    ORT_TRY(api, api->CreateSessionOptions(&m->options));

    int level = graph_level(m, model);
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
    }
    if ((v = nereid_model_parameter(model, "enable_mem_pattern"))) {
        if ((err = parse_bool(v, &on))) return err;
        ORT_TRY(api, on ? api->EnableMemPattern(m->options) : api->DisableMemPattern(m->options));
    }
    return NULL;
}

/* ---- model: reading the session's inputs and outputs --------------------- */

static void tensors_free(ort_tensor_t *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++) {
        free(t[i].name);
        free(t[i].dims);
    }
    free(t);
}

static nereid_error_t *type_info_read(const ort_api_t *api, OrtTypeInfo *ti, ort_tensor_t *t)
{
    int onnx_type = 0;
    ORT_TRY(api, api->GetOnnxTypeFromTypeInfo(ti, &onnx_type));
    if (onnx_type != ORT_TYPE_TENSOR)
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED,
                                "model input/output '%s' is not a tensor (ONNX type %d)", t->name,
                                onnx_type);
    const OrtTensorTypeAndShapeInfo *info;
    ORT_TRY(api, api->CastTypeInfoToTensorInfo(ti, &info));
    ORT_TRY(api, api->GetTensorElementType(info, &t->elem_type));
    ORT_TRY(api, api->GetDimensionsCount(info, &t->rank));
    t->dims = calloc(t->rank + 1, sizeof(int64_t));
    if (!t->dims) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    ORT_TRY(api, api->GetDimensions(info, t->dims, t->rank));
    for (size_t i = 0; i < t->rank; i++)
        if (t->dims[i] < 0) t->dims[i] = -1;
    return NULL;
}

enum { TENSORS_INPUTS, TENSORS_OUTPUTS, TENSORS_INITIALIZERS };

/* Reads the session's inputs, outputs or overridable initializers (graph
 * inputs that have an initializer: a request may feed them, Triton lists
 * them as optional config inputs). */
static nereid_error_t *session_tensors(ort_backend_t *b, OrtSession *session, int kind,
                                       ort_tensor_t **out, size_t *n_out)
{
    const ort_api_t *api = &b->api;
    size_t n = 0;
    *out = NULL;
    *n_out = 0;
    bool is_output = kind == TENSORS_OUTPUTS, is_init = kind == TENSORS_INITIALIZERS;
    ORT_TRY(api, is_output ? api->SessionGetOutputCount(session, &n)
                 : is_init ? api->SessionGetOverridableInitializerCount(session, &n)
                           : api->SessionGetInputCount(session, &n));
    ort_tensor_t *t = calloc(n + 1, sizeof(*t));
    if (!t) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < n && !err; i++) {
        char *name = NULL;
        err = ort_error(api, is_output ? api->SessionGetOutputName(session, i, b->allocator, &name)
                             : is_init ? api->SessionGetOverridableInitializerName(
                                             session, i, b->allocator, &name)
                                       : api->SessionGetInputName(session, i, b->allocator, &name));
        if (err) break;
        t[i].name = strdup(name);
        OrtStatus *st = api->AllocatorFree(b->allocator, name);
        if (st) api->ReleaseStatus(st);
        if (!t[i].name) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
            break;
        }
        OrtTypeInfo *ti = NULL;
        err = ort_error(api, is_output ? api->SessionGetOutputTypeInfo(session, i, &ti)
                             : is_init
                                 ? api->SessionGetOverridableInitializerTypeInfo(session, i, &ti)
                                 : api->SessionGetInputTypeInfo(session, i, &ti));
        if (!err) err = type_info_read(api, ti, &t[i]);
        if (ti) api->ReleaseTypeInfo(ti);
    }
    if (err) {
        tensors_free(t, n);
        return err;
    }
    *out = t;
    *n_out = n;
    return NULL;
}

static const ort_tensor_t *tensor_find(const ort_tensor_t *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

/* ---- model: autofill ------------------------------------------------------ */

static bool batching_supported(const ort_tensor_t *in, size_t n_in, const ort_tensor_t *out,
                               size_t n_out)
{
    for (size_t i = 0; i < n_in; i++)
        if (in[i].rank == 0 || in[i].dims[0] != -1) return false;
    for (size_t i = 0; i < n_out; i++)
        if (out[i].rank == 0 || out[i].dims[0] != -1) return false;
    return true;
}

/* Whether name is a sequence control or state input of cfg (JSON): the
 * sequence batcher feeds those, so autofill does not list them as inputs. */
static bool sequence_input(json_t *cfg, const char *name)
{
    json_t *sb = json_object_get(cfg, "sequence_batching"), *v;
    size_t i;
    for (int pass = 0; pass < 2; pass++)
        json_array_foreach(json_object_get(sb, pass ? "state" : "control_input"), i, v)
        {
            const char *n = json_string_value(json_object_get(v, pass ? "input_name" : "name"));
            if (n && strcmp(n, name) == 0) return true;
        }
    return false;
}

/* The config entries of tensors t, without the sequence inputs of cfg
 * (when cfg is non-NULL). */
static json_t *io_json(const ort_tensor_t *t, size_t n, bool batching, json_t *cfg)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (cfg && sequence_input(cfg, t[i].name)) continue;
        json_t *io = json_object();
        json_object_set_new(io, "name", json_string(t[i].name));
        json_object_set_new(io, "data_type", json_string(config_type_name(t[i].elem_type)));
        json_t *dims = json_array();
        for (size_t d = batching ? 1 : 0; d < t[i].rank; d++)
            json_array_append_new(dims, json_integer(t[i].dims[d]));
        if (json_array_size(dims) == 0) {
            json_array_append_new(dims, json_integer(1));
            if (batching) {
                json_t *reshape = json_object();
                json_object_set_new(reshape, "shape", json_array());
                json_object_set_new(io, "reshape", reshape);
            }
        }
        json_object_set_new(io, "dims", dims);
        json_array_append_new(arr, io);
    }
    return arr;
}

/* --backend-config=[onnxruntime,]default-max-batch-size=N (the core passes
 * Triton's 4 when unset): the max_batch_size auto-complete gives a model
 * that can batch; 0 leaves it unbatched. */
static int64_t default_max_batch_size(const nereid_model_t *model)
{
    const char *v = nereid_backend_config(nereid_model_backend(model), "default-max-batch-size");
    char *end;
    long long n = v ? strtoll(v, &end, 10) : ORT_DEFAULT_MAX_BATCH_SIZE;
    if (v && (*end || end == v || n < 0)) n = ORT_DEFAULT_MAX_BATCH_SIZE;
    return n;
}

/* Triton's onnxruntime auto-complete: fills max_batch_size and missing
 * inputs/outputs from the model. */
static nereid_error_t *autofill(nereid_model_t *model, const ort_tensor_t *in, size_t n_in,
                                const ort_tensor_t *out, size_t n_out)
{
    const char *name = nereid_model_name(model);
    const char *text = nereid_model_config_json(model);
    json_error_t jerr;
    json_t *cfg = json_loads(text ? text : "{}", 0, &jerr);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "autofill failed for model '%s': %s", name,
                                "cannot parse the model configuration");
    }
    int64_t mbs = nereid_model_max_batch_size(model);
    if (batching_supported(in, n_in, out, n_out)) {
        if (mbs == 0 && (mbs = default_max_batch_size(model)) > 0) {
            json_object_set_new(cfg, "max_batch_size", json_integer(mbs));
            fprintf(stderr,
                    "W onnxruntime: autofilled max_batch_size to %lld for model '%s' since "
                    "batching is supporrted but no max_batch_size is specified in model "
                    "configuration. Must specify max_batch_size to utilize autofill with a "
                    "larger max batch size\n",
                    (long long)mbs, name);
            if (mbs > 1 && !json_object_get(cfg, "dynamic_batching") &&
                !json_object_get(cfg, "sequence_batching"))
                json_object_set_new(cfg, "dynamic_batching", json_object());
        }
    } else if (mbs != 0) {
        json_decref(cfg);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "autofill failed for model '%s': model does not support batching "
                                "while non-zero max_batch_size is specified",
                                name);
    }
    if (json_array_size(json_object_get(cfg, "input")) == 0)
        json_object_set_new(cfg, "input", io_json(in, n_in, mbs > 0, cfg));
    if (json_array_size(json_object_get(cfg, "output")) == 0)
        json_object_set_new(cfg, "output", io_json(out, n_out, mbs > 0, NULL));
    char *new_text = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    if (!new_text) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    nereid_error_t *err = nereid_model_set_config(model, new_text);
    free(new_text);
    return err;
}

/* ---- model: validation against the session ------------------------------- */

static nereid_error_t *not_allowed(const char *what, const char *name, const ort_tensor_t *t,
                                   size_t n)
{
    char list[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof(list); i++)
        len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", i ? ", " : "", t[i].name);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "unexpected inference %s '%s', allowed %ss are: %s", what, name, what,
                            list);
}

/* Triton's CompareDimsSupported. */
static nereid_error_t *compare_dims(const char *model_name, const char *name, const ort_tensor_t *t,
                                    const int64_t *dims, size_t rank, int64_t mbs, bool exact)
{
    char model_shape[256], config_shape[256];
    shape_string(model_shape, sizeof(model_shape), t->dims, t->rank);
    if (t->rank == 0) { /* scalar in the model: config dims must all be 1 */
        for (size_t i = 0; i < rank; i++) {
            if (dims[i] != 1) {
                shape_string(config_shape, sizeof(config_shape), dims, rank);
                return nereid_error_new(
                    NEREID_ERROR_INVALID_ARG,
                    "unable to load model '%s', scalar tensor '%s', should only provide 1 in the "
                    "model configuration when the model doesn't support batching. Model "
                    "configuration provided: %s.",
                    model_name, name, config_shape);
            }
        }
        return NULL;
    }
    int64_t full[65] = {0};
    size_t full_rank = 0;
    if (rank > 63) rank = 63;
    if (mbs > 0) {
        if (t->dims[0] != -1)
            return nereid_error_new(
                NEREID_ERROR_INVALID_ARG,
                "model '%s', tensor '%s': for the model to support batching the shape should have "
                "at least 1 dimension and the first dimension must be -1; but shape expected by "
                "the model is %s",
                model_name, name, model_shape);
        full[full_rank++] = -1;
    }
    for (size_t i = 0; i < rank; i++)
        full[full_rank++] = dims[i];
    bool ok = t->rank == full_rank;
    for (size_t i = 0; ok && i < full_rank; i++)
        if (exact || t->dims[i] != -1) ok = t->dims[i] == full[i];
    if (ok) return NULL;
    shape_string(config_shape, sizeof(config_shape), full, full_rank);
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "model '%s', tensor '%s': the model expects %zu dimensions (shape %s) "
                            "but the model configuration specifies %zu dimensions (%s%s)",
                            model_name, name, t->rank, model_shape, full_rank,
                            mbs > 0 ? "an initial batch dimension because max_batch_size > 0 "
                                      "followed by the explicit tensor shape, making complete "
                                      "shape "
                                    : "shape ",
                            config_shape);
}

/* Triton's ragged batching in a batching config: an input with
 * allow_ragged_batch must be [-1] in the model (the core feeds it flat), and
 * the dims of a BATCH_SCATTER_WITH_INPUT_SHAPE target are not compared (the
 * core shapes it per request). */
enum { DIMS_COMPARE, DIMS_RAGGED, DIMS_SKIP };

static int dims_mode(ort_model_t *m, const nereid_model_t *model, bool input, const char *name)
{
    if (nereid_model_max_batch_size(model) <= 0) return DIMS_COMPARE;
    json_t *root = config_of(m, model);
    int mode = DIMS_COMPARE;
    size_t i, k;
    json_t *io, *target;
    json_array_foreach(json_object_get(root, input ? "input" : "batch_output"), i, io)
    {
        const char *io_name = json_string_value(json_object_get(io, "name"));
        const char *kind = json_string_value(json_object_get(io, "kind"));
        if (input && io_name && strcmp(io_name, name) == 0 &&
            json_is_true(json_object_get(io, "allow_ragged_batch")))
            mode = DIMS_RAGGED;
        if (input || !kind || strcmp(kind, "BATCH_SCATTER_WITH_INPUT_SHAPE") != 0) continue;
        json_array_foreach(json_object_get(io, "target_name"), k, target)
        {
            if (json_is_string(target) && strcmp(json_string_value(target), name) == 0)
                mode = DIMS_SKIP;
        }
    }
    return mode;
}

static nereid_error_t *check_io(const char *model_name, const char *what, const char *name,
                                nereid_datatype_t dt, const int64_t *dims, size_t rank, int64_t mbs,
                                const ort_tensor_t *all, size_t n_all, int mode)
{
    const ort_tensor_t *t = tensor_find(all, n_all, name);
    if (!t) return not_allowed(what, name, all, n_all);
    int elem = elem_from_datatype(dt);
    if (elem == ORT_ELEM_UNDEFINED)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "unsupported datatype %s for %s '%s' for model '%s'",
                                nereid_datatype_name(dt), what, name, model_name);
    if (elem != t->elem_type) {
        const char *cfg_name = config_type_name(elem);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects datatype %s for "
                                "%s '%s', model provides %s",
                                model_name, cfg_name, what, name, config_type_name(t->elem_type));
    }
    if (mode == DIMS_SKIP) return NULL;
    if (mode == DIMS_RAGGED) {
        if (t->rank == 1 && t->dims[0] == -1) return NULL;
        char model_shape[256];
        shape_string(model_shape, sizeof(model_shape), t->dims, t->rank);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects model provides "
                                "input with shape [-1]  for ragged input '%s', model provides %s",
                                model_name, name, model_shape);
    }
    return compare_dims(model_name, name, t, dims, rank, mbs, !strcmp(what, "output"));
}

/* ---- model lifecycle ------------------------------------------------------ */

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

/* Creates slot's session from the bytes the entry's digest was taken of
 * (data, or the file read again and checked against the digest), so what a
 * model gets is what its bytes say, even if the file changes meanwhile. With
 * entry->lock held. */
static nereid_error_t *shared_fill_slot(ort_model_t *m, ort_shared_t *e, size_t slot,
                                        const uint8_t *data, size_t len)
{
    const ort_api_t *api = &m->backend->api;
    if (slot >= e->n_sessions) {
        OrtSession **grown = realloc(e->sessions, (slot + 1) * sizeof(*grown));
        if (!grown) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        for (size_t i = e->n_sessions; i <= slot; i++)
            grown[i] = NULL;
        e->sessions = grown;
        e->n_sessions = slot + 1;
    }
    if (e->sessions[slot]) return NULL;
    uint8_t *own = NULL;
    if (!data) {
        uint8_t digest[ORT_DIGEST_BYTES];
        if (!read_model_file(m->path, &own, &len, digest) ||
            memcmp(digest, e->digest, sizeof(digest)) != 0) {
            free(own);
            return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                    "model file '%s' changed while its model was loading", m->path);
        }
        data = own;
    }
    nereid_error_t *err =
        ort_error(api, api->CreateSessionFromArray(m->backend->env, data, len, m->options,
                                                   &e->sessions[slot]));
    free(own);
    return err;
}

/* Finds or adds the entry for (digest, m->options_key) and takes a
 * reference. */
static ort_shared_t *shared_acquire(ort_backend_t *b, const uint8_t digest[ORT_DIGEST_BYTES],
                                    const char *options_key)
{
    pthread_mutex_lock(&b->shared_lock);
    ort_shared_t *e = b->shared;
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
            e->next = b->shared;
            b->shared = e;
        }
    }
    if (e) e->refs++;
    pthread_mutex_unlock(&b->shared_lock);
    return e;
}

/* Drops a reference; the last one releases the entry's sessions. */
static void shared_release(ort_backend_t *b, ort_shared_t *e)
{
    pthread_mutex_lock(&b->shared_lock);
    bool last = --e->refs == 0;
    if (last)
        for (ort_shared_t **p = &b->shared; *p; p = &(*p)->next)
            if (*p == e) {
                *p = e->next;
                break;
            }
    pthread_mutex_unlock(&b->shared_lock);
    if (!last) return;
    for (size_t i = 0; i < e->n_sessions; i++)
        if (e->sessions[i]) b->api.ReleaseSession(e->sessions[i]);
    free(e->sessions);
    free(e->options_key);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

/* Shares slot 0 of the entry for the model's bytes and options when the
 * model can be shared (its file alone in its directory, no thread pools of
 * its own); *session is then borrowed from the entry. Otherwise leaves
 * m->shared NULL and *session NULL: the model makes sessions of its own. */
static nereid_error_t *shared_open(ort_model_t *m, OrtSession **session)
{
    ort_backend_t *b = m->backend;
    *session = NULL;
    if (!b->share_sessions || m->unshared || !alone_in_dir(m->path)) return NULL;
    uint8_t *data, digest[ORT_DIGEST_BYTES];
    size_t len;
    if (!read_model_file(m->path, &data, &len, digest)) return NULL;
    ort_shared_t *e = shared_acquire(b, digest, m->options_key);
    if (!e) {
        free(data);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    }
    pthread_mutex_lock(&e->lock);
    nereid_error_t *err = shared_fill_slot(m, e, 0, data, len);
    if (!err) *session = e->sessions[0];
    pthread_mutex_unlock(&e->lock);
    free(data);
    if (err) {
        shared_release(b, e);
        return err;
    }
    m->shared = e;
    m->next_slot = 0;
    return NULL;
}

/* The session of the model's next instance slot, borrowed from its entry. */
static nereid_error_t *shared_instance_session(ort_model_t *m, OrtSession **session)
{
    pthread_mutex_lock(&m->lock);
    size_t slot = m->next_slot++;
    pthread_mutex_unlock(&m->lock);
    ort_shared_t *e = m->shared;
    pthread_mutex_lock(&e->lock);
    nereid_error_t *err = shared_fill_slot(m, e, slot, NULL, 0);
    *session = err ? NULL : e->sessions[slot];
    pthread_mutex_unlock(&e->lock);
    return err;
}

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
    const ort_api_t *api = &m->backend->api;
    return ort_error(api, api->CreateSession(m->backend->env, m->path, m->options, out));
}

static bool config_has_io(const nereid_model_t *model, bool input, const char *name)
{
    size_t n = input ? nereid_model_input_count(model) : nereid_model_output_count(model);
    for (size_t i = 0; i < n; i++) {
        const char *io;
        if (input)
            nereid_model_input(model, i, &io, NULL, NULL, NULL);
        else
            nereid_model_output(model, i, &io, NULL, NULL, NULL);
        if (strcmp(io, name) == 0) return true;
    }
    return false;
}

static int add_seq_name(ort_model_t *m, const char *name)
{
    for (size_t i = 0; i < m->n_seq_names; i++)
        if (strcmp(m->seq_names[i], name) == 0) return 0;
    char **v = realloc(m->seq_names, (m->n_seq_names + 1) * sizeof(*v));
    if (!v) return -1;
    m->seq_names = v;
    if (!(v[m->n_seq_names] = strdup(name))) return -1;
    m->n_seq_names++;
    return 0;
}

/* Sequence batching: the control inputs and implicit state inputs the core
 * injects into every request (and the state outputs it captures) are model
 * tensors that config.pbtxt does not list as input/output; so are the
 * targets of batch_input (the core computes them per batch). Collects those
 * the session has into m->seq_names: *n_seq_in inputs, then outputs. */
static int sequence_names(ort_model_t *m, const nereid_model_t *model, const ort_tensor_t *in,
                          size_t n_in, const ort_tensor_t *out, size_t n_out, size_t *n_seq_in)
{
    *n_seq_in = 0;
    json_t *cfg = config_of(m, model);
    json_t *sb = json_object_get(cfg, "sequence_batching");
    int rc = 0;
    for (int pass = 0; pass < 2 && sb && rc == 0; pass++) {
        size_t i;
        json_t *v;
        if (pass == 0) {
            json_array_foreach(json_object_get(sb, "control_input"), i, v)
            {
                const char *n = json_string_value(json_object_get(v, "name"));
                if (n && tensor_find(in, n_in, n) && !config_has_io(model, true, n))
                    rc |= add_seq_name(m, n);
            }
        }
        json_array_foreach(json_object_get(sb, "state"), i, v)
        {
            const char *n =
                json_string_value(json_object_get(v, pass == 0 ? "input_name" : "output_name"));
            if (!n) continue;
            if (pass == 0 && tensor_find(in, n_in, n) && !config_has_io(model, true, n))
                rc |= add_seq_name(m, n);
            if (pass == 1 && tensor_find(out, n_out, n) && !config_has_io(model, false, n))
                rc |= add_seq_name(m, n);
        }
        if (pass == 0) *n_seq_in = m->n_seq_names;
    }
    json_t *bis = json_object_get(cfg, "batch_input"), *bi, *target;
    size_t i, k;
    json_array_foreach(bis, i, bi)
    {
        json_array_foreach(json_object_get(bi, "target_name"), k, target)
        {
            const char *n = json_string_value(target);
            if (n && tensor_find(in, n_in, n) && !config_has_io(model, true, n)) {
                size_t before = m->n_seq_names;
                rc |= add_seq_name(m, n);
                /* inputs first: move it in front of the state outputs */
                if (m->n_seq_names > before && before > *n_seq_in) {
                    char *name = m->seq_names[before];
                    memmove(&m->seq_names[*n_seq_in + 1], &m->seq_names[*n_seq_in],
                            (before - *n_seq_in) * sizeof(*m->seq_names));
                    m->seq_names[*n_seq_in] = name;
                }
                if (m->n_seq_names > before) (*n_seq_in)++;
            }
        }
    }
    return rc;
}

/* Binds the (possibly autofilled) config's inputs and outputs to the model.
 * A config input may also name an overridable initializer (Triton's
 * L0_initializer_as_input): it is not counted against the model's inputs. */
static nereid_error_t *bind_config(ort_model_t *m, nereid_model_t *model, const ort_tensor_t *in,
                                   size_t n_in, const ort_tensor_t *inits, size_t n_inits,
                                   const ort_tensor_t *out, size_t n_out)
{
    const char *name = nereid_model_name(model);
    m->max_batch_size = nereid_model_max_batch_size(model);
    m->n_inputs = nereid_model_input_count(model);
    m->n_outputs = nereid_model_output_count(model);
    size_t n_cfg_in = m->n_inputs, n_cfg_out = m->n_outputs, n_seq_in = 0, n_init_in = 0;
    m->n_cfg_inputs = n_cfg_in;
    for (size_t i = 0; i < n_cfg_in; i++) {
        const char *io;
        nereid_model_input(model, i, &io, NULL, NULL, NULL);
        if (!tensor_find(in, n_in, io) && tensor_find(inits, n_inits, io)) n_init_in++;
    }
    if (sequence_names(m, model, in, n_in, out, n_out, &n_seq_in) != 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    m->n_inputs += n_seq_in;
    m->n_outputs += m->n_seq_names - n_seq_in;
    if (m->n_inputs - n_init_in != n_in)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load model '%s', configuration expects %zu inputs, "
                                "model provides %zu",
                                name, m->n_inputs, n_in);
    m->input_names = calloc(m->n_inputs + 1, sizeof(*m->input_names));
    m->input_datatypes = calloc(m->n_inputs + 1, sizeof(*m->input_datatypes));
    m->input_elem_types = calloc(m->n_inputs + 1, sizeof(*m->input_elem_types));
    m->outputs = calloc(m->n_outputs + 1, sizeof(*m->outputs));
    if (!m->input_names || !m->input_datatypes || !m->input_elem_types || !m->outputs)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    for (size_t i = 0; i < m->n_inputs; i++) {
        const int64_t *dims;
        size_t rank;
        if (i >= n_cfg_in) { /* injected by the sequence batcher */
            const ort_tensor_t *t = tensor_find(in, n_in, m->seq_names[i - n_cfg_in]);
            m->input_names[i] = m->seq_names[i - n_cfg_in];
            m->input_elem_types[i] = t->elem_type;
            m->input_datatypes[i] = datatype_from_elem(t->elem_type);
            continue;
        }
        nereid_model_input(model, i, &m->input_names[i], &m->input_datatypes[i], &dims, &rank);
        bool init = !tensor_find(in, n_in, m->input_names[i]) &&
                    tensor_find(inits, n_inits, m->input_names[i]);
        nereid_error_t *err = check_io(
            name, "input", m->input_names[i], m->input_datatypes[i], dims, rank, m->max_batch_size,
            init ? inits : in, init ? n_inits : n_in, dims_mode(m, model, true, m->input_names[i]));
        if (err) return err;
        m->input_elem_types[i] = elem_from_datatype(m->input_datatypes[i]);
    }
    for (size_t i = 0; i < m->n_outputs; i++) {
        ort_output_t *o = &m->outputs[i];
        const ort_tensor_t *t;
        if (i >= n_cfg_out) { /* an implicit state output the core captures */
            o->name = m->seq_names[n_seq_in + i - n_cfg_out];
            t = tensor_find(out, n_out, o->name);
            o->datatype = datatype_from_elem(t->elem_type);
        } else {
            nereid_model_output(model, i, &o->name, &o->datatype, &o->config_dims, &o->config_rank);
            int mode = dims_mode(m, model, false, o->name);
            nereid_error_t *err = check_io(name, "output", o->name, o->datatype, o->config_dims,
                                           o->config_rank, m->max_batch_size, out, n_out, mode);
            if (err) return err;
            t = tensor_find(out, n_out, o->name);
            o->flat = mode == DIMS_SKIP;
        }
        o->elem_type = t->elem_type;
        o->rank = t->rank;
        o->dims = calloc(t->rank + 1, sizeof(int64_t));
        if (!o->dims) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
        memcpy(o->dims, t->dims, t->rank * sizeof(int64_t));
        o->shape_known = o->elem_type != ORT_ELEM_STRING && t->rank > 0 && !o->flat;
        for (size_t d = m->max_batch_size > 0 ? 1 : 0; d < t->rank; d++)
            if (t->dims[d] < 0) o->shape_known = false;
    }
    return NULL;
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
    if (m->shared) {
        nereid_error_t *err = shared_instance_session(m, &s->session);
        if (err) {
            instance_free(s);
            return err;
        }
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

/* ---- execute -------------------------------------------------------------- */

/* Builds a STRING tensor from a BYTES buffer (4-byte LE length per element).
 * Each element is copied with its length (GetResizedStringTensorElementBuffer),
 * so elements holding NUL bytes arrive whole; FillStringTensor would stop at
 * the first NUL. */
static nereid_error_t *string_input(ort_instance_t *s, const char *name, const int64_t *shape,
                                    size_t rank, const uint8_t *data, size_t byte_size,
                                    OrtValue **out)
{
    const ort_api_t *api = &s->model->backend->api;
    size_t count = 1;
    for (size_t i = 0; i < rank; i++)
        count *= (size_t)(shape[i] < 0 ? 0 : shape[i]);
    size_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t len;
        if (byte_size - pos < 4) goto malformed;
        memcpy(&len, data + pos, 4); /* little-endian hosts only (x86_64, aarch64) */
        pos += 4;
        if (byte_size - pos < len) goto malformed;
        pos += len;
    }
    if (pos != byte_size) goto malformed;
    ORT_TRY(api, api->CreateTensorAsOrtValue(s->model->backend->allocator, shape, rank,
                                             ORT_ELEM_STRING, out));
    pos = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t len;
        memcpy(&len, data + pos, 4);
        pos += 4;
        char *dst = NULL;
        nereid_error_t *err =
            ort_error(api, api->GetResizedStringTensorElementBuffer(*out, i, len, &dst));
        if (err) {
            api->ReleaseValue(*out);
            *out = NULL;
            return err;
        }
        if (len > 0) memcpy(dst, data + pos, len);
        pos += len;
    }
    return NULL;
malformed:
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "input '%s': malformed BYTES data for %zu elements in %zu bytes", name,
                            count, byte_size);
}

/* Copies ORT's STRING output into the core's buffer, length-prefixed. */
static nereid_error_t *string_output(ort_instance_t *s, nereid_batch_t *batch, const char *name,
                                     OrtValue *value, const int64_t *shape, size_t rank,
                                     size_t count)
{
    const ort_api_t *api = &s->model->backend->api;
    size_t data_len = 0;
    ORT_TRY(api, api->GetStringTensorDataLength(value, &data_len));
    char *strings = grow(s->strings, &s->strings_cap, data_len + 1, 1);
    size_t *offsets = grow(s->offsets, &s->offsets_cap, count + 1, sizeof(size_t));
    if (strings) s->strings = strings;
    if (offsets) s->offsets = offsets;
    if (!strings || !offsets) return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    if (count > 0)
        ORT_TRY(api, api->GetStringTensorContent(value, strings, data_len, offsets, count));
    void *buf = NULL;
    nereid_error_t *err = nereid_batch_output(batch, name, NEREID_TYPE_BYTES, shape, rank,
                                              data_len + 4 * count, &buf);
    if (err) return err;
    uint8_t *p = buf;
    for (size_t i = 0; i < count; i++) {
        size_t end = i + 1 < count ? offsets[i + 1] : data_len;
        uint32_t len = (uint32_t)(end - offsets[i]);
        memcpy(p, &len, 4);
        memcpy(p + 4, strings + offsets[i], len);
        p += 4 + len;
    }
    return NULL;
}

/* Copies an ORT-allocated output into the core's buffer. */
static nereid_error_t *read_output(ort_instance_t *s, nereid_batch_t *batch, const ort_output_t *o,
                                   OrtValue *value)
{
    const ort_api_t *api = &s->model->backend->api;
    OrtTensorTypeAndShapeInfo *info = NULL;
    ORT_TRY(api, api->GetTensorTypeAndShape(value, &info));
    int elem = 0;
    size_t rank = 0, count = 0;
    int64_t shape[64];
    nereid_error_t *err = ort_error(api, api->GetTensorElementType(info, &elem));
    if (!err) err = ort_error(api, api->GetDimensionsCount(info, &rank));
    if (!err && rank > 64)
        err = nereid_error_new(NEREID_ERROR_UNSUPPORTED, "output '%s' has rank %zu", o->name, rank);
    if (!err) err = ort_error(api, api->GetDimensions(info, shape, rank));
    if (!err) err = ort_error(api, api->GetTensorShapeElementCount(info, &count));
    api->ReleaseTensorTypeAndShapeInfo(info);
    if (err) return err;
    if (elem != o->elem_type)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "output '%s': model produced %s, configuration expects %s", o->name,
                                config_type_name(elem), config_type_name(o->elem_type));
    const int64_t *out_shape = shape;
    if (rank == 0) { /* scalar model output: report the config's dims ([1]) */
        out_shape = o->config_dims;
        rank = o->config_rank;
    }
    if (elem == ORT_ELEM_STRING)
        return string_output(s, batch, o->name, value, out_shape, rank, count);
    size_t byte_size = count * nereid_datatype_byte_size(o->datatype);
    void *src = NULL, *dst = NULL;
    ORT_TRY(api, api->GetTensorMutableData(value, &src));
    err = nereid_batch_output(batch, o->name, o->datatype, out_shape, rank, byte_size, &dst);
    if (err) return err;
    if (byte_size) memcpy(dst, src, byte_size);
    return NULL;
}

static void release_values(const ort_api_t *api, OrtValue **v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i]) api->ReleaseValue(v[i]);
        v[i] = NULL;
    }
}

static const uint8_t empty_buffer[8];

/* Runs the session; outputs with a known shape are bound to the core's
 * buffers first (unless bind is false). */
static nereid_error_t *run(ort_instance_t *s, nereid_batch_t *batch, size_t n_in, size_t n_out,
                           bool bind)
{
    ort_model_t *m = s->model;
    const ort_backend_t *b = m->backend;
    const ort_api_t *api = &b->api;
    int64_t batch_size = nereid_batch_size(batch);
    for (size_t k = 0; k < n_out; k++) {
        const ort_output_t *o = &m->outputs[s->out_index[k]];
        s->out_bound[k] = false;
        if (!bind || !o->shape_known) continue;
        int64_t shape[64];
        size_t rank = o->rank < 64 ? o->rank : 64;
        size_t count = 1;
        for (size_t d = 0; d < rank; d++) {
            shape[d] = (d == 0 && m->max_batch_size > 0) ? batch_size : o->dims[d];
            count *= (size_t)shape[d];
        }
        size_t byte_size = count * nereid_datatype_byte_size(o->datatype);
        void *buf = NULL;
        nereid_error_t *err =
            nereid_batch_output(batch, o->name, o->datatype, shape, rank, byte_size, &buf);
        if (err) return err;
        ORT_TRY(api, api->CreateTensorWithDataAsOrtValue(
                         b->cpu_info, buf ? buf : (void *)empty_buffer, byte_size, shape, rank,
                         o->elem_type, &s->out_values[k]));
        s->out_bound[k] = true;
    }
    return ort_error(api,
                     api->Run(s->session, NULL, s->in_names, (const OrtValue *const *)s->in_values,
                              n_in, s->out_names, n_out, s->out_values));
}

static bool batch_request_has_input(nereid_batch_t *batch, const char *name)
{
    nereid_error_t *err = nereid_batch_request_input(batch, 0, name, NULL, NULL, NULL, NULL, NULL);
    bool found = err == NULL;
    nereid_error_free(err);
    return found;
}

NEREID_EXPORT nereid_error_t *nereid_backend_execute(nereid_instance_t *instance,
                                                     nereid_batch_t *batch)
{
    ort_instance_t *s = nereid_instance_state(instance);
    ort_model_t *m = s->model;
    const ort_backend_t *b = m->backend;
    const ort_api_t *api = &b->api;
    nereid_error_t *err = NULL;
    size_t n_out = 0;

    size_t n_in = 0; /* inputs fed: an optional input the requests lack is left out */
    for (size_t i = 0; i < m->n_inputs && !err; i++) {
        nereid_datatype_t dt;
        const int64_t *shape;
        size_t rank, byte_size;
        const void *data;
        /* An optional config input the requests lack (the core batches only
         * requests with the same inputs); injected inputs are always there. */
        if (i < m->n_cfg_inputs && nereid_batch_request_count(batch) > 0 &&
            !batch_request_has_input(batch, m->input_names[i]))
            continue;
        err = nereid_batch_input(batch, m->input_names[i], &dt, &shape, &rank, &data, &byte_size);
        if (err) break;
        s->in_names[n_in] = m->input_names[i];
        if (dt == NEREID_TYPE_BYTES) {
            err = string_input(s, m->input_names[i], shape, rank, data, byte_size,
                               &s->in_values[n_in]);
        } else {
            err = ort_error(api,
                            api->CreateTensorWithDataAsOrtValue(
                                b->cpu_info, data ? (void *)data : (void *)empty_buffer, byte_size,
                                shape, rank, m->input_elem_types[i], &s->in_values[n_in]));
        }
        n_in++;
    }
    if (err) goto done;
    uint64_t input_end_ns = nereid_now_ns();

    for (size_t o = 0; o < m->n_outputs; o++) {
        if (!nereid_batch_output_requested(batch, m->outputs[o].name)) continue;
        s->out_names[n_out] = m->outputs[o].name;
        s->out_index[n_out++] = o;
    }
    if (n_out == 0) { /* nothing requested: still run (statistics, side effects) */
        for (size_t o = 0; o < m->n_outputs; o++) {
            s->out_names[n_out] = m->outputs[o].name;
            s->out_index[n_out++] = o;
        }
    }
    err = run(s, batch, n_in, n_out, !s->no_prebind);
    if (err) {
        /* A bound output whose real shape differs from the model's declared
         * one fails the run; later runs let ORT allocate such outputs. */
        for (size_t k = 0; k < n_out; k++)
            if (s->out_bound[k]) s->no_prebind = true;
    }
    if (err) goto done;
    uint64_t infer_end_ns = nereid_now_ns();

    for (size_t k = 0; k < n_out && !err; k++)
        if (!s->out_bound[k])
            err = read_output(s, batch, &m->outputs[s->out_index[k]], s->out_values[k]);
    if (!err) nereid_batch_report_compute(batch, input_end_ns, infer_end_ns);
done:
    release_values(api, s->in_values, m->n_inputs);
    release_values(api, s->out_values, n_out);
    return err;
}
