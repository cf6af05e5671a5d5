/*
 * This file contains the loaded-model lifecycle used by the server.
 */
#ifndef NEREID_MODEL_H
#define NEREID_MODEL_H

#include "core/core.h"

typedef struct model_load_args {
    const char *name;
    const char *dir; /* <repository>/<name> */
    int64_t version;
    const model_config_t *config; /* normalized; copied */
    const char *backend_dir;
    bool autocomplete_allowed;
} model_load_args_t;

/* Loads one version: backend, io tables, scheduler, instances (their init
 * runs on their own threads). *out holds one reference. */
nereid_error_t *model_load(nereid_server_t *server, const model_load_args_t *args, model_t **out);
/* Stops the model (queued requests drain) and drops the loader's reference. */
void model_unload(model_t *m);
/* The backend library name a config selects, or NULL (ensemble/unknown). */
const char *model_backend_for(const model_config_t *cfg);

#endif
