/*
 * This file contains the core's own functions (src/core): the model
 * lifecycle, batch execution, submission and statistics. The types live in
 * core/model.h and core/request.h, which schedulers include; schedulers
 * reach the functions here only through what the core hands them
 * (sched/scheduler.h, sched_core_t). Frontends never include it (they use
 * server.h).
 */
#ifndef NEREID_CORE_H
#define NEREID_CORE_H

#include "core/model.h"
#include "core/request.h"

/* ---- Model lifecycle (model.c) ---- */

typedef struct model_load_args {
    const char *name;
    const char *model_namespace; /* --model-namespacing: its repository, else NULL */
    const char *dir;             /* <repository>/<name> */
    int64_t version;
    const model_config_t *config; /* normalized; copied */
    const char *backend_dir;
    const nereid_backend_setting_t *backend_settings; /* --backend-config */
    size_t n_backend_settings;
    bool autocomplete_allowed;
} model_load_args_t;

/* Loads one version: backend, io tables, scheduler, instances (their init
 * runs on their own threads). *out holds one reference. */
nereid_error_t *model_load(nereid_server_t *server, const model_load_args_t *args, model_t **out);
/* Stops the model (queued requests drain) and drops the loader's reference. */
void model_unload(model_t *m);
/* Triton's in-place instance update (TritonModel::UpdateInstanceGroup):
 * whether m's instances can change without a reload (its scheduler can
 * retire instances; not an ensemble). */
bool model_can_update_instances(const model_t *m);
/* Gives m the instance groups of cfg: an instance whose group matches one
 * of cfg's (every field but name and count, and the device) keeps serving,
 * the ones cfg adds are initialized and warmed up (model_warmup_instance),
 * the others retired once their current batch is done (finalized before
 * this returns), except one still serving live sequences (lingering: its
 * thread finalizes it when they end). On error (an added instance's init
 * or warm-up failed) m is unchanged.
 * Thread: the loading one (the repository serializes loads). */
nereid_error_t *model_update_instances(model_t *m, const model_config_t *cfg);
/* Who a repository operation is (load_ops.c), for the claims: the calling
 * thread's own operation, and whether it works for operation op (its own,
 * or one it acts for: the load initializing a model whose control calls it
 * runs). model_load and model_update_instances mark m with the calling
 * thread's operations while they initialize it (load_op_mark_loading);
 * load_op_act_for(m) has the calling thread act for them until
 * load_op_act_end (false: m's load is over, it acts for itself). */
uint64_t load_op_self(void);
bool load_op_acts_for(uint64_t op);
void load_op_mark_loading(model_t *m, bool loading);
bool load_op_act_for(model_t *m);
void load_op_act_end(void);
/* The backend library name a config selects, or NULL (ensemble/unknown). */
const char *model_backend_for(const model_config_t *cfg);
/* model_hold turns a reference the caller owns (from a lookup) into a hold
 * (model_release, model.h, ends it). */
void model_hold(model_t *m);

/* Creates req->response with one slot per output the client gets. */
void request_prepare_response(nereid_request_t *req);
/* Memory for an output from the response's arena (64-byte aligned), or NULL
 * when it has no room; freed with the response. */
void *response_arena_alloc(nereid_response_t *resp, size_t byte_size);

/* Allocates output `name` of req in resp (nereid_batch_request_output's
 * rules; resp may be a decoupled model's further response). *requested is
 * false, and nothing is allocated, when resp has no slot for it (the
 * caller gives scratch memory). */
nereid_error_t *batch_alloc_response_output(nereid_request_t *req, nereid_response_t *resp,
                                            const char *name, nereid_datatype_t datatype,
                                            const int64_t *shape, size_t rank, size_t byte_size,
                                            void **buffer, bool *requested);

/* Runs one batch on an instance: backend execute, output scatter, timing.
 * Does not finish the requests. Thread: the instance's thread. */
void batch_execute(model_instance_t *inst, batch_t *batch);
/* --rate-limit turns taken before a batch is formed (sched_core_t
 * acquire_turn/release_turn; no-ops for an instance the limiter does not
 * know). Thread: inst's. */
void batch_acquire_turn(model_instance_t *inst);
void batch_release_turn(model_instance_t *inst);
/* Records the batch's statistics (one execution); with finish, then
 * finishes every request and resets the batch. */
void batch_complete(batch_t *batch, bool finish);

/* Runs the config's ModelWarmup samples through the model (before it is
 * served); an error fails the load. */
nereid_error_t *model_warmup(model_t *m);
/* Runs the samples on inst alone, directly on the calling thread (an
 * instance an in-place update adds, before the scheduler knows it, as
 * Triton warms up each instance it creates); an error fails the update. */
nereid_error_t *model_warmup_instance(model_t *m, model_instance_t *inst);

/* Statistics hooks. */
/* cfg's model_metrics may set the first-response histogram's buckets. */
void stats_init(model_stats_t *s, int64_t max_batch_size, const model_config_t *cfg);
void stats_destroy(model_stats_t *s);
/* --metrics-config histogram_latencies=true / summary_latencies=true: m's
 * latency histograms, and its summaries with the server's quantiles
 * (stats.c); nothing when they are off. */
void server_enable_latency_metrics(model_t *m);
void stats_add(stat_duration_t *d, uint64_t ns);
/* Counts one response under index (Triton's response_stats rules): err
 * CANCELLED: cancel; other err: fail; else success when output_ns (the
 * start of output handling, 0: none) is set, else empty_response. */
void stats_record_response(model_stats_t *s, uint64_t index, uint64_t start_ns, uint64_t output_ns,
                           uint64_t end_ns, const nereid_error_t *err);
/* response_stats entry `index` (0 = response0), created on first use. */
response_stat_t *stats_response(model_stats_t *s, uint64_t index);

/* Resolves model/version (<= 0: latest ready) and takes a reference;
 * Triton's lookup error texts. */
/* Whether the server is shutting down (nereid_server_stop ran). */
bool server_is_stopping(nereid_server_t *s);
nereid_error_t *server_lookup_model(nereid_server_t *s, const char *name, int64_t version,
                                    model_t **out);
/* server_lookup_model in namespace ns (--model-namespacing; NULL: by name
 * alone, where a name in two namespaces is Triton's ambiguity error). */
nereid_error_t *server_lookup_model_ns(nereid_server_t *s, const char *ns, const char *name,
                                       int64_t version, model_t **out);
/* nereid_server_infer_async that loads a model on demand on this thread
 * instead of handing the request to the on-demand loaders (on_demand.c,
 * which run it). Same ownership: on error the caller keeps req. */
nereid_error_t *server_infer_loaded(nereid_server_t *s, nereid_request_t *req,
                                    const nereid_response_allocator_t *allocator,
                                    nereid_complete_fn done_fn, void *done_userp);
/* Looks model name/version (in namespace ns, or NULL) up and holds it
 * (model_hold). */
nereid_error_t *server_hold_model(nereid_server_t *s, const char *ns, const char *name,
                                  int64_t version, model_t **out);
/* nereid_server_infer_async on model m, which the caller holds (model_hold)
 * instead of a lookup by name: an ensemble's steps. */
nereid_error_t *server_infer_held(model_t *m, nereid_request_t *req,
                                  const nereid_response_allocator_t *allocator,
                                  nereid_complete_fn done_fn, void *done_userp);
/* server_infer_held for a request that takes 0..N responses
 * (nereid_server_infer_stream's contract): a decoupled ensemble step. */
nereid_error_t *server_infer_held_stream(model_t *m, nereid_request_t *req,
                                         const nereid_response_allocator_t *allocator,
                                         nereid_response_fn fn, void *userp);

/* Validates req against model m and fills req->batch_size; shapes are
 * rewritten to reshape dims. Triton's error texts. */
nereid_error_t *request_validate(nereid_request_t *req, model_t *m);

#endif
