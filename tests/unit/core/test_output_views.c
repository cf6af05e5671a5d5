/*
 * This file contains the tests of outputs a backend hands over in its own
 * memory (backend.h ABI 1.9, nereid_batch_request_output_view): the testing
 * backend's output_views mode gives every output as a view of a malloc'ed
 * copy and counts what the core releases. A client that accepts views
 * (nereid_request_set_output_views) reads the backend's memory until it
 * frees the response; any other gets a copy in its allocator's buffer and
 * the view is released at once; unrequested outputs and failed requests
 * release theirs; a view the core refuses (wrong size, BYTES) stays the
 * backend's. Every view is released exactly once.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "test_util.h"

#define N 1000

static long (*outstanding)(void), (*released)(void), (*refused)(void);
static float in0[N], in1[4];

static const char *const VIEWS_CONFIG =
    "name: \"views\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
    "parameters { key: \"output_views\" value: { string_value: \"true\" } }\n"
    "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] },\n"
    "        { name: \"INPUT1\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
    "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] },\n"
    "         { name: \"OUTPUT1\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n";

static const char *const BYTES_CONFIG =
    "name: \"views_bytes\"\nbackend: \"testing\"\nmax_batch_size: 0\n"
    "parameters { key: \"output_views\" value: { string_value: \"true\" } }\n"
    "input [ { name: \"INPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n"
    "output [ { name: \"OUTPUT0\" data_type: TYPE_STRING dims: [ -1 ] } ]\n";

/* A request for views asking for OUTPUT0 only. */
static nereid_request_t *views_request(nereid_server_t *s, bool accept)
{
    tensor_t in[2] = {{"INPUT0", NEREID_TYPE_FP32, {N}, 1, in0, sizeof in0},
                      {"INPUT1", NEREID_TYPE_FP32, {4}, 1, in1, sizeof in1}};
    nereid_request_t *req = NULL;
    nereid_error_t *err = request_with_inputs(s, "views", in, 2, &req);
    if (!err) err = nereid_request_add_requested_output(req, "OUTPUT0", 0);
    CHECK(err == NULL);
    nereid_error_free(err);
    nereid_request_set_output_views(req, accept);
    return req;
}

static bool output0_ok(const nereid_response_t *resp, const void **data)
{
    size_t size = 0, rank = 0;
    const int64_t *shape = NULL;
    *data = NULL;
    return find_output(resp, "OUTPUT0", NULL, &shape, &rank, data, &size) && size == sizeof in0 &&
           rank == 1 && shape[0] == N && memcmp(*data, in0, size) == 0 &&
           !find_output(resp, "OUTPUT1", NULL, NULL, NULL, NULL, NULL);
}

/* Views accepted: the response reads the backend's copy until freed; the
 * unrequested OUTPUT1 is released at once. */
static void test_view_lives_with_the_response(nereid_server_t *s)
{
    long rel0 = released();
    nereid_error_t *err = NULL;
    nereid_response_t *resp = infer_sync(s, views_request(s, true), &err);
    CHECK(err == NULL && resp && !nereid_response_error(resp));
    const void *data;
    CHECK(output0_ok(resp, &data));
    CHECK(data != (const void *)in0); /* the backend's memory, not the input */
    const char *name;
    nereid_datatype_t dt;
    const int64_t *shape;
    size_t rank, size;
    void *userp = (void *)1;
    nereid_response_output(resp, 0, &name, &dt, &shape, &rank, &data, &size, &userp);
    CHECK(userp == NULL); /* no allocator buffer behind a view */
    CHECK(outstanding() == 1);
    CHECK(released() == rel0 + 1);
    nereid_response_free(resp);
    CHECK(outstanding() == 0);
    CHECK(released() == rel0 + 2);
}

typedef struct alloc_count {
    int allocs, releases;
} alloc_count_t;

static nereid_error_t *count_alloc(void *userp, const char *name, nereid_datatype_t dt,
                                   const int64_t *shape, size_t rank, size_t byte_size,
                                   void **buffer, void **buffer_userp)
{
    (void)name, (void)dt, (void)shape, (void)rank;
    ((alloc_count_t *)userp)->allocs++;
    *buffer = malloc(byte_size ? byte_size : 1);
    *buffer_userp = *buffer;
    return NULL;
}

static void count_release(void *userp, void *buffer, void *buffer_userp, size_t byte_size)
{
    (void)byte_size;
    CHECK(buffer == buffer_userp);
    ((alloc_count_t *)userp)->releases++;
    free(buffer);
}

/* Views not accepted: the output is copied into the allocator's buffer and
 * the view released before the response arrives. */
static void test_copy_for_other_clients(nereid_server_t *s)
{
    long rel0 = released();
    alloc_count_t counts = {0, 0};
    nereid_response_allocator_t alloc = {
        .alloc_fn = count_alloc, .release_fn = count_release, .userp = &counts};
    waiter_t w;
    waiter_init(&w);
    nereid_error_t *err =
        nereid_server_infer_async(s, views_request(s, false), &alloc, waiter_on_done, &w);
    CHECK(err == NULL);
    nereid_error_free(err);
    nereid_response_t *resp = waiter_take(&w);
    CHECK(resp && !nereid_response_error(resp));
    CHECK(outstanding() == 0 && released() == rel0 + 2);
    const void *data;
    CHECK(output0_ok(resp, &data));
    CHECK(counts.allocs == 1 && counts.releases == 0);
    nereid_response_free(resp);
    CHECK(counts.releases == 1 && released() == rel0 + 2);
}

/* A request that fails after its views were handed over releases them. */
static void test_failed_request_releases(nereid_server_t *s)
{
    long rel0 = released();
    nereid_request_t *req = views_request(s, true);
    nereid_error_t *err = nereid_request_set_parameter_string(req, "fail", "true");
    CHECK(err == NULL);
    nereid_response_t *resp = infer_sync(s, req, &err);
    CHECK(err == NULL && resp && nereid_response_error(resp));
    CHECK(outstanding() == 0 && released() == rel0 + 2);
    nereid_response_free(resp);
    CHECK(released() == rel0 + 2);
}

/* A view the core refuses stays the backend's: never released by the core. */
static void test_refused_views(nereid_server_t *s)
{
    long rel0 = released(), ref0 = refused();
    nereid_request_t *req = views_request(s, true);
    nereid_error_t *err = nereid_request_set_parameter_string(req, "view_wrong_size", "true");
    CHECK(err == NULL);
    nereid_response_t *resp = infer_sync(s, req, &err);
    const nereid_error_t *e = resp ? nereid_response_error(resp) : NULL;
    CHECK(e && strstr(nereid_error_message(e), "does not match its shape"));
    CHECK(refused() == ref0 + 1 && released() == rel0 && outstanding() == 0);
    nereid_response_free(resp);

    static const char elem[8] = {4, 0, 0, 0, 'a', 'b', 'c', 'd'};
    tensor_t in = {"INPUT0", NEREID_TYPE_BYTES, {1}, 1, elem, sizeof elem};
    CHECK(request_with_inputs(s, "views_bytes", &in, 1, &req) == NULL);
    nereid_request_set_output_views(req, true);
    resp = infer_sync(s, req, &err);
    e = resp ? nereid_response_error(resp) : NULL;
    CHECK(e && nereid_error_code(e) == NEREID_ERROR_INVALID_ARG &&
          strstr(nereid_error_message(e), "only fixed-size datatypes"));
    CHECK(refused() == ref0 + 2 && released() == rel0 && outstanding() == 0);
    nereid_response_free(resp);
}

/* Many requests from several threads: every view released exactly once. */
static void *burst_main(void *p)
{
    nereid_server_t *s = p;
    for (int i = 0; i < 200; i++) {
        nereid_error_t *err = NULL;
        nereid_response_t *resp = infer_sync(s, views_request(s, i % 2 == 0), &err);
        const void *data;
        CHECK(err == NULL && resp && output0_ok(resp, &data));
        nereid_response_free(resp);
    }
    return NULL;
}

static void test_bursts(nereid_server_t *s)
{
    long rel0 = released();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, burst_main, s);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(outstanding() == 0);
    CHECK(released() == rel0 + 4 * 200 * 2);
}

int main(void)
{
    for (int k = 0; k < N; k++)
        in0[k] = (float)k * 0.5f;
    make_repo_dir("output-views");
    write_model("views", VIEWS_CONFIG);
    write_model("views_bytes", BYTES_CONFIG);
    nereid_error_t *err = NULL;
    nereid_server_t *s = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(err == NULL && s);
    nereid_error_free(err);
    char path[600];
    snprintf(path, sizeof path, "%s/libnereid_testing.so", test_backend_dir());
    void *lib = s ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    CHECK(lib != NULL);
    if (lib) {
        *(void **)&outstanding = dlsym(lib, "nereid_testing_views_outstanding");
        *(void **)&released = dlsym(lib, "nereid_testing_views_released");
        *(void **)&refused = dlsym(lib, "nereid_testing_views_refused");
        CHECK(outstanding && released && refused);
    }
    if (outstanding && released && refused) {
        test_view_lives_with_the_response(s);
        test_copy_for_other_clients(s);
        test_failed_request_releases(s);
        test_refused_views(s);
        test_bursts(s);
    }
    if (lib) dlclose(lib);
    nereid_server_free(s);
    remove_repo();
    return check_summary();
}
