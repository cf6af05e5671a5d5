/*
 * This file contains unit tests of the header-only helpers the server and
 * the backends share (include/nereid/common.h): directory and file tests,
 * the string comparator, and starting / running a function on a detached
 * thread (it runs exactly once, on another thread), and running one on a
 * nicer thread (its nice value, the caller's left as it was).
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "check.h"
#include "nereid/common.h"
#include "test_util.h"

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int runs;
    pthread_t ran_on;
} job_t;

static void *job_main(void *arg)
{
    job_t *j = arg;
    pthread_mutex_lock(&j->lock);
    j->runs++;
    j->ran_on = pthread_self();
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

static void *nice_probe(void *arg)
{
    *(int *)arg = getpriority(PRIO_PROCESS, 0);
    return arg;
}

int main(void)
{
    make_repo_dir("common");
    write_file("d/f.txt", "x");
    char dir[300], file[300], missing[300];
    snprintf(dir, sizeof dir, "%s/d", repo);
    snprintf(file, sizeof file, "%s/d/f.txt", repo);
    snprintf(missing, sizeof missing, "%s/none", repo);
    CHECK(nereid_is_dir(dir));
    CHECK(!nereid_is_dir(file));
    CHECK(!nereid_is_dir(missing));
    CHECK(nereid_is_file(file));
    CHECK(!nereid_is_file(dir));
    CHECK(!nereid_is_file(missing));

    const char *names[] = {"b", "ab", "a", "B"};
    qsort(names, 4, sizeof *names, nereid_cmp_str);
    CHECK_STR(names[0], "B");
    CHECK_STR(names[1], "a");
    CHECK_STR(names[2], "ab");
    CHECK_STR(names[3], "b");
    const char *key = "ab";
    CHECK(bsearch(&key, names, 4, sizeof *names, nereid_cmp_str) == &names[2]);

    job_t j = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    bool detached = nereid_run_detached(job_main, &j);
    pthread_mutex_lock(&j.lock);
    while (j.runs == 0)
        pthread_cond_wait(&j.cond, &j.lock);
    CHECK(j.runs == 1);
    /* Started on a thread of its own (creation does not fail here). */
    CHECK(detached);
    CHECK(!pthread_equal(j.ran_on, pthread_self()));
    pthread_mutex_unlock(&j.lock);

    job_t k = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    CHECK(nereid_start_detached(job_main, &k));
    pthread_mutex_lock(&k.lock);
    while (k.runs == 0)
        pthread_cond_wait(&k.cond, &k.lock);
    CHECK(k.runs == 1);
    CHECK(!pthread_equal(k.ran_on, pthread_self()));
    pthread_mutex_unlock(&k.lock);

    for (int i = 0; i < 1000; i++)
        nereid_cpu_relax();

    int base = getpriority(PRIO_PROCESS, 0), seen = -100;
    CHECK(nereid_run_niced(5, nice_probe, &seen) == &seen);
    CHECK(seen == (base + 5 > 19 ? 19 : base + 5));
    CHECK(getpriority(PRIO_PROCESS, 0) == base);
    CHECK(nereid_run_niced(40, nice_probe, &seen) == &seen);
    CHECK(seen == 19);
    CHECK(getpriority(PRIO_PROCESS, 0) == base);

    CHECK(remove_repo());
    return check_summary();
}
