/*
 * This file contains the backend loader: finding libnereid_<name>.so (or a
 * Triton backend, libtriton_<name>.so, run through libtritonserver.so),
 * checking its ABI version and resolving its entry points. Libraries are
 * loaded once per process and shared by every model that uses them.
 */
#ifndef NEREID_LOADER_H
#define NEREID_LOADER_H

#include <stdio.h>

#include "nereid/backend.h"

typedef nereid_error_t *(*backend_fn)(nereid_backend_t *);
typedef nereid_error_t *(*model_fn)(nereid_model_t *);
typedef nereid_error_t *(*instance_fn)(nereid_instance_t *);
typedef nereid_error_t *(*execute_fn)(nereid_instance_t *, nereid_batch_t *);

typedef struct backend_lib {
    char *name;
    char *path;
    void *handle;
    backend_fn fini;
    model_fn model_init, model_fini;
    instance_fn instance_init, instance_fini;
    execute_fn execute;
    instance_fn instance_ready; /* optional: nereid_backend_instance_ready */
    instance_fn instance_abort; /* optional (ABI 1.11): nereid_backend_instance_abort */
    /* optional (ABI 1.10, both or neither): nereid_backend_model_body_alloc/_release */
    void *(*body_alloc)(nereid_model_t *model, size_t byte_size, void **data);
    void (*body_release)(void *handle);
    void *state;
    bool triton;  /* a Triton library driven through libtritonserver.so */
    int refcount; /* guarded by the loader's lock */
    /* --backend-config as resolved for this backend (nereid_backend_config) */
    char **config_settings, **config_values;
    size_t n_config;
    char *config_json;
} backend_lib_t;

struct nereid_backend {
    backend_lib_t lib;
};

/* Where a model's backend library is searched: libnereid_<name>.so in
 * backend_dir/<name>/ then backend_dir/; else Triton's libtriton_<name>.so
 * (or the config's runtime file) in model_dir/<version>/, model_dir/,
 * backend_dir/<name>/. model_dir may be NULL. settings: --backend-config,
 * resolved for the backend at its first load (nereid_backend_config). */
typedef struct backend_search {
    const char *backend_dir;
    const char *model_dir;
    int64_t version;
    const char *runtime;
    const nereid_backend_setting_t *settings;
    size_t n_settings;
} backend_search_t;

/* Loads (or shares: one library per path) the backend library `name`. */
nereid_error_t *backend_acquire(const backend_search_t *search, const char *name,
                                backend_lib_t **out);
/* Drops a reference; the last one runs fini and dlcloses. */
void backend_release(backend_lib_t *lib);
/* Loads backend `name` ahead of the model loads that need it, when the
 * library a model with this search would get is one of Nereid's own in
 * the backend directory (the same for every model directory and version):
 * returns a reference (backend_release), or NULL when there is nothing to
 * load ahead or it failed (a model's own load then reports why). For
 * parallel start-up loads: the backend's start (ONNX Runtime's library and
 * environment) then overlaps reading the other models' configs. Any
 * thread. */
backend_lib_t *backend_prefetch(const backend_search_t *search, const char *name);

#endif
