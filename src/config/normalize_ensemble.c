/*
 * This file contains config_normalize's checks of an ensemble's steps
 * (Triton's ValidateEnsembleConfig): the tensor graph of the steps' input
 * and output maps, that every ensemble output is produced and every step
 * can run, and that no ensemble tensor is left unused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "config/normalize_internal.h"
#include "nereid/server.h"

/* ---- ensembles ---- */

typedef struct ens_tensor {
    const char *name;
    bool is_output; /* produced by some step */
    bool ready;
    size_t *prev, n_prev; /* tensors this one depends on */
    size_t *next, n_next;
} ens_tensor_t;

typedef struct ens_graph {
    ens_tensor_t *t;
    size_t n, cap;
} ens_graph_t;

static size_t ens_find(const ens_graph_t *g, const char *name)
{
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->t[i].name, name) == 0) return i;
    return (size_t)-1;
}

static size_t ens_add(ens_graph_t *g, const char *name, bool is_output)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        ens_tensor_t *p = realloc(g->t, cap * sizeof *p);
        if (!p) return (size_t)-1;
        g->t = p;
        g->cap = cap;
    }
    g->t[g->n] = (ens_tensor_t){.name = name, .is_output = is_output};
    return g->n++;
}

static bool push_idx(size_t **arr, size_t *n, size_t v)
{
    size_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p) return false;
    *arr = p;
    p[(*n)++] = v;
    return true;
}

static void ens_free(ens_graph_t *g)
{
    for (size_t i = 0; i < g->n; i++) {
        free(g->t[i].prev);
        free(g->t[i].next);
    }
    free(g->t);
}

/* A protobuf map keeps the last entry of a repeated key (Triton reads the
 * config with protobuf): drops the earlier entries of a string-keyed map. */
static void map_keep_last(ProtobufCMessage **entries, size_t *n)
{
    size_t w = 0;
    for (size_t i = 0; i < *n; i++) {
        const ProtobufCFieldDescriptor *kf = &entries[i]->descriptor->fields[0];
        const char *key = *(char **)((char *)entries[i] + kf->offset);
        bool later = false;
        for (size_t j = i + 1; j < *n && !later; j++)
            later = streq(key, *(char **)((char *)entries[j] + kf->offset));
        if (later)
            protobuf_c_message_free_unpacked(entries[i], NULL);
        else
            entries[w++] = entries[i];
    }
    *n = w;
}

/* The ensemble's tensor graph from its steps (each step's outputs depend
 * on its inputs); false (error recorded) when a step is not valid. */
static bool ens_graph_build(nctx_t *c, const Inference__ModelEnsembling *es, ens_graph_t *g)
{
    bool ok = true;
    for (size_t s = 0; s < es->n_step && ok; s++) {
        const Inference__ModelEnsembling__Step *st = es->step[s];
        if (empty(st->model_name)) {
            nerr(c, st, NULL, -1, "must specify 'model_name' in step %zu of ensemble '%s'", s,
                 c->name);
            ok = false;
            break;
        }
        if (st->n_input_map == 0) {
            nerr(c, st, NULL, -1, "must specify 'input_map' in step %zu of ensemble '%s'", s,
                 c->name);
            ok = false;
            break;
        }
        if (st->n_output_map == 0) {
            nerr(c, st, NULL, -1, "must specify 'output_map' in step %zu of ensemble '%s'", s,
                 c->name);
            ok = false;
            break;
        }
        size_t outs[256];
        size_t n_outs = 0;
        for (size_t k = 0; k < st->n_output_map && ok; k++) {
            const char *tn = st->output_map[k]->value;
            size_t idx = ens_find(g, tn);
            if (idx != (size_t)-1) {
                if (g->t[idx].is_output) {
                    nerr(c, st, "output_map", (int)k,
                         "ensemble tensor '%s' can appear in an output map only once for "
                         "ensemble '%s' step %zu",
                         tn, c->name, s);
                    ok = false;
                    break;
                }
                g->t[idx].is_output = true;
            } else {
                idx = ens_add(g, tn, true);
                if (idx == (size_t)-1) ok = false;
            }
            if (ok && n_outs < 256) outs[n_outs++] = idx;
        }
        for (size_t k = 0; k < st->n_input_map && ok; k++) {
            for (size_t j = 0; j < k; j++) {
                if (streq(st->input_map[j]->key, st->input_map[k]->key)) {
                    nerr(c, st, "input_map", (int)k,
                         "input '%s' in model '%s' is mapped to multiple ensemble tensors for "
                         "ensemble '%s' step %zu",
                         st->input_map[k]->key, st->model_name, c->name, s);
                    ok = false;
                    break;
                }
            }
            if (!ok) break;
            const char *tn = st->input_map[k]->value;
            size_t idx = ens_find(g, tn);
            if (idx == (size_t)-1) idx = ens_add(g, tn, false);
            if (idx == (size_t)-1) {
                ok = false;
                break;
            }
            for (size_t o = 0; o < n_outs && ok; o++) {
                ok = push_idx(&g->t[outs[o]].prev, &g->t[outs[o]].n_prev, idx) &&
                     push_idx(&g->t[idx].next, &g->t[idx].n_next, outs[o]);
            }
        }
    }
    return ok;
}

/* Marks the tensors the ensemble's inputs make ready (a tensor is ready
 * when all it depends on is); false (error recorded) when an input is not
 * used. */
static bool ens_propagate_ready(nctx_t *c, const model_config_t *cfg, ens_graph_t *g)
{
    size_t *queue = malloc((g->n + 1) * sizeof *queue);
    if (!queue) return false;
    size_t qh = 0, qt = 0;
    for (size_t i = 0; i < cfg->n_input; i++) {
        size_t idx = ens_find(g, cfg->input[i]->name);
        if (idx == (size_t)-1) {
            nerr(c, cfg->input[i], "name", -1, "ensemble input '%s' for ensemble %s' is not used",
                 cfg->input[i]->name, c->name);
            free(queue);
            return false;
        }
        if (!g->t[idx].ready) {
            g->t[idx].ready = true;
            queue[qt++] = idx;
        }
    }
    while (qh < qt) {
        ens_tensor_t *r = &g->t[queue[qh++]];
        for (size_t k = 0; k < r->n_next; k++) {
            ens_tensor_t *nx = &g->t[r->next[k]];
            if (nx->ready) continue;
            bool all = true;
            for (size_t j = 0; j < nx->n_prev && all; j++)
                all = g->t[nx->prev[j]].ready;
            if (all) {
                nx->ready = true;
                queue[qt++] = r->next[k];
            }
        }
    }
    free(queue);
    return true;
}

/* Each ensemble output must be written; false (error recorded) when one is
 * not, naming a tensor nothing produces when there is one. */
static bool ens_check_outputs(nctx_t *c, const model_config_t *cfg, const ens_graph_t *g)
{
    for (size_t i = 0; i < cfg->n_output; i++) {
        size_t idx = ens_find(g, cfg->output[i]->name);
        if (idx == (size_t)-1) {
            nerr(c, cfg->output[i], "name", -1, "ensemble output '%s' for ensemble %s' is not used",
                 cfg->output[i]->name, c->name);
            return false;
        }
        if (!g->t[idx].ready) {
            /* walk back to a tensor nothing produces, for a helpful message */
            size_t last = idx, cur = idx;
            size_t guard = 0;
            for (;;) {
                size_t found = (size_t)-1;
                for (size_t j = 0; j < g->t[cur].n_prev; j++) {
                    size_t pv = g->t[cur].prev[j];
                    if (!g->t[pv].ready && pv != idx && pv != last) {
                        found = pv;
                        break;
                    }
                }
                if (found == (size_t)-1 || ++guard > g->n) break;
                last = cur = found;
            }
            if (last != idx)
                nerr(c, cfg->output[i], "name", -1,
                     "output '%s' for ensemble '%s' is not written: at least one of its "
                     "depending tensors, '%s', is not connected",
                     cfg->output[i]->name, c->name, g->t[last].name);
            else
                nerr(c, cfg->output[i], "name", -1, "output '%s' for ensemble '%s' is not written",
                     cfg->output[i]->name, c->name);
            return false;
        }
    }
    return true;
}

/* Every tensor but the ensemble's outputs must be ready and used. */
static void ens_check_unused(nctx_t *c, const model_config_t *cfg,
                             const Inference__ModelEnsembling *es, const ens_graph_t *g)
{
    for (size_t i = 0; i < g->n; i++) {
        bool is_ens_output = false;
        for (size_t k = 0; k < cfg->n_output && !is_ens_output; k++)
            is_ens_output = streq(cfg->output[k]->name, g->t[i].name);
        if (is_ens_output) continue;
        if (!g->t[i].ready || g->t[i].n_next == 0) {
            nerr(c, es, NULL, -1, "ensemble tensor '%s' is unused in ensemble '%s'", g->t[i].name,
                 c->name);
            return;
        }
    }
}

void validate_ensemble(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
    if (!streq(cfg->platform, "ensemble")) {
        nerr(c, es, NULL, -1,
             "ensemble scheduling cannot be set for model '%s' whose platform is not ensemble",
             c->name);
        return;
    }
    if (cfg->n_instance_group != 0) {
        nerr(c, cfg, "instance_group", -1,
             "instance group should not be specified for ensemble '%s'", c->name);
        return;
    }
    if (cfg->optimization) {
        nerr(c, cfg, "optimization", -1, "optimization should not be specified for ensemble '%s'",
             c->name);
        return;
    }
    if (cfg->n_model_warmup != 0) {
        nerr(c, cfg, "model_warmup", -1, "model_warmup can not be specified for ensemble '%s'",
             c->name);
        return;
    }
    if (es->n_step == 0) {
        nerr(c, es, NULL, -1, "must specify 'step' for ensemble '%s'", c->name);
        return;
    }
    for (size_t s = 0; s < es->n_step; s++) {
        map_keep_last((ProtobufCMessage **)es->step[s]->input_map, &es->step[s]->n_input_map);
        map_keep_last((ProtobufCMessage **)es->step[s]->output_map, &es->step[s]->n_output_map);
    }
    ens_graph_t g = {0};
    if (ens_graph_build(c, es, &g) && ens_propagate_ready(c, cfg, &g) &&
        ens_check_outputs(c, cfg, &g))
        ens_check_unused(c, cfg, es, &g);
    ens_free(&g);
}
