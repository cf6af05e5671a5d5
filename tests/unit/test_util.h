/*
 * This file contains the helpers shared by the unit tests and benchmarks
 * that drive a server through the in-process API: a scratch model
 * repository, server options on it with the build's backends, a
 * synchronous wrapper over nereid_server_infer_async, and lookups in
 * responses and statistics. Everything is static inline, so each test or
 * benchmark executable takes only what it uses (benchmarks include it as
 * "../tests/unit/test_util.h").
 */
#ifndef NEREID_TEST_UTIL_H
#define NEREID_TEST_UTIL_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "nereid/server.h"

/* ---- A scratch model repository ---- */

static char repo[256];

/* Creates a fresh /tmp/nereid-test-<tag>-XXXXXX and names it in repo. */
static inline void make_repo_dir(const char *tag)
{
    snprintf(repo, sizeof repo, "/tmp/nereid-test-%s-XXXXXX", tag);
    if (!mkdtemp(repo)) abort();
}

/* Writes len bytes to repo/rel, creating the folders on the way. */
static inline void write_bytes(const char *rel, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", repo, rel);
    for (char *p = path + strlen(repo) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (len && fwrite(data, 1, len, f) != len) abort();
    fclose(f);
}

static inline void write_file(const char *rel, const char *text)
{
    write_bytes(rel, text, strlen(text));
}

/* repo/<name>/config.pbtxt with config, and an empty version 1. */
static inline void write_model(const char *name, const char *config)
{
    char rel[256];
    snprintf(rel, sizeof rel, "%s/config.pbtxt", name);
    write_file(rel, config);
    snprintf(rel, sizeof rel, "%s/1/.keep", name);
    write_file(rel, "");
}

static inline void remove_path(const char *rel)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", repo, rel);
    if (system(cmd) != 0) abort();
}

/* Removes the whole repository; false (with a note) when that failed. */
static inline bool remove_repo(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) == 0) return true;
    fprintf(stderr, "could not remove %s\n", repo);
    return false;
}

/* ---- A server on the repository ---- */

/* The backends under test: $NEREID_BUILD/backends, else this build's own
 * (build/backends relative to the working directory without one). */
static inline const char *test_backend_dir(void)
{
    static char dir[512];
    const char *build = getenv("NEREID_BUILD");
#ifdef NEREID_DEFAULT_BACKEND_DIR
    if (!build) return NEREID_DEFAULT_BACKEND_DIR;
#endif
    snprintf(dir, sizeof dir, "%s/backends", build ? build : "build");
    return dir;
}

/* Default options serving the repository at path alone, with the build's
 * backends; path must outlive nereid_server_new. */
static inline void repo_options_for(nereid_server_options_t *o, const char *path)
{
    static const char *repos[1];
    repos[0] = path;
    nereid_server_options_init(o);
    o->model_repositories = repos;
    o->n_model_repositories = 1;
    o->backend_directory = test_backend_dir();
}

/* Default options serving repo alone, with the build's backends. */
static inline void repo_options(nereid_server_options_t *o)
{
    repo_options_for(o, repo);
}

static inline nereid_server_t *start_server(nereid_model_control_mode_t mode,
                                            const char *const *load, size_t n_load, int poll_secs,
                                            bool exit_on_error, nereid_error_t **err)
{
    nereid_server_options_t o;
    repo_options(&o);
    o.exit_on_error = exit_on_error;
    o.model_control_mode = mode;
    o.load_models = load;
    o.n_load_models = n_load;
    if (poll_secs) o.repository_poll_secs = poll_secs;
    nereid_server_t *s = NULL;
    *err = nereid_server_new(&o, &s);
    return s;
}

/* ---- Waiting for completions ---- */

/* Counts completions (and failed ones); keeps the first response, frees
 * later ones. */
typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done, failed;
    nereid_response_t *resp;
} waiter_t;

static inline void waiter_init(waiter_t *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
}

static inline void waiter_destroy(waiter_t *w)
{
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
}

/* The completion callback for nereid_server_infer_async; userp is a waiter_t. */
static inline void waiter_on_done(nereid_response_t *resp, void *userp)
{
    waiter_t *w = userp;
    pthread_mutex_lock(&w->lock);
    if (nereid_response_error(resp)) w->failed++;
    if (w->resp)
        nereid_response_free(resp);
    else
        w->resp = resp;
    w->done++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Waits until n completions arrived. */
static inline void waiter_wait(waiter_t *w, int n)
{
    pthread_mutex_lock(&w->lock);
    while (w->done < n)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* Waits for the first completion, destroys w and returns its response. */
static inline nereid_response_t *waiter_take(waiter_t *w)
{
    waiter_wait(w, 1);
    waiter_destroy(w);
    return w->resp;
}

/* Submits req and waits; returns the response, or NULL with *err set (req
 * is freed either way). */
static inline nereid_response_t *infer_sync(nereid_server_t *s, nereid_request_t *req,
                                            nereid_error_t **err)
{
    waiter_t w;
    waiter_init(&w);
    *err = nereid_server_infer_async(s, req, NULL, waiter_on_done, &w);
    if (*err) {
        nereid_request_free(req);
        waiter_destroy(&w);
        return NULL;
    }
    return waiter_take(&w);
}

/* ---- Requests from input lists ---- */

typedef struct tensor {
    const char *name;
    nereid_datatype_t datatype;
    int64_t shape[4];
    size_t rank;
    const void *data;
    size_t byte_size;
} tensor_t;

/* A new request for model (latest version) with these inputs; on error
 * *out is NULL. */
static inline nereid_error_t *request_with_inputs(nereid_server_t *s, const char *model,
                                                  const tensor_t *in, size_t n_in,
                                                  nereid_request_t **out)
{
    nereid_request_t *req = NULL;
    nereid_error_t *err = nereid_request_new(s, model, -1, &req);
    for (size_t i = 0; !err && i < n_in; i++)
        err = nereid_request_add_input(req, in[i].name, in[i].datatype, in[i].shape, in[i].rank,
                                       in[i].data, in[i].byte_size);
    if (err) {
        nereid_request_free(req);
        req = NULL;
    }
    *out = req;
    return err;
}

/* Finds output name in resp (NULL: none): true with its fields stored
 * through the pointers that are not NULL, false when absent. */
static inline bool find_output(const nereid_response_t *resp, const char *name,
                               nereid_datatype_t *dt, const int64_t **shape, size_t *rank,
                               const void **data, size_t *byte_size)
{
    for (size_t i = 0; resp && i < nereid_response_output_count(resp); i++) {
        const char *n;
        nereid_datatype_t t;
        const int64_t *s;
        size_t r, bs;
        const void *d;
        void *userp;
        nereid_response_output(resp, i, &n, &t, &s, &r, &d, &bs, &userp);
        if (strcmp(n, name) != 0) continue;
        if (dt) *dt = t;
        if (shape) *shape = s;
        if (rank) *rank = r;
        if (data) *data = d;
        if (byte_size) *byte_size = bs;
        return true;
    }
    return false;
}

/* model_stats[0] of the statistics of model/version as a new JSON
 * reference, or NULL when they cannot be read. */
static inline json_t *model_stats_json(nereid_server_t *s, const char *model, int64_t version)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_model_statistics(s, model, version, &text);
    if (err) {
        nereid_error_free(err);
        return NULL;
    }
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    json_t *st = json_incref(json_array_get(json_object_get(doc, "model_stats"), 0));
    json_decref(doc);
    return st;
}

/* ---- Time ---- */

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* qsort order for uint64_t samples (latencies). */
static inline int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* qsort order for double samples. */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
