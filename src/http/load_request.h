/*
 * This file contains the reader of the repository load API's request body
 * (POST v2/repository/models/<name>/load): the "config" override and the
 * base64 "file:<path>" overrides of its "parameters" object, with no socket
 * and no server involved, so it can be fuzzed together with the load itself.
 */
#ifndef NEREID_HTTP_LOAD_REQUEST_H
#define NEREID_HTTP_LOAD_REQUEST_H

#include <jansson.h>
#include <stddef.h>

#include "nereid/server.h"

typedef struct load_request {
    const char *config; /* borrowed from the JSON document, or NULL */
    size_t n_files;     /* decoded file overrides */
    const char **paths; /* borrowed: the key after "file:" */
    void **contents;    /* owned, decoded bytes */
    size_t *sizes;
} load_request_t;

/* Fills req from the body's JSON document (root may be NULL: no body).
 * req borrows strings from root; free it with load_request_free before root. */
nereid_error_t *load_request_read(json_t *root, load_request_t *req);
void load_request_free(load_request_t *req);

#endif
