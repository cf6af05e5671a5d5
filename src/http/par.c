/*
 * This file contains the helpers that convert one large JSON tensor on
 * several cores (par.h). Each helper thread has its own slot: a caller
 * claims an idle slot with one atomic exchange (never waiting for one), hands
 * it a part, converts its own part, then waits for the helper's. The parts
 * of an array are ranges of its elements: printed into disjoint shares of
 * the reply's room and moved together, or read from the text after the
 * comma that ends the range before (found by counting commas), each into
 * its own range of the tensor.
 */
#include "http/par.h"
#include "nereid/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A caller whose part is done waits this long for the helper's before it
 * sleeps: its core has nothing else to do for the request (FP32 JSON
 * 1.05-1.09x the rate of sleeping at once, docs/performance.md). */
#define WAIT_SPIN_US 200
enum { SLOT_IDLE, SLOT_WORK, SLOT_DONE, SLOT_QUIT };

typedef struct slot {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t work, done;
    atomic_int state; /* SLOT_*, changed under lock */
    void (*fn)(void *);
    void *arg;
    /* Owned by one caller from claim to wait; by par_stop once stopped
     * (and until the next par_start). */
    atomic_bool claimed;
} slot_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* g_refs, g_started */
static int g_refs, g_started;
static slot_t g_slots[PAR_MAX_HELPERS];
static atomic_int g_live;     /* slots callers may claim: [0, g_live) */
static atomic_ulong g_helped; /* parts helpers ran */

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Waits up to us microseconds for *state to become want. */
static void spin_until(atomic_int *state, int want, int us)
{
    int64_t stop = now_us() + us;
    for (;;) {
        for (int i = 0; i < 32; i++) {
            if (atomic_load_explicit(state, memory_order_relaxed) == want) return;
            nereid_cpu_relax();
        }
        if (now_us() >= stop) return;
    }
}

static void *helper_main(void *arg)
{
    slot_t *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->state == SLOT_IDLE || s->state == SLOT_DONE)
            pthread_cond_wait(&s->work, &s->lock);
        if (s->state == SLOT_QUIT) break;
        pthread_mutex_unlock(&s->lock);
        s->fn(s->arg);
        atomic_fetch_add_explicit(&g_helped, 1, memory_order_relaxed);
        pthread_mutex_lock(&s->lock);
        s->state = SLOT_DONE;
        pthread_cond_signal(&s->done);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int par_start(int helpers)
{
    pthread_mutex_lock(&g_lock);
    if (g_refs++ > 0) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    if (helpers < 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        helpers = ncpu > 1 ? (int)(ncpu - 1) : 0;
    }
    if (helpers > PAR_MAX_HELPERS) helpers = PAR_MAX_HELPERS;

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10); /* conversions take little stack */
    int started = 0;
    for (; started < helpers; started++) {
        slot_t *s = &g_slots[started];
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->work, NULL);
        pthread_cond_init(&s->done, NULL);
        s->state = SLOT_IDLE;
        if (pthread_create(&s->thread, &attr, helper_main, s)) {
            pthread_cond_destroy(&s->done);
            pthread_cond_destroy(&s->work);
            pthread_mutex_destroy(&s->lock);
            break;
        }
        pthread_setname_np(s->thread, "json-helper");
        atomic_store(&s->claimed, false);
    }
    pthread_attr_destroy(&attr);
    g_started = started;
    atomic_store(&g_live, started);
    pthread_mutex_unlock(&g_lock);
    return started == helpers ? 0 : -1;
}

void par_stop(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refs == 0 || --g_refs > 0) {
        pthread_mutex_unlock(&g_lock);
        return;
    }
    atomic_store(&g_live, 0);
    for (int i = 0; i < g_started; i++) {
        slot_t *s = &g_slots[i];
        /* A part in progress ends soon; the slot then stays claimed. */
        while (atomic_exchange(&s->claimed, true))
            sched_yield();
        pthread_mutex_lock(&s->lock);
        s->state = SLOT_QUIT;
        pthread_cond_signal(&s->work);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->done);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->lock);
    }
    g_started = 0;
    pthread_mutex_unlock(&g_lock);
}

int par_helpers(void)
{
    return atomic_load(&g_live);
}

unsigned long par_parts_helped(void)
{
    return atomic_load(&g_helped);
}

/* Claims up to max idle slots into out; returns how many. */
static int claim(slot_t **out, int max)
{
    int live = atomic_load(&g_live), n = 0;
    for (int i = 0; i < live && n < max; i++)
        if (!atomic_load_explicit(&g_slots[i].claimed, memory_order_relaxed) &&
            !atomic_exchange(&g_slots[i].claimed, true))
            out[n++] = &g_slots[i];
    return n;
}

static void run(slot_t *s, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&s->lock);
    s->fn = fn;
    s->arg = arg;
    s->state = SLOT_WORK;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
}

static void wait_and_release(slot_t *s)
{
    spin_until(&s->state, SLOT_DONE, WAIT_SPIN_US);
    pthread_mutex_lock(&s->lock);
    while (s->state != SLOT_DONE)
        pthread_cond_wait(&s->done, &s->lock);
    s->state = SLOT_IDLE;
    pthread_mutex_unlock(&s->lock);
    atomic_store(&s->claimed, false);
}

/* ---- Reading ------------------------------------------------------------- */

static size_t parse_size(numparse_kind_t kind)
{
    switch (kind) {
    case NUMPARSE_INT8:
    case NUMPARSE_UINT8:
    case NUMPARSE_BOOL:
        return 1;
    case NUMPARSE_INT16:
    case NUMPARSE_UINT16:
        return 2;
    case NUMPARSE_INT32:
    case NUMPARSE_UINT32:
    case NUMPARSE_FP32:
        return 4;
    case NUMPARSE_INT64:
    case NUMPARSE_UINT64:
    case NUMPARSE_FP64:
        return 8;
    }
    return 0;
}

typedef struct parse_part {
    numparse_kind_t kind;
    const char *p, *end; /* the array's first element; the end of the text */
    char *out;           /* the whole tensor */
    size_t first, count; /* this part's elements */
    char close;          /* ']' for the last part, ',' for the others */
    const char *result;  /* numparse_array_run's */
} parse_part_t;

static void parse_part(void *arg)
{
    parse_part_t *t = arg;
    const char *q = t->p;
    t->result = NULL;
    if (t->first) {
        const char *comma = numparse_nth_comma(t->p, t->end, t->first);
        if (!comma) return;
        for (q = comma + 1; q < t->end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t');)
            q++;
    }
    t->result = numparse_array_run(t->kind, q, t->end, t->out + t->first * parse_size(t->kind),
                                   t->count, t->close);
}

const char *par_numparse_array(numparse_kind_t kind, const char *p, const char *end, char *out,
                               size_t n)
{
    slot_t *slots[PAR_MAX_HELPERS];
    size_t min = kind == NUMPARSE_BOOL ? 8 * (size_t)PAR_MIN_ELEMENTS : PAR_MIN_ELEMENTS;
    int k = n >= min ? claim(slots, PAR_MAX_HELPERS) : 0;
    if (k == 0) return numparse_array(kind, p, end, out, n);
    int parts = k + 1;
    parse_part_t t[PAR_MAX_HELPERS + 1];
    for (int j = 0; j < parts; j++) {
        size_t first = n * (size_t)j / (size_t)parts, next = n * (size_t)(j + 1) / (size_t)parts;
        t[j] = (parse_part_t){kind, p, end, out, first, next - first, j == parts - 1 ? ']' : ',',
                              NULL};
    }
    for (int j = 1; j < parts; j++)
        run(slots[j - 1], parse_part, &t[j]);
    parse_part(&t[0]);
    bool ok = t[0].result != NULL;
    for (int j = 1; j < parts; j++) {
        wait_and_release(slots[j - 1]);
        ok = ok && t[j].result;
    }
    /* Tokens and whitespace hold no comma: in an array of n numbers, the
     * comma that ends each part is the one the next part counted to, so
     * every part succeeds; a part that fails means the one-run reader
     * would refuse the array too. */
    return ok ? t[parts - 1].result : NULL;
}

/* ---- Writing ------------------------------------------------------------- */

static size_t fmt_size(numfmt_kind_t kind)
{
    switch (kind) {
    case NUMFMT_BOOL:
    case NUMFMT_U8:
    case NUMFMT_I8:
        return 1;
    case NUMFMT_U16:
    case NUMFMT_I16:
        return 2;
    case NUMFMT_U32:
    case NUMFMT_I32:
    case NUMFMT_F32:
        return 4;
    case NUMFMT_U64:
    case NUMFMT_I64:
    case NUMFMT_F64:
        return 8;
    }
    return 0;
}

typedef struct fmt_part {
    numfmt_kind_t kind;
    const char *data;   /* the part's first element */
    size_t count;       /* its elements */
    char *o, *text_end; /* its share of the room; the end of its text */
} fmt_part_t;

static void fmt_part(void *arg)
{
    fmt_part_t *t = arg;
    t->text_end = numfmt_array(t->o, t->kind, t->data, t->count);
}

char *par_numfmt_array(char *o, numfmt_kind_t kind, const void *data, size_t n)
{
    slot_t *slots[PAR_MAX_HELPERS];
    size_t min = kind == NUMFMT_BOOL ? 8 * (size_t)PAR_MIN_ELEMENTS : PAR_MIN_ELEMENTS;
    int k = n >= min ? claim(slots, PAR_MAX_HELPERS) : 0;
    if (k == 0) return numfmt_array(o, kind, data, n);
    int parts = k + 1;
    size_t es = fmt_size(kind);
    fmt_part_t t[PAR_MAX_HELPERS + 1];
    for (int j = 0; j < parts; j++) {
        size_t first = n * (size_t)j / (size_t)parts, next = n * (size_t)(j + 1) / (size_t)parts;
        /* A part writes within its elements' room only. */
        t[j] = (fmt_part_t){kind, (const char *)data + first * es, next - first,
                            o + first * NUMFMT_ARRAY_ROOM, NULL};
    }
    for (int j = 1; j < parts; j++)
        run(slots[j - 1], fmt_part, &t[j]);
    fmt_part(&t[0]);
    char *e = t[0].text_end;
    for (int j = 1; j < parts; j++) {
        wait_and_release(slots[j - 1]);
        size_t len = (size_t)(t[j].text_end - t[j].o);
        *e++ = ',';
        memmove(e, t[j].o, len);
        e += len;
    }
    return e;
}
