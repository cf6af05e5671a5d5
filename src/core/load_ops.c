/*
 * This file contains who a repository operation (a load, an unload) is, for
 * the claims of repository_index.c. Each thread works for an operation of
 * its own. A thread that runs a model's model-control calls for it while
 * that model is being loaded (the Python backend's control thread for a
 * worker's pb_utils.load_model in initialize: nereid_model_act_for_load)
 * works also for the load that initializes the model, and for whatever that
 * load works for (a chain): the load waits for the model's init, which
 * waits for the call, so the call must not wait for the load. Claims held
 * by an operation of the chain are the caller's own (repo_claim refuses a
 * model the chain is loading, and lets the chain's ensemble loads' steps
 * be loaded); other claims are waited for as before.
 */
#include <stdatomic.h>
#include <string.h>

#include "core/core.h"
#include "nereid/backend.h"

static _Atomic uint64_t next_op = 1;

/* The calling thread's chain: its own operation first, then the ones it
 * acts for. */
static _Thread_local load_op_chain_t tls_chain;

static load_op_chain_t *chain_self(void)
{
    if (tls_chain.n == 0) {
        tls_chain.ids[0] = atomic_fetch_add(&next_op, 1);
        tls_chain.n = 1;
    }
    return &tls_chain;
}

uint64_t load_op_self(void)
{
    return chain_self()->ids[0];
}

bool load_op_acts_for(uint64_t op)
{
    const load_op_chain_t *c = chain_self();
    for (size_t i = 0; i < c->n; i++)
        if (c->ids[i] == op) return true;
    return false;
}

void load_op_mark_loading(model_t *m, bool loading)
{
    pthread_mutex_lock(&m->lock);
    if (loading)
        m->loader = *chain_self();
    else
        m->loader.n = 0;
    pthread_mutex_unlock(&m->lock);
}

bool load_op_act_for(model_t *m)
{
    load_op_chain_t *c = chain_self();
    c->n = 1;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->loader.n && c->n < LOAD_OP_CHAIN_MAX; i++)
        c->ids[c->n++] = m->loader.ids[i];
    pthread_mutex_unlock(&m->lock);
    return c->n > 1;
}

void load_op_act_end(void)
{
    chain_self()->n = 1;
}

bool nereid_model_act_for_load(const nereid_model_t *model)
{
    return model && load_op_act_for((model_t *)model);
}

void nereid_model_act_end(void)
{
    load_op_act_end();
}
