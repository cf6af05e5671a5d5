/*
 * This file contains the remote repository and its mirror (storage.h):
 * opening a url, listing a prefix page by page, downloading the models
 * that changed with a pool of threads (one curl handle each), swapping
 * each complete model into place, and removing the models that left the
 * bucket. The workload it assumes: tens to thousands of models of a few
 * files each, listed in one or a few pages; files from bytes to GBs.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "nereid/common.h"
#include "storage/storage_internal.h"

/* Parallel downloads per sync. */
#define STORAGE_DOWNLOAD_THREADS 8

bool storage_is_remote(const char *path)
{
    return path && (strncmp(path, "s3://", 5) == 0 || strncmp(path, "as://", 5) == 0 ||
                    strncmp(path, "gs://", 5) == 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

/* Removes path and everything under it, following no symlink. */
static void remove_tree(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

storage_remote_t *storage_remote_open(const char *url, nereid_error_t **err)
{
    *err = NULL;
    const storage_service_t *svc = NULL;
    if (strncmp(url, "s3://", 5) == 0) svc = &storage_s3;
    if (strncmp(url, "as://", 5) == 0) svc = &storage_azure;
    if (!svc) {
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "gs:// model repositories are not supported: this build has no "
                                "Google Cloud Storage client (no GCS server can be run to test "
                                "one); copy the repository to a local path, or to s3:// or as://");
        return NULL;
    }
    const char *why;
    if (!libcurl_get(&why)) {
        *err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "model repository '%s': %s", url, why);
        return NULL;
    }
    storage_remote_t *r = xcalloc(1, sizeof *r);
    r->service = svc;
    r->url = xstrdup(url);
    pthread_mutex_init(&r->lock, NULL);
    *err = svc == &storage_s3 ? storage_s3_open(r, url + 5) : storage_azure_open(r, url + 5);
    if (*err) {
        storage_remote_free(r);
        return NULL;
    }
    /* The mirror: a fresh 0700 directory, so nobody else can plant a
     * symlink or a file in it. */
    const char *base =
        getenv(svc == &storage_s3 ? "TRITON_AWS_MOUNT_DIRECTORY" : "TRITON_AZURE_MOUNT_DIRECTORY");
    if (!base || !base[0]) base = getenv("TMPDIR");
    if (!base || !base[0]) base = "/tmp";
    char *tmpl = xasprintf("%s/nereid-%s-XXXXXX", base, svc->scheme);
    if (!mkdtemp(tmpl)) {
        *err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to create the local copy of model repository '%s' in "
                                "'%s': %s",
                                url, base, strerror(errno));
        free(tmpl);
        storage_remote_free(r);
        return NULL;
    }
    r->dir = tmpl;
    LOG_VERBOSE("model repository '%s' is mirrored in '%s' (endpoint %s)", url, r->dir,
                r->endpoint);
    return r;
}

const char *storage_remote_dir(const storage_remote_t *r)
{
    return r->dir;
}

const char *storage_remote_url(const storage_remote_t *r)
{
    return r->url;
}

void storage_remote_cancel(storage_remote_t *r)
{
    atomic_store(&r->cancel, true);
}

void storage_remote_free(storage_remote_t *r)
{
    if (!r) return;
    if (r->dir) remove_tree(r->dir);
    free(r->dir);
    free(r->url);
    free(r->endpoint);
    free(r->bucket);
    free(r->prefix);
    free(r->key_id);
    free(r->secret);
    free(r->session_token);
    free(r->region);
    free(r->account);
    free(r->account_key);
    for (size_t i = 0; i < r->n_models; i++)
        free(r->models[i]);
    for (size_t i = 0; i < r->n_models; i++)
        storage_listing_clear(&r->manifests[i]);
    free(r->models);
    free(r->sigs);
    free(r->manifests);
    for (size_t i = 0; i < r->n_failed; i++)
        free(r->failed[i]);
    free(r->failed);
    free(r->failed_sigs);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* ---- HTTP ---- */

typedef struct body {
    char *data;
    size_t len, max;
    bool overflow;
} body_t;

static size_t body_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    body_t *b = arg;
    size_t n = size * nmemb;
    if (b->len + n > b->max) {
        b->overflow = true;
        return 0;
    }
    b->data = xrealloc(b->data, b->len + n + 1);
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

/* Ends a transfer once the remote repository is being closed. */
static int xfer_check(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                      curl_off_t ulnow)
{
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    return atomic_load(&((storage_remote_t *)arg)->cancel) ? 1 : 0;
}

static void common_options(const storage_remote_t *r, const libcurl_api_t *lc, CURL *c,
                           char *errbuf)
{
    lc->easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    lc->easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xfer_check);
    lc->easy_setopt(c, CURLOPT_XFERINFODATA, (void *)r);
    lc->easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    lc->easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    lc->easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    /* A stalled transfer ends: under 1 byte/s for 60 s. */
    lc->easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    lc->easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    lc->easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    lc->easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
}

/* The error of a failed transfer: curl's, or the service's status and text. */
static char *transfer_error(const libcurl_api_t *lc, CURLcode rc, const char *errbuf, long status,
                            const body_t *body)
{
    if (rc != CURLE_OK)
        return xasprintf("%s%s%s%s", lc->easy_strerror(rc), errbuf[0] ? " (" : "", errbuf,
                         errbuf[0] ? ")" : "");
    char *text = storage_error_text(body ? body->data : NULL, body ? body->len : 0);
    char *out = xasprintf("HTTP %ld%s%s", status, text[0] ? " " : "", text);
    free(text);
    return out;
}

/* Lists every object under prefix into out. NULL or why not (caller frees). */
static char *list_prefix(storage_remote_t *r, const libcurl_api_t *lc, CURL *c, const char *prefix,
                         storage_listing_t *out)
{
    char *marker = NULL, *why = NULL;
    for (int page = 0; !why; page++) {
        char errbuf[CURL_ERROR_SIZE] = "";
        body_t body = {.max = STORAGE_LIST_PAGE_MAX_BYTES};
        lc->easy_reset(c);
        common_options(r, lc, c, errbuf);
        struct curl_slist *h = r->service->prepare_list(r, lc, c, prefix, marker);
        lc->easy_setopt(c, CURLOPT_HTTPHEADER, h);
        lc->easy_setopt(c, CURLOPT_WRITEFUNCTION, body_write);
        lc->easy_setopt(c, CURLOPT_WRITEDATA, &body);
        CURLcode rc = lc->easy_perform(c);
        long status = 0;
        lc->easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        lc->slist_free_all(h);
        free(marker);
        marker = NULL;
        if (body.overflow)
            why = xasprintf("a listing page is larger than %zu bytes",
                            (size_t)STORAGE_LIST_PAGE_MAX_BYTES);
        else if (rc != CURLE_OK || status != 200)
            why = transfer_error(lc, rc, errbuf, status, &body);
        else if (r->service->parse_list(body.data ? body.data : "", body.len, out, &marker) != 0)
            why = xstrdup("the listing is not valid XML of the expected form");
        else if (out->n > STORAGE_MAX_OBJECTS)
            why = xasprintf("more than %d objects", STORAGE_MAX_OBJECTS);
        free(body.data);
        if (!marker) break;
    }
    free(marker);
    return why;
}

/* ---- Downloads ---- */

typedef struct model_plan {
    char *name;
    size_t first, n; /* its objects in the sorted listing */
    uint64_t sig;
    char *tmp; /* download directory, NULL if the model is unchanged */
    _Atomic bool failed;
    char *why; /* first failure, guarded by the job mutex */
} model_plan_t;

typedef struct job {
    const storage_object_t *obj;
    const char *rel; /* path inside the model directory */
    model_plan_t *model;
    char *reuse; /* the mirror's copy of the same object (key, ETag, size), or NULL */
} job_t;

typedef struct jobs {
    storage_remote_t *r;
    const libcurl_api_t *lc;
    job_t *jobs;
    size_t n;
    _Atomic size_t next;
    _Atomic size_t n_reused;
    pthread_mutex_t lock;
} jobs_t;

typedef struct file_sink {
    int fd;
    uint64_t written;
    bool write_failed;
    int write_errno;
    char etag[256]; /* the ETag the GET answered with */
} file_sink_t;

static size_t file_write(char *ptr, size_t size, size_t nmemb, void *arg)
{
    file_sink_t *f = arg;
    size_t n = size * nmemb, done = 0;
    while (done < n) {
        ssize_t w = write(f->fd, ptr + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            f->write_failed = true;
            f->write_errno = errno;
            return 0;
        }
        done += (size_t)w;
    }
    f->written += n;
    return n;
}

static size_t header_line(char *ptr, size_t size, size_t nmemb, void *arg)
{
    file_sink_t *f = arg;
    size_t n = size * nmemb;
    if (n > 5 && strncasecmp(ptr, "etag:", 5) == 0) {
        size_t s = 5, e = n;
        while (s < e && (ptr[s] == ' ' || ptr[s] == '\t'))
            s++;
        while (e > s && (ptr[e - 1] == '\r' || ptr[e - 1] == '\n' || ptr[e - 1] == ' '))
            e--;
        if (e - s < sizeof f->etag) {
            memcpy(f->etag, ptr + s, e - s);
            f->etag[e - s] = 0;
            storage_unquote(f->etag);
        }
    }
    return n;
}

/* Creates the directories of rel (checked) under root, following no
 * symlink. 0 or -1 with errno. */
static int make_parents(const char *root, const char *rel)
{
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    const char *p = rel;
    for (;;) {
        size_t c = strcspn(p, "/");
        if (!p[c]) break; /* the file itself */
        char comp[256];
        memcpy(comp, p, c);
        comp[c] = 0;
        if (mkdirat(fd, comp, 0755) != 0 && errno != EEXIST) goto fail;
        int sub = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) goto fail;
        close(fd);
        fd = sub;
        p += c + 1;
    }
    close(fd);
    return 0;
fail:;
    int e = errno;
    close(fd);
    errno = e;
    return -1;
}

static void job_fail(jobs_t *js, model_plan_t *m, char *why)
{
    pthread_mutex_lock(&js->lock);
    if (!m->why)
        m->why = why;
    else
        free(why);
    atomic_store(&m->failed, true);
    pthread_mutex_unlock(&js->lock);
}

static void run_job(jobs_t *js, CURL *c, job_t *j)
{
    const libcurl_api_t *lc = js->lc;
    model_plan_t *m = j->model;
    if (atomic_load(&m->failed)) return; /* the model will not be swapped in anyway */
    if (make_parents(m->tmp, j->rel) != 0) {
        job_fail(
            js, m,
            xasprintf("cannot create the directory of '%s': %s", j->obj->key, strerror(errno)));
        return;
    }
    char *path = xasprintf("%s/%s", m->tmp, j->rel);
    /* An object the mirror already has is linked, not downloaded again
     * (a changed config.pbtxt beside unchanged weights). */
    if (j->reuse && link(j->reuse, path) == 0) {
        atomic_fetch_add(&js->n_reused, 1);
        free(path);
        return;
    }
    file_sink_t sink = {.fd = -1};
    sink.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (sink.fd < 0) {
        job_fail(js, m, xasprintf("cannot create '%s': %s", path, strerror(errno)));
        free(path);
        return;
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    body_t err_body = {.max = STORAGE_ERROR_BODY_MAX_BYTES};
    lc->easy_reset(c);
    common_options(js->r, lc, c, errbuf);
    struct curl_slist *h = js->r->service->prepare_get(js->r, lc, c, j->obj->key);
    lc->easy_setopt(c, CURLOPT_HTTPHEADER, h);
    lc->easy_setopt(c, CURLOPT_HEADERFUNCTION, header_line);
    lc->easy_setopt(c, CURLOPT_HEADERDATA, &sink);
    /* The body goes to the file only once the status says it is the object. */
    lc->easy_setopt(c, CURLOPT_WRITEFUNCTION, file_write);
    lc->easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    lc->easy_setopt(c, CURLOPT_FAILONERROR, 0L);
    CURLcode rc = lc->easy_perform(c);
    long status = 0;
    lc->easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    lc->slist_free_all(h);
    close(sink.fd);
    char *why = NULL;
    if (sink.write_failed)
        why = xasprintf("cannot write '%s': %s", path, strerror(sink.write_errno));
    else if (rc != CURLE_OK || status != 200) {
        /* The error body went to the file: read it back for its text. */
        FILE *f = fopen(path, "rb");
        if (f) {
            err_body.data = xmalloc(err_body.max + 1);
            err_body.len = fread(err_body.data, 1, err_body.max, f);
            err_body.data[err_body.len] = 0;
            fclose(f);
        }
        char *t = transfer_error(lc, rc, errbuf, status, &err_body);
        why = xasprintf("failed to download '%s': %s", j->obj->key, t);
        free(t);
    } else if (sink.written != j->obj->size || (sink.etag[0] && strcmp(sink.etag, j->obj->etag)))
        why = xasprintf("object '%s' changed while it was downloaded (listed: %llu bytes, ETag "
                        "%s; got: %llu bytes, ETag %s)",
                        j->obj->key, (unsigned long long)j->obj->size, j->obj->etag,
                        (unsigned long long)sink.written, sink.etag[0] ? sink.etag : "none");
    free(err_body.data);
    free(path);
    if (why) job_fail(js, m, why);
}

static void *download_main(void *arg)
{
    jobs_t *js = arg;
    CURL *c = js->lc->easy_init();
    for (;;) {
        size_t i = atomic_fetch_add(&js->next, 1);
        if (i >= js->n) break;
        if (c)
            run_job(js, c, &js->jobs[i]);
        else
            job_fail(js, js->jobs[i].model, xstrdup("curl_easy_init failed"));
    }
    if (c) js->lc->easy_cleanup(c);
    return NULL;
}

static void run_jobs(jobs_t *js)
{
    size_t n_threads = js->n < STORAGE_DOWNLOAD_THREADS ? js->n : STORAGE_DOWNLOAD_THREADS;
    pthread_t t[STORAGE_DOWNLOAD_THREADS];
    size_t started = 0;
    for (size_t i = 1; i < n_threads; i++)
        if (pthread_create(&t[started], NULL, download_main, js) == 0) started++;
    download_main(js);
    for (size_t i = 0; i < started; i++)
        pthread_join(t[i], NULL);
}

/* ---- Sync ---- */

static int cmp_object(const void *a, const void *b)
{
    return strcmp(((const storage_object_t *)a)->key, ((const storage_object_t *)b)->key);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* Index of model name in r's table, or -1. */
static long find_model(const storage_remote_t *r, const char *name)
{
    char **hit = r->n_models
                     ? bsearch(&name, r->models, r->n_models, sizeof *r->models, nereid_cmp_str)
                     : NULL;
    return hit ? (long)(hit - r->models) : -1;
}

/* Records model name's objects (takes manifest). */
static void table_set(storage_remote_t *r, const char *name, uint64_t sig,
                      storage_listing_t *manifest)
{
    long i = find_model(r, name);
    if (i >= 0) {
        r->sigs[i] = sig;
        storage_listing_clear(&r->manifests[i]);
        r->manifests[i] = *manifest;
        return;
    }
    r->models = xrealloc(r->models, (r->n_models + 1) * sizeof *r->models);
    r->sigs = xrealloc(r->sigs, (r->n_models + 1) * sizeof *r->sigs);
    r->manifests = xrealloc(r->manifests, (r->n_models + 1) * sizeof *r->manifests);
    size_t at = 0;
    while (at < r->n_models && strcmp(r->models[at], name) < 0)
        at++;
    size_t tail = r->n_models - at;
    memmove(&r->models[at + 1], &r->models[at], tail * sizeof *r->models);
    memmove(&r->sigs[at + 1], &r->sigs[at], tail * sizeof *r->sigs);
    memmove(&r->manifests[at + 1], &r->manifests[at], tail * sizeof *r->manifests);
    r->models[at] = xstrdup(name);
    r->sigs[at] = sig;
    r->manifests[at] = *manifest;
    r->n_models++;
}

static void table_remove(storage_remote_t *r, const char *name)
{
    long i = find_model(r, name);
    if (i < 0) return;
    free(r->models[i]);
    storage_listing_clear(&r->manifests[i]);
    size_t tail = r->n_models - (size_t)i - 1;
    memmove(&r->models[i], &r->models[i + 1], tail * sizeof *r->models);
    memmove(&r->sigs[i], &r->sigs[i + 1], tail * sizeof *r->sigs);
    memmove(&r->manifests[i], &r->manifests[i + 1], tail * sizeof *r->manifests);
    r->n_models--;
}

/* Records that model name failed for objects sig; whether that is news
 * (not the failure the last sync already reported). ok: it succeeded. */
static bool note_failure(storage_remote_t *r, const char *name, uint64_t sig, bool ok)
{
    size_t i = 0;
    while (i < r->n_failed && strcmp(r->failed[i], name) != 0)
        i++;
    if (ok || i < r->n_failed) {
        bool news = !ok && (i == r->n_failed || r->failed_sigs[i] != sig);
        if (i < r->n_failed && ok) {
            free(r->failed[i]);
            r->failed[i] = r->failed[r->n_failed - 1];
            r->failed_sigs[i] = r->failed_sigs[r->n_failed - 1];
            r->n_failed--;
        } else if (i < r->n_failed) {
            r->failed_sigs[i] = sig;
        }
        return news;
    }
    r->failed = xrealloc(r->failed, (r->n_failed + 1) * sizeof *r->failed);
    r->failed_sigs = xrealloc(r->failed_sigs, (r->n_failed + 1) * sizeof *r->failed_sigs);
    r->failed[r->n_failed] = xstrdup(name);
    r->failed_sigs[r->n_failed++] = sig;
    return true;
}

/* Not nereid_is_dir: a symbolic link in the copy is never followed. */
static bool is_dir(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Moves model name out of the mirror (renamed aside first, so the
 * repository never sees a half-removed directory) and forgets it. */
static void remove_model(storage_remote_t *r, const char *name)
{
    char *dir = xasprintf("%s/%s", r->dir, name);
    char *aside = xasprintf("%s/.removed-%s", r->dir, name);
    if (rename(dir, aside) == 0) remove_tree(aside);
    free(dir);
    free(aside);
    table_remove(r, name);
    LOG_INFO("model '%s' is no longer in model repository '%s'", name, r->url);
}

/* Puts complete download m in place of the mirror's copy (an atomic
 * exchange when there is one) and drops the old copy. */
static bool swap_in(storage_remote_t *r, model_plan_t *m)
{
    char *dir = xasprintf("%s/%s", r->dir, m->name);
    bool ok;
    if (is_dir(dir))
        ok = renameat2(AT_FDCWD, m->tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0;
    else
        ok = rename(m->tmp, dir) == 0;
    if (!ok)
        LOG_ERROR("failed to put model '%s' of '%s' in place: %s", m->name, r->url,
                  strerror(errno));
    remove_tree(m->tmp); /* the old copy after an exchange, else the download */
    free(dir);
    return ok;
}

/* Groups the sorted listing l by model (objects under r->prefix +
 * "<model>/"), leaving out and logging every key the mirror refuses. */
static model_plan_t *plan_models(storage_remote_t *r, storage_listing_t *l, const char **rels,
                                 size_t *n_plans)
{
    model_plan_t *plans = NULL;
    size_t n = 0, plen = strlen(r->prefix);
    for (size_t i = 0; i < l->n; i++) {
        const storage_object_t *o = &l->objects[i];
        rels[i] = NULL;
        if (strncmp(o->key, r->prefix, plen) != 0) continue;
        const char *rel = o->key + plen;
        const char *slash = strchr(rel, '/');
        if (!slash) continue; /* a file beside the models: not a model */
        if (slash[1] == 0 || (slash[strlen(slash) - 1] == '/' && o->size == 0))
            continue; /* a "directory" marker */
        char *name = xasprintf("%.*s", (int)(slash - rel), rel);
        const char *why = storage_check_key(name, true);
        if (!why) why = storage_check_key(slash + 1, false);
        if (why) {
            LOG_ERROR("model repository '%s': refusing object key '%s' (%s): it would be "
                      "written outside the model's directory or is no plain file path",
                      r->url, o->key, why);
            free(name);
            continue;
        }
        if (n == 0 || strcmp(plans[n - 1].name, name) != 0) {
            plans = xrealloc(plans, (n + 1) * sizeof *plans);
            plans[n] = (model_plan_t){.name = name, .first = i, .sig = 14695981039346656037ULL};
            n++;
        } else {
            free(name);
        }
        model_plan_t *m = &plans[n - 1];
        m->n = i + 1 - m->first;
        rels[i] = slash + 1;
        m->sig = fnv(m->sig, rels[i], strlen(rels[i]) + 1);
        m->sig = fnv(m->sig, o->etag, strlen(o->etag) + 1);
        m->sig = fnv(m->sig, &o->size, sizeof o->size);
    }
    *n_plans = n;
    return plans;
}

/* The object at rel in manifest m (sorted by key), or NULL. */
static const storage_object_t *manifest_find(const storage_listing_t *m, const char *rel)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->objects[mid].key, rel);
        if (c == 0) return &m->objects[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

nereid_error_t *storage_remote_sync(storage_remote_t *r, const char *model)
{
    const libcurl_api_t *lc = libcurl_get(NULL);
    if (model && storage_check_key(model, true))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'", model);
    pthread_mutex_lock(&r->lock);
    storage_listing_t l = {0};
    char *prefix = model ? xasprintf("%s%s/", r->prefix, model) : xstrdup(r->prefix);
    CURL *c = lc->easy_init();
    char *why = c ? list_prefix(r, lc, c, prefix, &l) : xstrdup("curl_easy_init failed");
    if (c) lc->easy_cleanup(c);
    free(prefix);
    if (why) {
        nereid_error_t *err = nereid_error_new(
            NEREID_ERROR_UNAVAILABLE, "failed to read model repository '%s': %s", r->url, why);
        free(why);
        storage_listing_clear(&l);
        pthread_mutex_unlock(&r->lock);
        return err;
    }
    if (l.n) qsort(l.objects, l.n, sizeof *l.objects, cmp_object);
    const char **rels = xcalloc(l.n ? l.n : 1, sizeof *rels);
    size_t n_plans;
    model_plan_t *plans = plan_models(r, &l, rels, &n_plans);

    /* Models that changed (or are not in the mirror) are downloaded. */
    jobs_t js = {.r = r, .lc = lc};
    pthread_mutex_init(&js.lock, NULL);
    for (size_t p = 0; p < n_plans; p++) {
        model_plan_t *m = &plans[p];
        long t = find_model(r, m->name);
        char *dir = xasprintf("%s/%s", r->dir, m->name);
        bool same = t >= 0 && r->sigs[t] == m->sig && is_dir(dir);
        free(dir);
        if (same) continue;
        m->tmp = xasprintf("%s/.download-%s-XXXXXX", r->dir, m->name);
        if (!mkdtemp(m->tmp)) {
            m->why = xasprintf("cannot create a download directory: %s", strerror(errno));
            m->failed = true;
            free(m->tmp);
            m->tmp = NULL;
            continue;
        }
        chmod(m->tmp, 0755);
        for (size_t i = m->first; i < m->first + m->n; i++)
            if (rels[i]) {
                const storage_object_t *o = &l.objects[i];
                const storage_object_t *had =
                    t >= 0 ? manifest_find(&r->manifests[t], rels[i]) : NULL;
                bool same_obj = had && had->size == o->size && strcmp(had->etag, o->etag) == 0;
                js.jobs = xrealloc(js.jobs, (js.n + 1) * sizeof *js.jobs);
                js.jobs[js.n++] =
                    (job_t){o, rels[i], m,
                            same_obj ? xasprintf("%s/%s/%s", r->dir, m->name, rels[i]) : NULL};
            }
    }
    uint64_t t0 = util_now_ns();
    if (js.n) run_jobs(&js);
    size_t n_new = 0, n_failed = 0;
    char *first_why = NULL;
    for (size_t p = 0; p < n_plans; p++) {
        model_plan_t *m = &plans[p];
        if (!m->tmp && !m->failed) continue; /* unchanged */
        if (!m->failed && swap_in(r, m)) {
            storage_listing_t manifest = {0};
            for (size_t i = m->first; i < m->first + m->n; i++)
                if (rels[i])
                    storage_listing_add(&manifest, xstrdup(rels[i]), xstrdup(l.objects[i].etag),
                                        l.objects[i].size);
            table_set(r, m->name, m->sig, &manifest);
            note_failure(r, m->name, m->sig, true);
            n_new++;
        } else {
            if (m->tmp) remove_tree(m->tmp);
            /* A poll retries; the same failure is logged once. */
            if (note_failure(r, m->name, m->sig, false))
                LOG_ERROR("failed to download model '%s' from model repository '%s': %s; the "
                          "copy served so far (if any) is kept",
                          m->name, r->url, m->why ? m->why : "cannot put it in place");
            else
                LOG_VERBOSE("failed to download model '%s' from model repository '%s' again: %s",
                            m->name, r->url, m->why ? m->why : "cannot put it in place");
            if (!first_why)
                first_why = xasprintf("model '%s': %s", m->name,
                                      m->why ? m->why : "cannot put it in place");
            n_failed++;
        }
    }
    if (js.n)
        LOG_VERBOSE("model repository '%s': %zu model(s) downloaded (%zu objects, %zu of them "
                    "already in the copy) in %.1f ms",
                    r->url, n_new, js.n, atomic_load(&js.n_reused),
                    (double)(util_now_ns() - t0) / 1e6);
    for (size_t i = 0; i < js.n; i++)
        free(js.jobs[i].reuse);
    /* Models no longer listed leave the mirror. */
    char **gone = NULL;
    size_t n_gone = 0;
    for (size_t i = 0; i < r->n_models; i++) {
        if (model && strcmp(r->models[i], model) != 0) continue;
        bool listed = false;
        for (size_t p = 0; p < n_plans && !listed; p++)
            listed = strcmp(plans[p].name, r->models[i]) == 0;
        if (!listed) {
            gone = xrealloc(gone, (n_gone + 1) * sizeof *gone);
            gone[n_gone++] = xstrdup(r->models[i]);
        }
    }
    for (size_t i = 0; i < n_gone; i++) {
        remove_model(r, gone[i]);
        free(gone[i]);
    }
    free(gone);
    for (size_t p = 0; p < n_plans; p++) {
        free(plans[p].name);
        free(plans[p].tmp);
        free(plans[p].why);
    }
    free(plans);
    free(js.jobs);
    pthread_mutex_destroy(&js.lock);
    free(rels);
    storage_listing_clear(&l);
    pthread_mutex_unlock(&r->lock);
    nereid_error_t *err = NULL;
    if (first_why)
        err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                               "failed to read model repository '%s': %zu model(s) could not be "
                               "downloaded, first %s",
                               r->url, n_failed, first_why);
    free(first_why);
    return err;
}
