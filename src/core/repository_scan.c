/*
 * This file contains what the repository reads from disk: a model's version
 * directories (Triton's VersionsToLoad), signatures of its files (Triton's
 * ModelTimestamp, for the poll and for reloads), the temporary directory of
 * a load's file overrides (Triton's LocalizeRepoAgent), its config read and
 * normalized (Triton's GetNormalizedModelConfig, model_config_utils.cc),
 * the versions its policy chooses and the model directories of the
 * repositories. Triton keeps this in core's filesystem/ and in
 * model_repository_manager.cc; nothing here takes a server lock.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "core/repository.h"
#include "core/repository_internal.h"
#include "core/util.h"
#include "nereid/common.h"

/* ---- Files ---- */

bool repo_is_dir(const char *path)
{
    return nereid_is_dir(path);
}

int repo_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

typedef struct version_list {
    int64_t *versions;
    size_t n;
    bool warn; /* log the directories ignored, as Triton's VersionsToLoad */
} version_list_t;

static bool add_version(const char *name, bool subdir, void *arg)
{
    version_list_t *l = arg;
    if (!subdir) return true;
    /* Triton's VersionsToLoad skips these folders without a word. */
    if (!strcmp(name, "warmup") || !strcmp(name, "initial_state") || !strcmp(name, "configs"))
        return true;
    if (strlen(name) > 1 && name[0] == '0') {
        if (l->warn)
            LOG_WARN("ignore version directory '%s' which contains leading zeros in its "
                     "directory name",
                     name);
        return true;
    }
    bool numeric = *name != '\0';
    for (const char *p = name; *p; p++)
        numeric &= isdigit((unsigned char)*p) != 0;
    if (!numeric) {
        /* Triton: std::stoll fails only when no number starts the name */
        const char *p = name;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '+' || *p == '-') p++;
        if (l->warn && !isdigit((unsigned char)*p))
            LOG_WARN("ignore version directory '%s' which fails to convert to integral number",
                     name);
        return true;
    }
    if (strlen(name) > 18) return true;
    l->versions = xrealloc(l->versions, (l->n + 1) * sizeof *l->versions);
    l->versions[l->n++] = strtoll(name, NULL, 10);
    return true;
}

/* The numeric subdirectories of dir (symlinks to directories count),
 * sorted; with warn, each directory ignored is logged as Triton does. */
size_t repo_list_versions(const char *dir, int64_t **out, bool warn)
{
    version_list_t l = {NULL, 0, warn};
    util_dir_each(dir, add_version, &l);
    if (l.n) qsort(l.versions, l.n, sizeof *l.versions, repo_cmp_i64);
    *out = l.versions;
    return l.n;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

int repo_cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Signature of a directory tree: names, sizes, modification times. */
uint64_t repo_tree_sig(const char *path, uint64_t h, int depth)
{
    struct stat st;
    if (stat(path, &st) != 0) return fnv(h, "?", 1);
    h = fnv(h, &st.st_size, sizeof st.st_size);
    h = fnv(h, &st.st_mtim.tv_sec, sizeof st.st_mtim.tv_sec);
    h = fnv(h, &st.st_mtim.tv_nsec, sizeof st.st_mtim.tv_nsec);
    if (!S_ISDIR(st.st_mode) || depth > 8) return h;
    DIR *d = opendir(path);
    if (!d) return h;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        names = xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, repo_cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = fnv(h, names[i], strlen(names[i]) + 1);
        char *sub = xasprintf("%s/%s", path, names[i]);
        h = repo_tree_sig(sub, h, depth + 1);
        free(sub);
        free(names[i]);
    }
    free(names);
    return h;
}

/* Triton's ModelTimestamp::IsModelVersionModified: what a version's model
 * reads besides its config, the version directory and every other entry of
 * the model directory but the config and the other versions. */
uint64_t repo_version_files_sig(const char *dir, int64_t version)
{
    uint64_t h = 14695981039346656037ULL;
    char *vdir = xasprintf("%s/%lld", dir, (long long)version);
    h = repo_tree_sig(vdir, h, 1);
    free(vdir);
    DIR *d = opendir(dir);
    if (!d) return h;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !strcmp(nm, "config.pbtxt") ||
            !strcmp(nm, "configs") || strspn(nm, "0123456789") == strlen(nm))
            continue;
        names = xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = xstrdup(nm);
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, repo_cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = fnv(h, names[i], strlen(names[i]) + 1);
        char *sub = xasprintf("%s/%s", dir, names[i]);
        h = repo_tree_sig(sub, h, 1);
        free(sub);
        free(names[i]);
    }
    free(names);
    return h;
}

void repo_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                char *sub = xasprintf("%s/%s", path, e->d_name);
                repo_remove_tree(sub);
                free(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Whether a relative path stays inside its directory. */
static bool safe_relpath(const char *p)
{
    if (!p || !*p || p[0] == '/') return false;
    const char *seg = p;
    for (;;) {
        const char *end = strchr(seg, '/');
        size_t len = end ? (size_t)(end - seg) : strlen(seg);
        if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        if (!end) return true;
        seg = end + 1;
    }
}

/* Writes the override files into a new temporary model directory. */
nereid_error_t *repo_make_override_dir(const char *name, const char *const *paths,
                                       const void *const *contents, const size_t *sizes, size_t n,
                                       char **out)
{
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!safe_relpath(paths[i] && paths[i][0] == '/' ? paths[i] + 1 : paths[i]))
            return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                    "failed to load '%s', invalid file path '%s' in override", name,
                                    paths[i] ? paths[i] : "");
    const char *tmp = getenv("TMPDIR");
    char *dir = xasprintf("%s/nereid-model-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INTERNAL,
                             "failed to load '%s', unable to create a temporary directory: %s",
                             name, strerror(errno));
        free(dir);
        return err;
    }
    for (size_t i = 0; i < n; i++) {
        /* "file:/1/model.py" (as Triton's QA sends it) is "1/model.py" */
        char *path = xasprintf("%s/%s", dir, paths[i] + (paths[i][0] == '/'));
        for (char *p = path + strlen(dir) + 1; *p; p++)
            if (*p == '/') {
                *p = 0;
                mkdir(path, 0755);
                *p = '/';
            }
        FILE *f = fopen(path, "wb");
        bool ok = f && (sizes[i] == 0 || fwrite(contents[i], 1, sizes[i], f) == sizes[i]);
        if (f && fclose(f) != 0) ok = false;
        free(path);
        if (!ok) {
            repo_remove_tree(dir);
            free(dir);
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "failed to load '%s', failed to poll from model repository: "
                                    "unable to write override file '%s'",
                                    name, paths[i]);
        }
    }
    *out = dir;
    return NULL;
}

/* ---- Configs and versions ---- */

/* Replaces a protobuf-c string field (which may hold the static empty string). */
void repo_set_pb_string(char **field, const char *value)
{
    if (*field && *field != protobuf_c_empty_string) free(*field);
    *field = xstrdup(value);
}

static char *trim_errors(char *errors)
{
    char *msg = xstrdup(errors ? errors : "unknown error");
    size_t len = strlen(msg);
    while (len && msg[len - 1] == '\n')
        msg[--len] = 0;
    free(errors);
    return msg;
}

bool repo_autofill_allowed(const nereid_server_t *s)
{
    return !s->opts.strict_model_config && !s->opts.disable_auto_complete_config;
}

/* The model's config file: configs/<--model-config-name>.pbtxt when the
 * flag is set and the file exists, else config.pbtxt (Triton's
 * GetModelConfigFullPath). Caller frees. */
static char *config_path(const nereid_server_t *s, const char *dir)
{
    if (s->model_config_name) {
        char *custom = xasprintf("%s/configs/%s.pbtxt", dir, s->model_config_name);
        if (nereid_is_file(custom)) return custom;
        free(custom);
    }
    return xasprintf("%s/config.pbtxt", dir);
}

/* Reads (or takes the override of) a model's config and normalizes it. */
nereid_error_t *repo_read_config(nereid_server_t *s, const char *name, const char *dir,
                                 const char *override_json, model_config_t **out)
{
    *out = NULL;
    char *path = config_path(s, dir);
    char *errors = NULL;
    model_config_t *cfg = NULL;
    if (override_json) {
        cfg = config_from_json(override_json, strlen(override_json), &errors);
        if (!cfg) {
            /* Triton: the poll fails ("Invalid config override: ..."). */
            char *msg = trim_errors(errors);
            nereid_error_t *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                                   "failed to load '%s', failed to poll from model "
                                                   "repository: Invalid config override: %s",
                                                   name, msg);
            free(msg);
            free(path);
            return err;
        }
    } else if (nereid_is_file(path)) {
        cfg = config_parse_file(path, &errors);
    } else if (s->opts.strict_model_config) {
        /* Triton reads the file it was not allowed to guess (ReadTextProto):
         * L0_lifecycle greps this text. */
        errors = xasprintf("failed to open text file for read %s: No such file or directory", path);
    } else {
        cfg = config_from_json("{}", 2, &errors);
    }
    if (cfg) {
        if (!cfg->name[0]) repo_set_pb_string(&cfg->name, name);
        /* A backend the config leaves out is guessed from the model's files
         * by config_normalize (Triton's AutoCompleteBackendFields). */
        config_options_t opts = {.gpus_available = false,
                                 .allow_missing_io = repo_autofill_allowed(s),
                                 .model_dir = dir};
        if (config_normalize(cfg, name, path, &opts, &errors) != 0) {
            config_free(cfg);
            cfg = NULL;
        }
    }
    if (!cfg) {
        char *msg = trim_errors(errors);
        /* Triton: an override its poll refuses (e.g. a name other than the
         * one loaded) fails the load with "failed to poll"; no file of the
         * override is named. */
        size_t plen = strlen(path);
        const char *why = msg;
        if (override_json && !strncmp(why, path, plen) && why[plen] == ':') {
            why += plen + 1;
            while (*why == ' ' || (*why >= '0' && *why <= '9') || *why == ':')
                why++;
        }
        nereid_error_t *err =
            override_json ? nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                             "failed to load '%s', failed to poll from model "
                                             "repository: %s",
                                             name, why)
                          : nereid_error_new(NEREID_ERROR_INVALID_ARG, "%s", msg);
        free(msg);
        free(path);
        return err;
    }
    free(path);
    *out = cfg;
    return NULL;
}

bool repo_is_ensemble(const model_config_t *cfg)
{
    return cfg && strcmp(cfg->platform, "ensemble") == 0;
}

/* Which versions the policy selects from those on disk. */
size_t repo_select_versions(const model_config_t *cfg, const int64_t *avail, size_t n, int64_t *out)
{
    const Inference__ModelVersionPolicy *p = cfg->version_policy;
    size_t k = 0;
    if (p && p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_ALL) {
        for (size_t i = 0; i < n; i++)
            out[k++] = avail[i];
    } else if (p &&
               p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_SPECIFIC) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < p->specific->n_versions; j++)
                if (p->specific->versions[j] == avail[i]) {
                    out[k++] = avail[i];
                    break;
                }
    } else {
        size_t want = 1;
        if (p && p->policy_choice_case == INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST &&
            p->latest->num_versions > 0)
            want = p->latest->num_versions;
        for (size_t i = n > want ? n - want : 0; i < n; i++)
            out[k++] = avail[i];
    }
    return k;
}

/* Newest modification time (wall-clock ns) of dir's entries, as Triton's
 * ModelTimestamp of a model directory's contents; 0 if unreadable. */
int64_t repo_dir_contents_mtime_ns(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t newest = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = xasprintf("%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) == 0) {
            int64_t t = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
            if (t > newest) newest = t;
        }
        free(p);
    }
    closedir(d);
    return newest;
}

/* Model directory names across the repositories (sorted, unique); with
 * --model-namespacing each repository's model keys. */
size_t repo_scan_names(nereid_server_t *s, char ***out, nereid_error_t **err)
{
    char **names = NULL;
    size_t n = 0;
    *err = NULL;
    for (size_t r = 0; r < s->n_repos; r++) {
        DIR *d = opendir(s->repos[r]);
        if (!d) {
            if (!*err)
                *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "failed to open model repository '%s': %s", s->repos[r],
                                        strerror(errno));
            continue;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char *dir = xasprintf("%s/%s", s->repos[r], de->d_name);
            bool ok = repo_is_dir(dir) && !strchr(de->d_name, NS_SEP);
            free(dir);
            if (!ok) continue;
            if (n % 64 == 0) names = xrealloc(names, (n + 64) * sizeof *names);
            names[n++] = repo_make_key(s, de->d_name, s->repos[r]);
        }
        closedir(d);
    }
    if (n) qsort(names, n, sizeof *names, repo_cmp_str);
    size_t unique = 0; /* a name in two repositories is listed once */
    for (size_t i = 0; i < n; i++) {
        if (unique && strcmp(names[unique - 1], names[i]) == 0) {
            free(names[i]);
            continue;
        }
        names[unique++] = names[i];
    }
    n = unique;
    *out = names;
    return n;
}
