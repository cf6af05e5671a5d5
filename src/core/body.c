/*
 * This file contains request bodies in a backend's memory (server.h,
 * backend ABI 1.10): a frontend asks the model's backend for the memory it
 * receives an inference body into, so the inputs that borrow the body lie
 * where the backend reads them (the python backend: shared memory its
 * workers map). The core only finds the model, keeps it referenced while
 * the body lives, and passes the backend's handle back on release.
 */
#include <stdlib.h>

#include "backend/loader.h"
#include "core/core.h"
#include "core/model.h"
#include "core/util.h"

struct nereid_body {
    model_t *model; /* a reference: its backend stays loaded */
    void *handle;   /* the backend's */
};

nereid_body_t *nereid_server_body_alloc(nereid_server_t *server, const char *model, int64_t version,
                                        size_t byte_size, char **data)
{
    *data = NULL;
    model_t *m;
    nereid_error_t *err = server_lookup_model(server, model, version, &m);
    if (err) {
        nereid_error_free(err);
        return NULL;
    }
    void *d = NULL, *h = NULL;
    if (m->backend && m->backend->body_alloc)
        h = m->backend->body_alloc((nereid_model_t *)m, byte_size, &d);
    if (!h || !d) {
        if (h) m->backend->body_release(h);
        model_unref(m);
        return NULL;
    }
    nereid_body_t *b = xcalloc(1, sizeof *b);
    b->model = m;
    b->handle = h;
    *data = d;
    return b;
}

void nereid_body_free(nereid_body_t *body)
{
    if (!body) return;
    body->model->backend->body_release(body->handle);
    model_unref(body->model);
    free(body);
}
