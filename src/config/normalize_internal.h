/*
 * This file contains the private declarations shared by config_normalize's
 * files: normalize.c (auto-complete, defaults, the driver),
 * normalize_validate.c (validation) and normalize_ensemble.c (ensembles).
 * Not for use outside them.
 */
#ifndef NEREID_CONFIG_NORMALIZE_INTERNAL_H
#define NEREID_CONFIG_NORMALIZE_INTERNAL_H

#include <stdbool.h>

#include "config/config_internal.h"

typedef struct nctx {
    model_config_t *cfg;
    const char *filename;
    const char *name; /* cfg->name, for messages */
    cfg_buf_t err;
    int n_errors;
} nctx_t;

/* normalize.c: errors and string helpers */
void nerr(nctx_t *c, const void *msg, const char *field, int index, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
bool streq(const char *a, const char *b);
bool empty(const char *s);

/* normalize_validate.c */
void validate_model_config(nctx_t *c);
void validate_instance_groups(nctx_t *c, const config_options_t *opts);
void validate_io(nctx_t *c, const config_options_t *opts);
void validate_warmup(nctx_t *c);

/* normalize_ensemble.c */
void validate_ensemble(nctx_t *c);

#endif
