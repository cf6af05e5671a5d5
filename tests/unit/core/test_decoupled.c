/*
 * This file contains the tests of decoupled responses through the in-process
 * API (nereid_server_infer_stream) with the repeat backend: N, one and no
 * responses with their final flag, responses sent after execute returned,
 * several streams at once from threads (the ThreadSanitizer build runs this
 * too), a one-response client on a decoupled model, the transaction-policy
 * query, an unload while responses are still being sent, and response_stats
 * per index.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"

#define MAX_RESP 16

static const char *repeat_config = "name: \"%s\"\nbackend: \"repeat\"\nmax_batch_size: 0\n"
                                   "model_transaction_policy { decoupled: %s }\n"
                                   "input [ { name: \"IN\" data_type: TYPE_INT32 dims: [ -1 ] },\n"
                                   "  { name: \"DELAY\" data_type: TYPE_UINT32 dims: [ -1 ] },\n"
                                   "  { name: \"WAIT\" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n"
                                   "output [ { name: \"OUT\" data_type: TYPE_INT32 dims: [ 1 ] },\n"
                                   "  { name: \"IDX\" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n";

/* Everything one streamed request produced. */
typedef struct collector {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;                 /* responses (non-NULL) */
    int32_t out[MAX_RESP]; /* OUT of each */
    uint32_t idx[MAX_RESP];
    int errors;
    char error[256];
    int finals;           /* calls with NEREID_RESPONSE_FINAL */
    bool final_null;      /* the final call had no response */
    bool order_ok;        /* nothing after the final */
    int32_t in[MAX_RESP]; /* the request's inputs, alive until the final */
    uint32_t delay[MAX_RESP], wait;
    int error_code;               /* of the last error response */
    nereid_cancel_token_t *token; /* attached to the request when set */
} collector_t;

static void collector_init(collector_t *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    c->order_ok = true;
}

static void collector_destroy(collector_t *c)
{
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
}

static void on_response(nereid_response_t *resp, uint32_t flags, void *userp)
{
    collector_t *c = userp;
    pthread_mutex_lock(&c->lock);
    if (c->finals) c->order_ok = false;
    if (resp) {
        const nereid_error_t *e = nereid_response_error(resp);
        if (e) {
            c->errors++;
            c->error_code = (int)nereid_error_code(e);
            snprintf(c->error, sizeof c->error, "%s", nereid_error_message(e));
        } else if (c->n < MAX_RESP) {
            const void *d;
            if (find_output(resp, "OUT", NULL, NULL, NULL, &d, NULL)) memcpy(&c->out[c->n], d, 4);
            if (find_output(resp, "IDX", NULL, NULL, NULL, &d, NULL)) memcpy(&c->idx[c->n], d, 4);
            c->n++;
        }
        nereid_response_free(resp);
    }
    if (flags & NEREID_RESPONSE_FINAL) {
        c->finals++;
        c->final_null = resp == NULL;
    }
    pthread_cond_broadcast(&c->cond); /* collector_wait_n waits for any response */
    pthread_mutex_unlock(&c->lock);
}

static void collector_wait(collector_t *c)
{
    pthread_mutex_lock(&c->lock);
    while (!c->finals)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* Submits IN = base, base+1, ... (n elements) with DELAY delay_ms each. */
static nereid_error_t *submit(nereid_server_t *s, const char *model, collector_t *c, int n,
                              int32_t base, uint32_t delay_ms, uint32_t wait_ms)
{
    for (int i = 0; i < n; i++) {
        c->in[i] = base + i;
        if (delay_ms != UINT32_MAX) c->delay[i] = delay_ms; /* else the caller's */
    }
    c->wait = wait_ms;
    tensor_t in[3] = {
        {"IN", NEREID_TYPE_INT32, {n}, 1, c->in, (size_t)n * 4},
        {"DELAY", NEREID_TYPE_UINT32, {n}, 1, c->delay, (size_t)n * 4},
        {"WAIT", NEREID_TYPE_UINT32, {1}, 1, &c->wait, 4},
    };
    nereid_request_t *req;
    nereid_error_t *err = request_with_inputs(s, model, in, 3, &req);
    if (err) return err;
    if (c->token) nereid_request_set_cancel_token(req, c->token);
    err = nereid_server_infer_stream(s, req, NULL, on_response, c);
    if (err) nereid_request_free(req);
    return err;
}

static void test_counts(nereid_server_t *s)
{
    int counts[] = {0, 1, 5};
    for (size_t k = 0; k < 3; k++) {
        collector_t c;
        collector_init(&c);
        nereid_error_t *err = submit(s, "rep", &c, counts[k], 100, 1, 0);
        CHECK(err == NULL);
        nereid_error_free(err);
        collector_wait(&c);
        CHECK_MSG(c.n == counts[k], "%d responses for %d elements", c.n, counts[k]);
        for (int i = 0; i < c.n; i++)
            CHECK(c.out[i] == 100 + i && c.idx[i] == (uint32_t)i);
        CHECK(c.finals == 1 && c.final_null && c.errors == 0 && c.order_ok);
        collector_destroy(&c);
    }
}

static void test_model_not_decoupled(nereid_server_t *s)
{
    collector_t c;
    collector_init(&c);
    nereid_error_t *err = submit(s, "rep_coupled", &c, 1, 7, 0, 0);
    CHECK(err == NULL);
    nereid_error_free(err);
    collector_wait(&c);
    /* one call: the response together with the final flag */
    CHECK(c.n == 1 && c.out[0] == 7 && c.finals == 1 && !c.final_null);
    collector_destroy(&c);
}

/* nereid_server_infer_async on a decoupled model: one response only. */
static void test_one_response_client(nereid_server_t *s)
{
    int32_t in[2] = {3, 4};
    uint32_t delay[2] = {0, 0}, wait = 0;
    for (int n = 1; n <= 2; n++) {
        tensor_t t[3] = {
            {"IN", NEREID_TYPE_INT32, {n}, 1, in, (size_t)n * 4},
            {"DELAY", NEREID_TYPE_UINT32, {n}, 1, delay, (size_t)n * 4},
            {"WAIT", NEREID_TYPE_UINT32, {1}, 1, &wait, 4},
        };
        nereid_request_t *req;
        nereid_error_t *err = request_with_inputs(s, "rep", t, 3, &req);
        CHECK(err == NULL);
        nereid_response_t *resp = infer_sync(s, req, &err);
        CHECK(err == NULL && resp);
        nereid_error_free(err);
        if (!resp) continue;
        if (n == 1) {
            const void *d;
            CHECK(nereid_response_error(resp) == NULL);
            CHECK(find_output(resp, "OUT", NULL, NULL, NULL, &d, NULL) && *(const int32_t *)d == 3);
        } else {
            CHECK(nereid_response_error(resp) != NULL);
            if (nereid_response_error(resp))
                CHECK_STR(nereid_error_message(nereid_response_error(resp)),
                          "this request to decoupled model 'rep' accepts one response only");
        }
        nereid_response_free(resp);
    }
}

static void test_policy_query(nereid_server_t *s)
{
    bool d = false;
    nereid_error_t *err = nereid_server_model_decoupled(s, "rep", -1, &d);
    CHECK(err == NULL && d);
    nereid_error_free(err);
    err = nereid_server_model_decoupled(s, "rep_coupled", -1, &d);
    CHECK(err == NULL && !d);
    nereid_error_free(err);
    CHECK_ERROR(nereid_server_model_decoupled(s, "nope", -1, &d), NEREID_ERROR_NOT_FOUND, "nope");
}

#define N_THREADS 4
#define PER_THREAD 6

static void *stream_worker(void *arg)
{
    nereid_server_t *s = arg;
    for (int r = 0; r < PER_THREAD; r++) {
        collector_t c;
        collector_init(&c);
        int n = r % 4;
        nereid_error_t *err = submit(s, "rep", &c, n, r * 10, 0, 0);
        CHECK(err == NULL);
        nereid_error_free(err);
        collector_wait(&c);
        CHECK(c.n == n && c.finals == 1 && c.order_ok);
        for (int i = 0; i < c.n; i++)
            CHECK(c.out[i] == r * 10 + i);
        collector_destroy(&c);
    }
    return NULL;
}

static void test_threads(nereid_server_t *s)
{
    pthread_t t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&t[i], NULL, stream_worker, s);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
}

static void test_stats(nereid_server_t *s)
{
    json_t *st = model_stats_json(s, "rep", 1);
    CHECK(st != NULL);
    json_t *rs = json_object_get(st, "response_stats");
    /* the largest request above had 5 elements: indexes 0..4 */
    CHECK(json_object_size(rs) == 5);
    json_t *r4 = json_object_get(rs, "4");
    CHECK(r4 && json_integer_value(json_object_get(json_object_get(r4, "success"), "count")) == 1);
    json_decref(st);
}

/* Waits until c has at least n responses. */
static void collector_wait_n(collector_t *c, int n)
{
    pthread_mutex_lock(&c->lock);
    while (c->n < n && !c->finals)
        pthread_cond_wait(&c->cond, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* The client cancels after the first response: the repeat backend stops
 * (nereid_sender_is_cancelled) and ends with a CANCELLED final response,
 * counted under "cancel" and as a CANCELED failure. */
static void test_cancel_mid_stream(nereid_server_t *s)
{
    json_t *before = model_stats_json(s, "rep", 1);
    json_int_t fails0 = json_integer_value(json_object_get(
        json_object_get(json_object_get(before, "inference_stats"), "fail"), "count"));
    json_decref(before);
    collector_t c;
    collector_init(&c);
    c.token = nereid_cancel_token_new();
    /* the first response at once, the others a minute later each */
    c.delay[0] = 0;
    c.delay[1] = c.delay[2] = c.delay[3] = 60000;
    nereid_error_t *err = submit(s, "rep", &c, 4, 50, UINT32_MAX, 0);
    CHECK(err == NULL);
    nereid_error_free(err);
    collector_wait_n(&c, 1);
    nereid_request_cancel(c.token);
    collector_wait(&c);
    CHECK_MSG(c.n == 1, "%d responses", c.n);
    CHECK(c.errors == 1 && c.error_code == NEREID_ERROR_CANCELLED && c.finals == 1 &&
          !c.final_null && c.order_ok);
    json_t *st = model_stats_json(s, "rep", 1);
    json_t *r1 = json_object_get(json_object_get(st, "response_stats"), "1");
    CHECK(json_integer_value(json_object_get(json_object_get(r1, "cancel"), "count")) == 1);
    json_int_t fails = json_integer_value(
        json_object_get(json_object_get(json_object_get(st, "inference_stats"), "fail"), "count"));
    CHECK(fails == fails0 + 1);
    json_decref(st);
    nereid_cancel_token_free(c.token);
    collector_destroy(&c);
}

/* An unload while a request still sends: the instance waits for its thread,
 * every response arrives, the final last. */
static void test_unload_while_sending(void)
{
    const char *load[1] = {"rep"};
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_EXPLICIT, load, 1, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (!s) return;
    collector_t c;
    collector_init(&c);
    err = submit(s, "rep", &c, 4, 1, 30, 0);
    CHECK(err == NULL);
    nereid_error_free(err);
    err = nereid_server_unload_model(s, "rep", false);
    CHECK(err == NULL);
    nereid_error_free(err);
    collector_wait(&c);
    CHECK(c.n == 4 && c.finals == 1 && c.order_ok);
    collector_destroy(&c);
    nereid_server_free(s);
}

int main(void)
{
    make_repo_dir("decoupled");
    char config[2048];
    snprintf(config, sizeof config, repeat_config, "rep", "true");
    write_model("rep", config);
    snprintf(config, sizeof config, repeat_config, "rep_coupled", "false");
    write_model("rep_coupled", config);
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    if (s) {
        test_counts(s);
        test_model_not_decoupled(s);
        test_one_response_client(s);
        test_policy_query(s);
        test_threads(s);
        test_stats(s);
        test_cancel_mid_stream(s);
        nereid_server_free(s);
    }
    test_unload_while_sending();
    remove_repo();
    return check_summary();
}
