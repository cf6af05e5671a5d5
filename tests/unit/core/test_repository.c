/*
 * This file contains unit tests of model management through the in-process
 * API: explicit load / unload / reload (config and file overrides), ensembles
 * loading their composing models, unload_dependents, repository index states
 * and reasons, path traversal, a failed reload keeping the old version,
 * reloads and unloads under continuous inference with no failed request,
 * and poll mode (versions added/removed, config changes, broken changes,
 * models added/removed).
 */
#include <stdatomic.h>

#include "check.h"
#include "server_util.h"

/* Internal: one poll pass (src/core/repository.h). */
void repository_poll(nereid_server_t *s);

#define F2 "data_type: TYPE_FP32 dims: [ 2 ]"

static const char *testing_cfg = "backend: \"testing\" max_batch_size: 8\n"
                                 "input [ { name: \"INPUT0\" " F2 " } ]\n"
                                 "output [ { name: \"OUTPUT0\" " F2 " } ]\n";

static void make_models(void)
{
    make_repo_dir("repository");
    write_model("plain", testing_cfg);
    write_model("other", testing_cfg);
    write_model("slow", "backend: \"testing\" max_batch_size: 8\n"
                        "parameters { key: \"execute_delay_ms\" value { string_value: \"5\" } }\n"
                        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                        "input [ { name: \"INPUT0\" " F2 " } ]\n"
                        "output [ { name: \"OUTPUT0\" " F2 " } ]\n");
    write_file("empty/config.pbtxt", testing_cfg);
    write_model("ens", "platform: \"ensemble\" max_batch_size: 8\n"
                       "input [ { name: \"X\" " F2 " } ]\n"
                       "output [ { name: \"Y\" " F2 " } ]\n"
                       "ensemble_scheduling { step [ { model_name: \"other\"\n"
                       "  input_map { key: \"INPUT0\" value: \"X\" }\n"
                       "  output_map { key: \"OUTPUT0\" value: \"Y\" } } ] }\n");
}

static nereid_error_t *infer_x(nereid_server_t *s, const char *model, int64_t version,
                               nereid_response_t **out)
{
    static const float x[2] = {3, 4};
    static const int64_t shape[2] = {1, 2};
    bool ens = strcmp(model, "ens") == 0;
    nereid_request_t *req;
    nereid_request_new(s, model, version, &req);
    nereid_request_add_input(req, ens ? "X" : "INPUT0", NEREID_TYPE_FP32, shape, 2, x, 8);
    nereid_error_t *err;
    *out = infer_sync(s, req, &err);
    return err;
}

/* NULL when an inference on model succeeds, else its error message (static). */
static const char *try_infer_version(nereid_server_t *s, const char *model, int64_t version)
{
    nereid_response_t *resp = NULL;
    nereid_error_t *err = infer_x(s, model, version, &resp);
    return outcome_text(err, resp);
}

static const char *try_infer(nereid_server_t *s, const char *model)
{
    return try_infer_version(s, model, 0);
}

static void test_startup_index(nereid_server_t *s)
{
    json_t *row = index_row(s, "plain", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);
    /* Never loaded: the name only. */
    row = index_row(s, "other", NULL);
    CHECK(row && json_object_size(row) == 1);
    json_decref(row);
    CHECK(try_infer(s, "plain") == NULL);
    CHECK_STR_CONTAINS(try_infer(s, "other"), "Request for unknown model: 'other' is not found");
    CHECK(nereid_server_is_ready(s));
}

static void test_names(nereid_server_t *s)
{
    CHECK_ERROR(nereid_server_load_model(s, "../plain", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG, "invalid model name");
    CHECK_ERROR(nereid_server_load_model(s, "..", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG, "invalid model name");
    CHECK_ERROR(nereid_server_load_model(s, "a/b", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG, "invalid model name");
    /* Triton's ValidateModelName texts (L0_input_validation) */
    CHECK_ERROR(nereid_server_load_model(s, "../plain", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG,
                "invalid model name '../plain', model name must not contain path traversal "
                "characters");
    CHECK_ERROR(nereid_server_load_model(s, " .. ", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG, "must not contain path traversal characters");
    /* A '\\' is an ordinary character (Triton's rule): no such directory. */
    CHECK_ERROR(nereid_server_load_model(s, "a\\b", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INTERNAL,
                "failed to load 'a\\b', failed to poll from model repository");
    CHECK_ERROR(nereid_server_load_model(s, "", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG,
                "Model name cannot be empty. Please enter a valid name to deploy.");
    CHECK_ERROR(nereid_server_load_model(s, " \t\n\r\f\v", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG,
                "Model name cannot be empty. Please enter a valid name to deploy.");
    CHECK_ERROR(nereid_server_load_model(s, "...", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INTERNAL,
                "failed to load '...', failed to poll from model repository");
    CHECK_ERROR(nereid_server_unload_model(s, "../etc", false), NEREID_ERROR_INVALID_ARG,
                "invalid model name");
    CHECK_ERROR(nereid_server_load_model(s, "nope", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INTERNAL,
                "failed to load 'nope', failed to poll from model repository");
    CHECK_ERROR(nereid_server_load_model(s, "empty", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_INTERNAL, "failed to load 'empty', no version is available");
    json_t *row = index_row(s, "empty", NULL);
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    CHECK(strcmp(row_str(row, "reason"),
                 "Internal: failed to load 'empty', no version is available") == 0);
    json_decref(row);
    /* A file override cannot escape the temporary model directory. */
    const char *paths[] = {"../evil.txt"};
    const void *contents[] = {"x"};
    size_t sizes[] = {1};
    CHECK_ERROR(nereid_server_load_model(s, "plain", "{}", paths, contents, sizes, 1),
                NEREID_ERROR_INVALID_ARG, "invalid file path");
    CHECK(try_infer(s, "plain") == NULL);
}

static void test_load_unload(nereid_server_t *s)
{
    CHECK(nereid_server_load_model(s, "other", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(try_infer(s, "other") == NULL);
    CHECK(nereid_server_unload_model(s, "other", false) == NULL);
    json_t *row = index_row(s, "other", "1");
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    CHECK(strcmp(row_str(row, "reason"), "unloaded") == 0);
    json_decref(row);
    CHECK_STR_CONTAINS(try_infer(s, "other"),
                       "Request for unknown model: 'other' has no available versions");
    CHECK_STR_CONTAINS(try_infer_version(s, "other", 1),
                       "Request for unknown model: 'other' version 1 is not at ready state");
    /* Unloaded models do not make the server unready (the failed 'empty'
     * did, until it is unloaded). */
    CHECK(!nereid_server_is_ready(s));
    CHECK(nereid_server_unload_model(s, "empty", false) == NULL);
    CHECK(nereid_server_is_ready(s));
    char *text = NULL;
    CHECK(nereid_server_repository_index(s, true, &text) == NULL);
    CHECK(text && !strstr(text, "\"other\""));
    free(text);
    /* Unloading something not loaded is fine. */
    CHECK(nereid_server_unload_model(s, "empty", false) == NULL);
}

static void test_ensemble_loads_steps(nereid_server_t *s)
{
    CHECK(nereid_server_load_model(s, "ens", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(try_infer(s, "ens") == NULL);
    json_t *row = index_row(s, "other", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);
    /* Without unload_dependents the composing model stays. */
    CHECK(nereid_server_unload_model(s, "ens", false) == NULL);
    CHECK(try_infer(s, "other") == NULL);
    CHECK(nereid_server_load_model(s, "ens", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(nereid_server_unload_model(s, "ens", true) == NULL);
    row = index_row(s, "other", "1");
    CHECK(strcmp(row_str(row, "state"), "UNAVAILABLE") == 0);
    json_decref(row);
    CHECK(try_infer(s, "other") != NULL);
}

static void test_overrides(nereid_server_t *s)
{
    /* Config override: the served config is the override. */
    const char *failing =
        "{\"backend\":\"testing\",\"max_batch_size\":8,"
        "\"parameters\":{\"fail_execute\":{\"string_value\":\"true\"}},"
        "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
        "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}]}";
    CHECK(nereid_server_load_model(s, "plain", failing, NULL, NULL, NULL, 0) == NULL);
    CHECK_STR_CONTAINS(try_infer(s, "plain"), "testing backend: execute failed");
    char *cfg = NULL;
    CHECK(nereid_server_model_config(s, "plain", 0, &cfg) == NULL);
    CHECK_STR_CONTAINS(cfg, "fail_execute");
    free(cfg);
    /* As in Triton, a load without a config keeps the override while the
     * model's files are unchanged since it (L0_lifecycle
     * test_model_config_overwite)... */
    CHECK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK_STR_CONTAINS(try_infer(s, "plain"), "testing backend: execute failed");
    /* ... and reloads from the repository's config.pbtxt once it is written again. */
    write_model("plain", testing_cfg);
    CHECK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(try_infer(s, "plain") == NULL);
    /* Loading it again unchanged keeps the loaded version (and its stats). */
    CHECK(stat_value(s, "plain", 1, "execution_count", NULL) == 1);
    CHECK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0) == NULL);
    CHECK(stat_value(s, "plain", 1, "execution_count", NULL) == 1);
    /* A bad override: error, the old version keeps serving. */
    CHECK_ERROR(
        nereid_server_load_model(s, "plain", "{\"max_batch_size\":\"x\"", NULL, NULL, NULL, 0),
        NEREID_ERROR_INVALID_ARG, "");
    CHECK(try_infer(s, "plain") == NULL);
    /* A failing reload keeps the old version serving and says why. */
    const char *init_fails =
        "{\"backend\":\"testing\",\"max_batch_size\":8,"
        "\"parameters\":{\"fail_model_init\":{\"string_value\":\"true\"}},"
        "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
        "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}]}";
    CHECK_ERROR(nereid_server_load_model(s, "plain", init_fails, NULL, NULL, NULL, 0),
                NEREID_ERROR_INVALID_ARG,
                "load failed for model 'plain': version 1 is at UNAVAILABLE state: Internal: "
                "testing backend: model init failed;");
    CHECK(try_infer(s, "plain") == NULL);
    json_t *row = index_row(s, "plain", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    CHECK_STR_CONTAINS(row_str(row, "reason"), "model init failed");
    json_decref(row);

    /* File overrides: a temporary model directory with only these files. */
    const char *labels_cfg =
        "{\"backend\":\"testing\",\"max_batch_size\":8,"
        "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
        "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2],"
        "\"label_filename\":\"labels.txt\"}]}";
    const char *paths[] = {"labels.txt", "3/weights.bin"};
    const void *contents[] = {"cat\ndog\n", "\1\2"};
    size_t sizes[] = {8, 2};
    CHECK(nereid_server_load_model(s, "other", labels_cfg, paths, contents, sizes, 2) == NULL);
    /* Versions come from the override files (3), not the repository (1). */
    row = index_row(s, "other", "3");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);
    nereid_response_t *resp;
    nereid_error_t *err = infer_x(s, "other", 3, &resp);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (resp) {
        char *bytes;
        size_t n, rank;
        int64_t shape[2];
        CHECK(nereid_response_classify(resp, 0, 1, &bytes, &n, shape, &rank) == NULL);
        CHECK(n > 4 && memmem(bytes, n, "dog", 3) != NULL);
        free(bytes);
        nereid_response_free(resp);
    }
    /* Without the label file the same config fails to load. */
    CHECK_ERROR(
        nereid_server_load_model(s, "other", labels_cfg, paths + 1, contents + 1, sizes + 1, 1),
        NEREID_ERROR_INVALID_ARG, "label file");
    CHECK(nereid_server_unload_model(s, "other", false) == NULL);
}

/* ---- Continuous load ---- */

typedef struct load_gen {
    nereid_server_t *s;
    const char *model;
    _Atomic bool stop;
    _Atomic int ok, submit_failed, resp_failed, inflight;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    char last_error[256];
} load_gen_t;

static void gen_done(nereid_response_t *resp, void *userp)
{
    load_gen_t *g = userp;
    const nereid_error_t *e = nereid_response_error(resp);
    if (e) {
        atomic_fetch_add(&g->resp_failed, 1);
        pthread_mutex_lock(&g->lock);
        snprintf(g->last_error, sizeof g->last_error, "%s", nereid_error_message(e));
        pthread_mutex_unlock(&g->lock);
    } else {
        atomic_fetch_add(&g->ok, 1);
    }
    nereid_response_free(resp);
    pthread_mutex_lock(&g->lock);
    atomic_fetch_sub(&g->inflight, 1);
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void *gen_main(void *arg)
{
    load_gen_t *g = arg;
    static const float x[2] = {1, 2};
    static const int64_t shape[2] = {1, 2};
    while (!atomic_load(&g->stop)) {
        pthread_mutex_lock(&g->lock);
        while (atomic_load(&g->inflight) >= 8)
            pthread_cond_wait(&g->cond, &g->lock);
        pthread_mutex_unlock(&g->lock);
        nereid_request_t *req;
        nereid_request_new(g->s, g->model, 0, &req);
        nereid_request_add_input(req, "INPUT0", NEREID_TYPE_FP32, shape, 2, x, 8);
        atomic_fetch_add(&g->inflight, 1);
        nereid_error_t *err = nereid_server_infer_async(g->s, req, NULL, gen_done, g);
        if (err) {
            atomic_fetch_sub(&g->inflight, 1);
            atomic_fetch_add(&g->submit_failed, 1);
            pthread_mutex_lock(&g->lock);
            snprintf(g->last_error, sizeof g->last_error, "%s", nereid_error_message(err));
            pthread_mutex_unlock(&g->lock);
            nereid_error_free(err);
            nereid_request_free(req);
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    pthread_mutex_lock(&g->lock);
    while (atomic_load(&g->inflight) > 0)
        pthread_cond_wait(&g->cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

static void test_reload_under_load(nereid_server_t *s)
{
    CHECK(nereid_server_load_model(s, "slow", NULL, NULL, NULL, NULL, 0) == NULL);
    load_gen_t g = {.s = s, .model = "slow"};
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.cond, NULL);
    pthread_t t;
    pthread_create(&t, NULL, gen_main, &g);
    const char *delays[] = {"3", "7"};
    for (int i = 0; i < 6; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"backend\":\"testing\",\"max_batch_size\":8,"
                 "\"instance_group\":[{\"count\":2,\"kind\":\"KIND_CPU\"}],"
                 "\"parameters\":{\"execute_delay_ms\":{\"string_value\":\"%s\"}},"
                 "\"input\":[{\"name\":\"INPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}],"
                 "\"output\":[{\"name\":\"OUTPUT0\",\"data_type\":\"TYPE_FP32\",\"dims\":[2]}]}",
                 delays[i % 2]);
        CHECK(nereid_server_load_model(s, "slow", cfg, NULL, NULL, NULL, 0) == NULL);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    int before_unload = atomic_load(&g.ok);
    atomic_store(&g.stop, true);
    pthread_join(t, NULL);
    printf("reloads under load: %d ok, %d submit failures, %d response failures\n",
           atomic_load(&g.ok), atomic_load(&g.submit_failed), atomic_load(&g.resp_failed));
    CHECK(before_unload > 10);
    CHECK(atomic_load(&g.submit_failed) == 0);
    CHECK(atomic_load(&g.resp_failed) == 0);
    if (g.last_error[0]) fprintf(stderr, "last error: %s\n", g.last_error);

    /* Unload while requests are queued: every accepted request succeeds. */
    load_gen_t u = {.s = s, .model = "slow"};
    pthread_mutex_init(&u.lock, NULL);
    pthread_cond_init(&u.cond, NULL);
    pthread_create(&t, NULL, gen_main, &u);
    while (atomic_load(&u.ok) < 10) {
        struct timespec ts = {0, 2 * 1000000L};
        nanosleep(&ts, NULL);
    }
    CHECK(nereid_server_unload_model(s, "slow", false) == NULL);
    atomic_store(&u.stop, true);
    pthread_join(t, NULL);
    printf("unload under load: %d ok, %d rejected at submission, %d response failures\n",
           atomic_load(&u.ok), atomic_load(&u.submit_failed), atomic_load(&u.resp_failed));
    CHECK(atomic_load(&u.resp_failed) == 0);
    pthread_mutex_destroy(&g.lock);
    pthread_cond_destroy(&g.cond);
    pthread_mutex_destroy(&u.lock);
    pthread_cond_destroy(&u.cond);
}

/* A model without config.pbtxt: its backend is guessed in one place,
 * config_normalize (Triton's AutoCompleteBackendFields), from the first
 * version directory by name: version 1's model.plan says TensorRT, although
 * version 2 (the one loaded) has a model.onnx. */
static void test_backend_guessed(nereid_server_t *s)
{
    write_file("guessed/1/model.plan", "");
    write_file("guessed/2/model.onnx", "");
    nereid_error_t *err = nereid_server_load_model(s, "guessed", NULL, NULL, NULL, NULL, 0);
    CHECK(err != NULL);
    CHECK_STR_CONTAINS(err ? nereid_error_message(err) : NULL,
                       "unable to find backend library for backend 'tensorrt'");
    nereid_error_free(err);
}

static void test_explicit(void)
{
    make_models();
    const char *load[] = {"plain"};
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 1, 0, true, &err);
    CHECK(err == NULL && s);
    if (!s) {
        fprintf(stderr, "%s\n", nereid_error_message(err));
        return;
    }
    test_startup_index(s);
    test_names(s);
    test_load_unload(s);
    test_ensemble_loads_steps(s);
    test_overrides(s);
    test_reload_under_load(s);
    test_backend_guessed(s);
    nereid_server_free(s);
    if (!remove_repo()) abort();
}

/* ---- Loads in parallel (repository_index.c, claims) ---- */

typedef struct control_call {
    nereid_server_t *s;
    const char *model;
    bool unload;
    nereid_error_t *err;
    _Atomic bool done;
} control_call_t;

static void *control_call_main(void *arg)
{
    control_call_t *c = arg;
    if (c->unload)
        c->err = nereid_server_unload_model(c->s, c->model, false);
    else
        c->err = nereid_server_load_model(c->s, c->model, NULL, NULL, NULL, NULL, 0);
    atomic_store(&c->done, true);
    return NULL;
}

/* Waits (up to 10 s) until model's index row says state. */
static bool wait_state(nereid_server_t *s, const char *model, const char *state)
{
    for (int i = 0; i < 10000; i++) {
        json_t *row = index_row(s, model, NULL);
        bool same = strcmp(row_str(row, "state"), state) == 0;
        if (row) json_decref(row);
        if (same) return true;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return false;
}

/* While a model initializes, other models load and unload; a second load
 * and an unload of the initializing model wait for its load to end. With a
 * single control lock held across init, the other load waited for the gate
 * (30 s, the testing backend's bound): "plain" would come after "gate". */
static void test_parallel_loads(void)
{
    make_repo_dir("parallel");
    char go[300];
    snprintf(go, sizeof go, "%s/go", repo);
    char cfg[800];
    snprintf(cfg, sizeof cfg,
             "backend: \"testing\" max_batch_size: 8\n"
             "parameters { key: \"model_init_wait_for_file\" value { string_value: \"%s\" } }\n"
             "input [ { name: \"INPUT0\" " F2 " } ]\n"
             "output [ { name: \"OUTPUT0\" " F2 " } ]\n",
             go);
    write_model("gate", cfg);
    write_model("gate2", cfg);
    write_model("plain", testing_cfg);
    write_model("other", testing_cfg);
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    if (!s) return;
    control_call_t first = {.s = s, .model = "gate"}, second = {.s = s, .model = "gate"},
                   unload = {.s = s, .model = "gate", .unload = true};
    pthread_t t1, t2, t3;
    pthread_create(&t1, NULL, control_call_main, &first);
    CHECK(wait_state(s, "gate", "LOADING"));
    /* Unrelated models load and unload meanwhile. */
    CHECK_OK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0));
    CHECK(try_infer(s, "plain") == NULL);
    CHECK_OK(nereid_server_load_model(s, "other", NULL, NULL, NULL, NULL, 0));
    CHECK_OK(nereid_server_unload_model(s, "other", false));
    CHECK(!atomic_load(&first.done));
    /* The same model: both wait for the first load. */
    pthread_create(&t2, NULL, control_call_main, &second);
    pthread_create(&t3, NULL, control_call_main, &unload);
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    CHECK(!atomic_load(&second.done) && !atomic_load(&unload.done));
    write_file("go", "");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_join(t3, NULL);
    CHECK_OK(first.err);
    CHECK_OK(second.err);
    CHECK_OK(unload.err);
    /* The unload and the second load ran in some order after the first. */
    json_t *row = index_row(s, "gate", NULL);
    const char *state = row_str(row, "state");
    CHECK(strcmp(state, "READY") == 0 || strcmp(state, "UNAVAILABLE") == 0);
    if (row) json_decref(row);
    /* An unload that does not wait for the drain: out of service at once,
     * UNAVAILABLE once drained; a load of it meanwhile waits for the drain. */
    CHECK_OK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0));
    CHECK_OK(nereid_server_unload_model_async(s, "plain", false));
    row = index_row(s, "plain", NULL);
    CHECK(strcmp(row_str(row, "state"), "READY") != 0);
    if (row) json_decref(row);
    CHECK(try_infer(s, "plain") != NULL);
    CHECK(wait_state(s, "plain", "UNAVAILABLE"));
    CHECK_OK(nereid_server_unload_model_async(s, "plain", false)); /* twice: nothing to do */
    CHECK_OK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0));
    CHECK_OK(nereid_server_unload_model_async(s, "plain", false));
    CHECK_OK(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0));
    CHECK(try_infer(s, "plain") == NULL);
    CHECK_OK(nereid_server_unload_model_async(s, "plain", false)); /* the stop waits for it */
    /* A load under way when the server stops: the stop waits for it. */
    remove_path("go");
    control_call_t last = {.s = s, .model = "gate2"};
    pthread_t t4;
    pthread_create(&t4, NULL, control_call_main, &last);
    CHECK(wait_state(s, "gate2", "LOADING"));
    write_file("go", "");
    nereid_server_free(s);
    pthread_join(t4, NULL);
    if (last.err) nereid_error_free(last.err);
    if (!remove_repo()) abort();
}

/* ---- Modes ---- */

static void test_not_explicit(void)
{
    make_models();
    remove_path("empty");
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    if (!s) return;
    CHECK_ERROR(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled");
    CHECK_ERROR(nereid_server_unload_model(s, "plain", false), NEREID_ERROR_UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled");
    /* Mode none loads everything, ensembles after their steps. */
    CHECK(try_infer(s, "ens") == NULL);
    nereid_server_free(s);
    if (!remove_repo()) abort();
}

static void test_load_star(void)
{
    make_models();
    remove_path("empty");
    const char *load[] = {"*"};
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 1, 0, true, &err);
    CHECK(err == NULL && s);
    if (!s) return;
    CHECK(try_infer(s, "ens") == NULL);
    CHECK(try_infer(s, "other") == NULL);
    nereid_server_free(s);
    if (!remove_repo()) abort();
}

static void test_poll(void)
{
    make_models();
    remove_path("empty");
    remove_path("ens");
    nereid_error_t *err;
    /* A long period: the test drives the passes itself. */
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_POLL, NULL, 0, 3600, true, &err);
    CHECK(err == NULL && s);
    if (!s) return;
    CHECK_ERROR(nereid_server_load_model(s, "plain", NULL, NULL, NULL, NULL, 0),
                NEREID_ERROR_UNAVAILABLE, "not allowed if polling is enabled");
    nereid_response_t *resp;

    /* A new version directory becomes the served (latest) version. */
    write_file("plain/2/.keep", "");
    repository_poll(s);
    CHECK(infer_x(s, "plain", 0, &resp) == NULL && resp);
    if (resp) {
        CHECK(nereid_response_model_version(resp) == 2);
        nereid_response_free(resp);
    }
    json_t *row = index_row(s, "plain", "2");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    json_decref(row);

    /* Removing it goes back to version 1. */
    remove_path("plain/2");
    repository_poll(s);
    CHECK(infer_x(s, "plain", 0, &resp) == NULL && resp);
    if (resp) {
        CHECK(nereid_response_model_version(resp) == 1);
        nereid_response_free(resp);
    }

    /* A config change is picked up. */
    write_file("plain/config.pbtxt",
               "backend: \"testing\" max_batch_size: 8\n"
               "parameters { key: \"fail_execute\" value { string_value: \"true\" } }\n"
               "input [ { name: \"INPUT0\" " F2 " } ]\n"
               "output [ { name: \"OUTPUT0\" " F2 " } ]\n");
    repository_poll(s);
    CHECK_STR_CONTAINS(try_infer(s, "plain"), "execute failed");

    /* A broken change keeps the old version serving and reports why. */
    write_file("plain/config.pbtxt", "backend: \"testing\" max_batch_size: oops\n");
    repository_poll(s);
    CHECK_STR_CONTAINS(try_infer(s, "plain"), "execute failed");
    row = index_row(s, "plain", "1");
    CHECK(strcmp(row_str(row, "state"), "READY") == 0);
    CHECK_STR_CONTAINS(row_str(row, "reason"), "Invalid argument");
    json_decref(row);

    /* Fixed again. */
    write_file("plain/config.pbtxt", testing_cfg);
    repository_poll(s);
    CHECK(try_infer(s, "plain") == NULL);
    row = index_row(s, "plain", "1");
    CHECK(row && !json_object_get(row, "reason"));
    json_decref(row);

    /* Models added and removed. */
    write_model("added", testing_cfg);
    repository_poll(s);
    CHECK(try_infer(s, "added") == NULL);
    remove_path("other");
    repository_poll(s);
    /* Triton keeps a removed model in its lifecycle, unloaded (L0_lifecycle
     * test_dynamic_model_load_unload); the index lists only what is on disk. */
    CHECK_STR_CONTAINS(try_infer(s, "other"),
                       "Request for unknown model: 'other' has no available versions");
    row = index_row(s, "other", NULL);
    CHECK(row == NULL);
    json_decref(row);
    /* Nothing changed: the served model is kept (its statistics too). */
    long long execs = stat_value(s, "added", 1, "execution_count", NULL);
    CHECK(execs == 1);
    repository_poll(s);
    CHECK(stat_value(s, "added", 1, "execution_count", NULL) == execs);
    nereid_server_free(s);
    if (!remove_repo()) abort();
}

static void test_poll_thread(void)
{
    make_models();
    remove_path("empty");
    remove_path("ens");
    nereid_error_t *err;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_POLL, NULL, 0, 1, true, &err);
    CHECK(err == NULL && s);
    if (!s) return;
    write_model("late", testing_cfg);
    /* The poll thread (1 s period) finds it; wait up to 10 s. */
    const char *r = "not yet";
    for (int i = 0; i < 200 && r; i++) {
        r = try_infer(s, "late");
        if (r) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    CHECK(r == NULL);
    nereid_server_free(s);
    if (!remove_repo()) abort();
}

int main(void)
{
    test_explicit();
    test_parallel_loads();
    test_not_explicit();
    test_load_star();
    test_poll();
    test_poll_thread();
    return check_summary();
}
