/*
 * This file contains the run-time opening of libcurl (core/libcurl.h).
 */
#include "core/libcurl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static libcurl_api_t api;
static bool api_ok;
static char api_why[256];

static void open_once(void)
{
    static const char *const names[] = {
        "curl_global_init",  "curl_easy_init",     "curl_easy_setopt", "curl_easy_perform",
        "curl_easy_getinfo", "curl_easy_strerror", "curl_easy_reset",  "curl_easy_cleanup",
        "curl_slist_append", "curl_slist_free_all"};
    enum { N = sizeof names / sizeof names[0] };
    void *f[N] = {NULL};
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    bool ok = h != NULL;
    for (size_t i = 0; ok && i < N; i++)
        ok = (f[i] = dlsym(h, names[i])) != NULL;
    if (!ok) {
        const char *e = dlerror();
        snprintf(api_why, sizeof api_why, "cannot open libcurl.so.4: %s", e ? e : "unknown error");
        return;
    }
    /* (Object and function pointers share a representation on the
     * platforms dlsym exists on; memcpy keeps -Wpedantic quiet.) */
    CURLcode (*global_init)(long flags);
    memcpy(&global_init, &f[0], sizeof f[0]);
    memcpy(&api.easy_init, &f[1], sizeof f[1]);
    memcpy(&api.easy_setopt, &f[2], sizeof f[2]);
    memcpy(&api.easy_perform, &f[3], sizeof f[3]);
    memcpy(&api.easy_getinfo, &f[4], sizeof f[4]);
    memcpy(&api.easy_strerror, &f[5], sizeof f[5]);
    memcpy(&api.easy_reset, &f[6], sizeof f[6]);
    memcpy(&api.easy_cleanup, &f[7], sizeof f[7]);
    memcpy(&api.slist_append, &f[8], sizeof f[8]);
    memcpy(&api.slist_free_all, &f[9], sizeof f[9]);
    global_init(CURL_GLOBAL_DEFAULT);
    api_ok = true;
}

const libcurl_api_t *libcurl_get(const char **why)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, open_once);
    if (!api_ok && why) *why = api_why;
    return api_ok ? &api : NULL;
}
