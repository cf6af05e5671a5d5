/*
 * This file contains the server's side of model repositories on object
 * storage (src/storage/): each s3:// or as:// --model-repository is
 * replaced, in s->repos, by the local mirror the storage layer keeps, and
 * that mirror is brought in step before the repository is scanned: at
 * start-up, on every poll, and for the model an explicit load names.
 */
#include <stdlib.h>

#include "core/repository.h"
#include "core/server_internal.h"
#include "core/util.h"
#include "storage/storage.h"

nereid_error_t *remote_repo_open_all(nereid_server_t *s)
{
    s->remotes = xcalloc(s->n_repos ? s->n_repos : 1, sizeof *s->remotes);
    for (size_t i = 0; i < s->n_repos; i++) {
        if (!storage_is_remote(s->repos[i])) continue;
        nereid_error_t *err = NULL;
        storage_remote_t *r = storage_remote_open(s->repos[i], &err);
        if (!r) return err;
        s->remotes[i] = r;
        free(s->repos[i]);
        s->repos[i] = xstrdup(storage_remote_dir(r));
        err = storage_remote_sync(r, NULL);
        if (!err) continue;
        /* Triton: with --exit-on-error a repository that cannot be read
         * stops the start; without, the server starts with what it has
         * (here: nothing from this repository until a poll reads it). */
        if (s->opts.exit_on_error) return err;
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    return NULL;
}

nereid_error_t *remote_repo_sync(nereid_server_t *s, const char *model)
{
    nereid_error_t *first = NULL;
    for (size_t i = 0; s->remotes && i < s->n_repos; i++) {
        if (!s->remotes[i]) continue;
        nereid_error_t *err = storage_remote_sync(s->remotes[i], model);
        if (!err) continue;
        if (!first) {
            first = err;
            continue;
        }
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    return first;
}

nereid_error_t *remote_repo_sync_for_load(nereid_server_t *s, const char *model)
{
    nereid_error_t *err = remote_repo_sync(s, model);
    if (!err) return NULL;
    /* Triton's poll failure, with its cause (Triton logs it only). */
    LOG_ERROR("Poll failed for model directory '%s': %s", model, nereid_error_message(err));
    nereid_error_t *load_err = nereid_error_new(
        NEREID_ERROR_INTERNAL, "failed to load '%s', failed to poll from model repository: %s",
        model, nereid_error_message(err));
    nereid_error_free(err);
    return load_err;
}

void remote_repo_cancel_all(nereid_server_t *s)
{
    for (size_t i = 0; s->remotes && i < s->n_repos; i++)
        if (s->remotes[i]) storage_remote_cancel(s->remotes[i]);
}

void remote_repo_close_all(nereid_server_t *s)
{
    for (size_t i = 0; s->remotes && i < s->n_repos; i++)
        storage_remote_free(s->remotes[i]);
    free(s->remotes);
    s->remotes = NULL;
}
