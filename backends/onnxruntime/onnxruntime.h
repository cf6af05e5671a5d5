/*
 * This file contains what the onnxruntime backend's files share: its
 * limits, the backend, model and instance state, and the functions one file
 * calls in another.
 */
#ifndef NEREID_ONNXRUNTIME_H
#define NEREID_ONNXRUNTIME_H

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
#define ORT_SHARED_BUCKETS 1024               /* the shared sessions' hash table */
/* A model file up to this size, alone in its directory (no external data
 * beside it), runs without a memory arena of its own
 * (unless its config sets enable_mem_arena): ONNX Runtime's arena touches
 * ~35 KiB per session at its first run and keeps it, which a thousand small
 * models pay a thousand times for allocations malloc serves as fast. */
#define ORT_SMALL_MODEL_BYTES ((off_t)1 << 20)
/* A model file up to this size, alone in its directory, whose config sets
 * no optimization.graph gets ONNX Runtime's basic graph optimizations
 * instead of all of them
 * (Triton's default): see make_session_options. */
#define ORT_TINY_MODEL_BYTES ((off_t)64 << 10)

/* A session shared by models whose model file bytes and session options
 * are identical (the same model copied into many tenants' directories):
 * the instances of each such model run on it (ONNX Runtime's Run is
 * thread-safe), so a thousand copies of one model cost one session. */
typedef struct ort_shared {
    struct ort_shared *next;          /* in its bucket of the backend's table */
    uint8_t digest[ORT_DIGEST_BYTES]; /* SHA-256 of the model file */
    char *options_key;                /* the session options, as text */
    int refs;                         /* models using it; under the backend's shared_lock */
    pthread_mutex_t lock;             /* guards session's creation */
    OrtSession *session;              /* NULL until the first model has made it */
} ort_shared_t;

typedef struct ort_backend {
    ort_api_t api;
    OrtEnv *env;
    OrtMemoryInfo *cpu_info;
    OrtAllocator *allocator; /* ORT's default CPU allocator (not owned) */
    bool global_pools;       /* sessions share the env's pools (enable-global-threadpool) */
    bool share_sessions;     /* identical models share sessions (share-sessions) */
    pthread_mutex_t shared_lock;
    ort_shared_t *shared[ORT_SHARED_BUCKETS]; /* by digest, under shared_lock */
    char load_error[1024];                    /* non-empty when the runtime is unavailable */
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
    /* The session made at model init, unless shared: the model's instances
     * borrow it, or with pools of their own (own_pools) or share-sessions=0
     * the first instance takes it and each other instance makes its own. */
    OrtSession *spare;
    ort_shared_t *shared;  /* non-NULL: instances borrow this entry's session */
    char options_key[256]; /* the session options as text (the sharing key's second half) */
    bool unshared;         /* options that rule sharing out (own thread pools) */
    bool own_pools;        /* the model sets thread counts: sessions per instance */
    bool alone;            /* the model file is alone in its directory (no external data) */
    char **seq_names;      /* owned names of sequence control/state tensors */
    size_t n_seq_names;
    json_t *config;    /* during model init: the config's JSON, parsed once per text */
    char *config_text; /* the text config was parsed from (autofill replaces it) */
} ort_model_t;

typedef struct ort_instance {
    ort_model_t *model;
    OrtSession *session;
    bool borrowed;   /* session belongs to the model or its shared entry */
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

#define ORT_TRY(api, call)                                                                         \
    do {                                                                                           \
        nereid_error_t *err_ = ort_error((api), (call));                                           \
        if (err_) return err_;                                                                     \
    } while (0)

enum { TENSORS_INPUTS, TENSORS_OUTPUTS, TENSORS_INITIALIZERS };

/* ---- onnxruntime.c ---- */

json_t *config_of(ort_model_t *m, const nereid_model_t *model);
int elem_from_datatype(nereid_datatype_t dt);
nereid_datatype_t datatype_from_elem(int elem);
const char *config_type_name(int elem);
nereid_error_t *ort_error(const ort_api_t *api, OrtStatus *status);
void shape_string(char *buf, size_t size, const int64_t *dims, size_t rank);
void *grow(void *p, size_t *cap, size_t need, size_t elem_size);

/* ---- ort_session.c ---- */

nereid_error_t *parse_int(const char *value, int *out);
nereid_error_t *parse_bool(const char *value, bool *out);
nereid_error_t *make_session_options(ort_model_t *m, nereid_model_t *model);
nereid_error_t *ort_build_session(ort_model_t *m, const void *data, size_t len, OrtSession **out);
void shared_release(ort_backend_t *b, ort_shared_t *e);
nereid_error_t *shared_open(ort_model_t *m, OrtSession **session);

/* ---- ort_config.c ---- */

void tensors_free(ort_tensor_t *t, size_t n);
nereid_error_t *session_tensors(ort_backend_t *b, OrtSession *session, int kind, ort_tensor_t **out,
                                size_t *n_out);
nereid_error_t *autofill(nereid_model_t *model, const ort_tensor_t *in, size_t n_in,
                         const ort_tensor_t *out, size_t n_out);
nereid_error_t *bind_config(ort_model_t *m, nereid_model_t *model, const ort_tensor_t *in,
                            size_t n_in, const ort_tensor_t *inits, size_t n_inits,
                            const ort_tensor_t *out, size_t n_out);

#endif
