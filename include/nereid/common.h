/*
 * This file contains small helpers the server and the backends share,
 * header-only: every function is static inline, so this header adds no
 * symbol and no ABI (a backend may include it, as any layer of the server
 * may; scripts/layers.txt). One copy of each, instead of one per file.
 */
#ifndef NEREID_COMMON_H
#define NEREID_COMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

/* One pause of a spin-wait loop: tells the core the thread is spinning
 * (x86 pause, aarch64 yield; nothing elsewhere). */
static inline void nereid_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Whether path names a directory / a regular file (symbolic links
 * followed). */
static inline bool nereid_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static inline bool nereid_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* qsort/bsearch comparator of an array of C strings (char *), byte order. */
static inline int nereid_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Starts fn(arg) on a new detached thread; false when no thread could be
 * started (fn did not run: the caller runs its fallback). */
static inline bool nereid_start_detached(void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) != 0) return false;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc == 0;
}

/* Runs fn(arg) on a new detached thread; when no thread can be started,
 * runs it on the calling thread before returning (so fn always runs once).
 * Returns true when fn went to a thread of its own. */
static inline bool nereid_run_detached(void *(*fn)(void *), void *arg)
{
    if (nereid_start_detached(fn, arg)) return true;
    fn(arg);
    return false;
}

/* nereid_run_niced's call: what runs, and how much nicer. */
typedef struct nereid_niced_call {
    void *(*fn)(void *);
    void *arg;
    int nice;
    void *result;
} nereid_niced_call_t;

static inline void *nereid_niced_main(void *p)
{
    nereid_niced_call_t *c = (nereid_niced_call_t *)p;
    /* Linux keeps a nice value per thread: PRIO_PROCESS 0 is this thread. */
    int base = getpriority(PRIO_PROCESS, 0);
    int target = base + c->nice > 19 ? 19 : base + c->nice;
    if (target > base) (void)setpriority(PRIO_PROCESS, 0, target);
    c->result = c->fn(c->arg);
    return NULL;
}

/* Runs fn(arg) on a new thread made nicer by `nice` (at most 19) and waits
 * for it; returns fn's result. When no thread can be started, fn runs on
 * the calling thread at its own priority. For CPU-heavy preparation (a
 * runtime building a model's session while requests are served) that should
 * take only the CPU inference leaves. fn must not start threads or
 * processes that outlive it: they would inherit the priority, which an
 * unprivileged process cannot raise back. */
static inline void *nereid_run_niced(int nice, void *(*fn)(void *), void *arg)
{
    nereid_niced_call_t c = {fn, arg, nice, NULL};
    pthread_t t;
    if (pthread_create(&t, NULL, nereid_niced_main, &c) != 0) return fn(arg);
    pthread_join(t, NULL);
    return c.result;
}

#endif
