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

#endif
