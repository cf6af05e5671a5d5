/*
 * This file contains helpers for unit tests that drive a server through the
 * in-process API: a scratch repository, a synchronous infer, and JSON
 * document lookups.
 */
#ifndef NEREID_SERVER_UTIL_H
#define NEREID_SERVER_UTIL_H

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nereid/server.h"

static char repo[256];

static void make_repo_dir(const char *tag)
{
    snprintf(repo, sizeof repo, "/tmp/nereid-test-%s-XXXXXX", tag);
    if (!mkdtemp(repo)) abort();
}

static void write_file(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", repo, rel);
    for (char *p = path + strlen(repo) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
}

static inline void remove_path(const char *rel)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", repo, rel);
    if (system(cmd) != 0) abort();
}

static inline void remove_repo(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", repo);
    if (system(cmd) != 0) abort();
}

static inline double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    nereid_response_t *resp;
} waiter_t;

static void on_done(nereid_response_t *resp, void *userp)
{
    waiter_t *w = userp;
    pthread_mutex_lock(&w->lock);
    if (w->resp)
        nereid_response_free(resp);
    else
        w->resp = resp;
    w->done++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void waiter_init(waiter_t *w)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
}

static void waiter_wait(waiter_t *w, int n)
{
    pthread_mutex_lock(&w->lock);
    while (w->done < n)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* Submits req and waits; returns the response, or NULL with *err set. */
static inline nereid_response_t *infer(nereid_server_t *s, nereid_request_t *req,
                                       nereid_error_t **err)
{
    waiter_t w;
    waiter_init(&w);
    *err = nereid_server_infer_async(s, req, NULL, on_done, &w);
    if (*err) {
        nereid_request_free(req);
        return NULL;
    }
    waiter_wait(&w, 1);
    return w.resp;
}

static inline nereid_server_t *start_server(nereid_model_control_mode_t mode,
                                            const char *const *load, size_t n_load, int poll_secs,
                                            bool exit_on_error, nereid_error_t **err)
{
    nereid_server_options_t o;
    nereid_server_options_init(&o);
    const char *repos[] = {repo};
    o.model_repositories = repos;
    o.n_model_repositories = 1;
    o.exit_on_error = exit_on_error;
    o.model_control_mode = mode;
    o.load_models = load;
    o.n_load_models = n_load;
    if (poll_secs) o.repository_poll_secs = poll_secs;
    char backends[512];
    const char *build = getenv("NEREID_BUILD");
    snprintf(backends, sizeof backends, "%s/backends", build ? build : "build");
    o.backend_directory = backends;
    nereid_server_t *s = NULL;
    *err = nereid_server_new(&o, &s);
    return s;
}

/* The repository index row for name (and version, NULL = the model row),
 * as a new JSON object, or NULL. */
static inline json_t *index_row(nereid_server_t *s, const char *name, const char *version)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_repository_index(s, false, &text);
    if (err) {
        nereid_error_free(err);
        return NULL;
    }
    json_t *arr = json_loads(text, 0, NULL);
    free(text);
    json_t *found = NULL;
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row)
    {
        const char *n = json_string_value(json_object_get(row, "name"));
        const char *v = json_string_value(json_object_get(row, "version"));
        if (!n || strcmp(n, name) != 0) continue;
        if (version && (!v || strcmp(v, version) != 0)) continue;
        found = json_incref(row);
        break;
    }
    json_decref(arr);
    return found;
}

static inline const char *row_str(json_t *row, const char *key)
{
    const char *v = row ? json_string_value(json_object_get(row, key)) : NULL;
    return v ? v : "";
}

/* A statistics counter: model_stats[0].<path> for model/version. */
static inline long long stat_value(nereid_server_t *s, const char *model, int64_t version,
                                   const char *field, const char *sub)
{
    char *text = NULL;
    nereid_error_t *err = nereid_server_model_statistics(s, model, version, &text);
    if (err) {
        nereid_error_free(err);
        return -1;
    }
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    json_t *st = json_array_get(json_object_get(doc, "model_stats"), 0);
    json_t *v = json_object_get(st, field);
    if (sub) v = json_object_get(json_object_get(v, sub), "count");
    long long r = v ? json_integer_value(v) : -1;
    json_decref(doc);
    return r;
}

#endif
