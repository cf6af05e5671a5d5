/*
 * This file contains the Python backend's environment manager (see
 * python_env.h): conda-pack archives named by EXECUTION_ENV_PATH, extracted
 * with libarchive under Triton's secure-extraction flags, tracked by their
 * canonical path and modification time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "python_env.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct env_entry {
    char *archive; /* canonical path */
    char *dir;     /* where it is extracted */
    struct timespec mtime;
    struct env_entry *next;
} env_entry_t;

static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;
static char env_base[32]; /* "/tmp/python_env_XXXXXX", empty until made */
static env_entry_t *env_list;
static unsigned env_count;

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static int remove_tree(const char *dir)
{
    return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0 || errno == ENOENT ? 0 : -1;
}

static nereid_error_t *header_error(int rc, const char *text)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL,
                            "archive_write_header() failed with error code = %d error message "
                            "is %s",
                            rc, text);
}

/* Names a member (or a hard link's target) under dir. The server's working
 * directory is not changed (other threads may use relative paths), so
 * libarchive gets dir/name: a name that is absolute is refused here, with
 * libarchive's own text, before the prefix hides it; '..' and writes
 * through symbolic links are refused by libarchive on the full path. */
static nereid_error_t *rename_under(const char *dir, const char *name, char **out)
{
    *out = NULL;
    if (!name) return NULL;
    if (name[0] == '/') return header_error(ARCHIVE_FAILED, "Path is absolute");
    if (asprintf(out, "%s/%s", dir, name) < 0) {
        *out = NULL;
        return nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    }
    return NULL;
}

/* Copies every member of the archive at path into dir (created empty). */
static nereid_error_t *extract(const char *path, const char *dir)
{
    struct archive *in = archive_read_new();
    struct archive *out = archive_write_disk_new();
    nereid_error_t *err = NULL;
    if (!in || !out) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
        goto done;
    }
    archive_write_disk_set_options(out, ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                                            ARCHIVE_EXTRACT_SECURE_SYMLINKS);
    archive_read_support_filter_gzip(in);
    archive_read_support_format_tar(in);
    if (archive_read_open_filename(in, path, 10240) != ARCHIVE_OK) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "archive_read_open_filename() failed for '%s': %s", path,
                               archive_error_string(in));
        goto done;
    }
    for (;;) {
        struct archive_entry *entry;
        int rc = archive_read_next_header(in, &entry);
        if (rc == ARCHIVE_EOF) break;
        if (rc != ARCHIVE_OK) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "archive_read_next_header() failed with error code = %d error "
                                   "message is %s",
                                   rc, archive_error_string(in));
            break;
        }
        char *name, *link;
        if ((err = rename_under(dir, archive_entry_pathname(entry), &name))) break;
        if ((err = rename_under(dir, archive_entry_hardlink(entry), &link))) {
            free(name);
            break;
        }
        if (name) archive_entry_copy_pathname(entry, name);
        if (link) archive_entry_copy_hardlink(entry, link);
        free(name);
        free(link);
        if ((rc = archive_write_header(out, entry)) != ARCHIVE_OK) {
            err = header_error(rc, archive_error_string(out));
            break;
        }
        const void *buf;
        size_t size;
        la_int64_t offset;
        while ((rc = archive_read_data_block(in, &buf, &size, &offset)) == ARCHIVE_OK)
            if ((rc = archive_write_data_block(out, buf, size, offset)) != ARCHIVE_OK) break;
        if (rc != ARCHIVE_EOF && rc != ARCHIVE_OK) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "extracting '%s' failed with error code = %d, error message is "
                                   "%s",
                                   path, rc, archive_error_string(out));
            break;
        }
        if ((rc = archive_write_finish_entry(out)) != ARCHIVE_OK) {
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "archive_write_finish_entry() failed with error code = %d "
                                   "error message is %s",
                                   rc, archive_error_string(out));
            break;
        }
    }
done:
    if (in) archive_read_free(in);
    if (out) archive_write_free(out);
    return err;
}

nereid_error_t *python_env_extract(const char *path, char **dir)
{
    *dir = NULL;
    char canonical[PATH_MAX];
    struct stat st;
    if (!realpath(path, canonical) || stat(canonical, &st) != 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Failed to get the canonical path for %s.", path);
    pthread_mutex_lock(&env_mu);
    nereid_error_t *err = NULL;
    env_entry_t *e = env_list;
    while (e && strcmp(e->archive, canonical) != 0)
        e = e->next;
    if (e && e->mtime.tv_sec == st.st_mtim.tv_sec && e->mtime.tv_nsec == st.st_mtim.tv_nsec) {
        *dir = strdup(e->dir);
        goto out;
    }
    if (!env_base[0]) {
        strcpy(env_base, "/tmp/python_env_XXXXXX");
        if (!mkdtemp(env_base)) {
            env_base[0] = 0;
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "Failed to create temporary directory for Python "
                                   "environments.");
            goto out;
        }
    }
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->archive = strdup(canonical)) ||
            asprintf(&e->dir, "%s/%u", env_base, env_count) < 0) {
            if (e) free(e->archive);
            free(e);
            err = nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
            goto out;
        }
        env_count++;
        e->next = env_list;
        env_list = e;
    } else if (remove_tree(e->dir) != 0) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "Failed to remove %s: %s", e->dir,
                               strerror(errno));
        goto out;
    }
    char line[PATH_MAX + 64];
    snprintf(line, sizeof line, "Extracting Python execution env %s", canonical);
    nereid_log_message(NEREID_LOG_VERBOSE, "python_env.c", __LINE__, line);
    /* A failed extraction leaves no entry that looks extracted. */
    e->mtime = (struct timespec){0};
    if (mkdir(e->dir, 0775) != 0) {
        err = nereid_error_new(NEREID_ERROR_INTERNAL,
                               "Failed to create environment directory for '%s'.", e->dir);
        goto out;
    }
    err = extract(canonical, e->dir);
    if (err) {
        remove_tree(e->dir);
        goto out;
    }
    e->mtime = st.st_mtim;
    *dir = strdup(e->dir);
out:
    pthread_mutex_unlock(&env_mu);
    if (!err && !*dir)
        err = nereid_error_new(NEREID_ERROR_INTERNAL, "python backend: out of memory");
    return err;
}

void python_env_cleanup(void)
{
    pthread_mutex_lock(&env_mu);
    while (env_list) {
        env_entry_t *e = env_list;
        env_list = e->next;
        free(e->archive);
        free(e->dir);
        free(e);
    }
    if (env_base[0]) remove_tree(env_base);
    env_base[0] = 0;
    env_count = 0;
    pthread_mutex_unlock(&env_mu);
}
