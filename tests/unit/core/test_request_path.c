/*
 * This file contains the tests of the per-request path's storage and
 * hand-off: requests and responses larger than their inline storage (more
 * inputs and outputs than the inline slots, names and ids longer than the
 * arenas, outputs larger than the response arena) come back intact, and
 * bursts from several threads on a two-instance model all complete, with
 * the instances' idle spin on (default) and off (NEREID_SPIN_US=0).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"

#define N_IO 6
#define BIG 1000 /* elements of the last input: 4000 bytes, over any arena */

static char in_names[N_IO][80], out_names[N_IO][80];
static float data[N_IO][BIG];

static size_t elems(int i)
{
    return i == N_IO - 1 ? BIG : 4;
}

static void write_wide_model(void)
{
    char config[8192];
    size_t n = (size_t)snprintf(config, sizeof config,
                                "name: \"wide\"\nbackend: \"identity\"\nmax_batch_size: 0\n"
                                "instance_group [ { count: 2 kind: KIND_CPU } ]\ninput [\n");
    for (int i = 0; i < N_IO; i++)
        n += (size_t)snprintf(config + n, sizeof config - n,
                              "  { name: \"%s\" data_type: TYPE_FP32 dims: [ -1 ] }%s\n",
                              in_names[i], i < N_IO - 1 ? "," : "");
    n += (size_t)snprintf(config + n, sizeof config - n, "]\noutput [\n");
    for (int i = 0; i < N_IO; i++)
        n += (size_t)snprintf(config + n, sizeof config - n,
                              "  { name: \"%s\" data_type: TYPE_FP32 dims: [ -1 ] }%s\n",
                              out_names[i], i < N_IO - 1 ? "," : "");
    snprintf(config + n, sizeof config - n, "]\n");
    write_model("wide", config);
}

static nereid_request_t *wide_request(nereid_server_t *s, const char *id, int n_requested)
{
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(s, "wide", -1, &req);
    for (int i = 0; !err && i < N_IO; i++) {
        int64_t shape[1] = {(int64_t)elems(i)};
        err = nereid_request_add_input(req, in_names[i], NEREID_TYPE_FP32, shape, 1, data[i],
                                       elems(i) * sizeof(float));
    }
    for (int i = 0; !err && i < n_requested; i++)
        err = nereid_request_add_requested_output(req, out_names[i], 0);
    if (!err && id) err = nereid_request_set_id(req, id);
    CHECK(err == NULL);
    nereid_error_free(err);
    return req;
}

/* Every output of resp that is present matches its input; returns how many. */
static int check_outputs(const nereid_response_t *resp)
{
    int found = 0;
    for (int i = 0; i < N_IO; i++) {
        const void *d;
        size_t size;
        const int64_t *shape;
        size_t rank;
        if (!find_output(resp, out_names[i], NULL, &shape, &rank, &d, &size)) continue;
        found++;
        CHECK(size == elems(i) * sizeof(float) && rank == 1 && shape[0] == (int64_t)elems(i));
        CHECK(size == elems(i) * sizeof(float) && memcmp(d, data[i], size) == 0);
    }
    return found;
}

static void test_beyond_inline(nereid_server_t *s)
{
    char id[501];
    memset(id, 'q', sizeof id - 1);
    id[sizeof id - 1] = 0;
    nereid_error_t *err = NULL;
    nereid_response_t *resp = infer_sync(s, wide_request(s, id, 5), &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (resp) {
        CHECK(strcmp(nereid_response_id(resp), id) == 0);
        CHECK(strcmp(nereid_response_model_name(resp), "wide") == 0);
        CHECK(nereid_response_output_count(resp) == 5);
        CHECK(check_outputs(resp) == 5);
        nereid_response_free(resp);
    }
    resp = infer_sync(s, wide_request(s, NULL, 0), &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    if (resp) {
        CHECK(strcmp(nereid_response_id(resp), "") == 0);
        CHECK(nereid_response_output_count(resp) == N_IO);
        CHECK(check_outputs(resp) == N_IO);
        nereid_response_free(resp);
    }
    /* A request that is never submitted frees its heap fallbacks too. */
    nereid_request_free(wide_request(s, id, 6));
    nereid_error_free(err);
}

typedef struct burst_arg {
    nereid_server_t *s;
    int rounds, per_round, failed, wrong;
} burst_arg_t;

static void *burst_main(void *p)
{
    burst_arg_t *a = p;
    for (int r = 0; r < a->rounds; r++) {
        waiter_t w;
        waiter_init(&w);
        int submitted = 0;
        for (int k = 0; k < a->per_round; k++) {
            nereid_request_t *req = wide_request(a->s, "burst", 1);
            nereid_error_t *err = nereid_server_infer_async(a->s, req, NULL, waiter_on_done, &w);
            if (err) {
                a->failed++;
                nereid_error_free(err);
                nereid_request_free(req);
                continue;
            }
            submitted++;
        }
        waiter_wait(&w, submitted);
        a->failed += w.failed;
        if (w.resp && check_outputs(w.resp) != 1) a->wrong++;
        nereid_response_free(w.resp);
        waiter_destroy(&w);
    }
    return NULL;
}

static void test_bursts(nereid_server_t *s)
{
    burst_arg_t args[4];
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (burst_arg_t){.s = s, .rounds = 50, .per_round = 1 + t * 3};
        pthread_create(&th[t], NULL, burst_main, &args[t]);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECK(args[t].failed == 0);
        CHECK(args[t].wrong == 0);
    }
}

int main(void)
{
    for (int i = 0; i < N_IO; i++) {
        snprintf(in_names[i], sizeof in_names[i], "input_tensor_with_a_rather_long_name_%d", i);
        snprintf(out_names[i], sizeof out_names[i], "output_tensor_with_a_rather_long_name_%d", i);
        for (size_t k = 0; k < BIG; k++)
            data[i][k] = (float)(i * 1000 + (int)k);
    }
    make_repo_dir("request-path");
    write_wide_model();
    const char *spin[2] = {NULL, "0"};
    for (int v = 0; v < 2; v++) {
        if (spin[v])
            setenv("NEREID_SPIN_US", spin[v], 1);
        else
            unsetenv("NEREID_SPIN_US");
        nereid_error_t *err = NULL;
        nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
        CHECK(err == NULL && s);
        nereid_error_free(err);
        if (!s) break;
        test_beyond_inline(s);
        test_bursts(s);
        nereid_server_free(s);
    }
    unsetenv("NEREID_SPIN_US");
    remove_repo();
    return check_summary();
}
