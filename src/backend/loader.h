/*
 * This file contains the backend loader: finding libnereid_<name>.so,
 * checking its ABI version and resolving its entry points. Libraries are
 * loaded once per process and shared by every model that uses them.
 */
#ifndef NEREID_LOADER_H
#define NEREID_LOADER_H

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
    void *state;
    int refcount; /* guarded by the loader's lock */
    /* --backend-config as resolved for this backend (nereid_backend_config) */
    char **config_settings, **config_values;
    size_t n_config;
    char *config_json;
} backend_lib_t;

struct nereid_backend {
    backend_lib_t lib;
};

/* Loads (or shares) the backend library `name` from dir. The first load
 * resolves its --backend-config from settings (nereid_backend_config). */
nereid_error_t *backend_acquire(const char *dir, const char *name,
                                const nereid_backend_setting_t *settings, size_t n_settings,
                                backend_lib_t **out);
/* Drops a reference; the last one runs fini and dlcloses. */
void backend_release(backend_lib_t *lib);

#endif
