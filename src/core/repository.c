/*
 * This file contains model management: scanning the repositories, reading
 * configs, choosing versions, loading them (in parallel at start-up),
 * explicit load (config and file overrides) / unload (with dependents),
 * ensembles' composing models, and poll mode's rescans.
 *
 * A (re)load prepares the new versions without any server lock, then swaps
 * them into the entry under the write lock, then drains the replaced
 * versions: requests already queued on them finish there, new requests find
 * the new versions. A version that fails to reload keeps its old model
 * serving, with the failure as its reason.
 *
 * Loads, unloads, polls and on-demand loads take turns under s->control,
 * but let go of it while a backend runs the model's own code (its init and
 * its finalize): that code may load or unload other models itself (a Python
 * model's pb_utils.load_model in initialize), and unrelated models load
 * meanwhile, as Triton loads them in parallel. The models an operation is
 * working on stay claimed until it is done; another operation on one of
 * them waits for it, as Triton waits on a conflicting load ("Control").
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/loader.h"
#include "core/core.h"
#include "core/repository.h"
#include "core/util.h"

#define MAX_ENSEMBLE_DEPTH 16

/* ---- Files ---- */

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_i64(const void *a, const void *b)
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
static size_t list_versions(const char *dir, int64_t **out, bool warn)
{
    version_list_t l = {NULL, 0, warn};
    util_dir_each(dir, add_version, &l);
    if (l.n) qsort(l.versions, l.n, sizeof *l.versions, cmp_i64);
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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Signature of a directory tree: names, sizes, modification times. */
static uint64_t tree_sig(const char *path, uint64_t h, int depth)
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
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = fnv(h, names[i], strlen(names[i]) + 1);
        char *sub = xasprintf("%s/%s", path, names[i]);
        h = tree_sig(sub, h, depth + 1);
        free(sub);
        free(names[i]);
    }
    free(names);
    return h;
}

/* Triton's ModelTimestamp::IsModelVersionModified: what a version's model
 * reads besides its config, the version directory and every other entry of
 * the model directory but the config and the other versions. */
static uint64_t version_files_sig(const char *dir, int64_t version)
{
    uint64_t h = 14695981039346656037ULL;
    char *vdir = xasprintf("%s/%lld", dir, (long long)version);
    h = tree_sig(vdir, h, 1);
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
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        h = fnv(h, names[i], strlen(names[i]) + 1);
        char *sub = xasprintf("%s/%s", dir, names[i]);
        h = tree_sig(sub, h, 1);
        free(sub);
        free(names[i]);
    }
    free(names);
    return h;
}

/* Triton's ConfigChangeRequiresReload compares configs without their
 * instance_group and version_policy: the JSON of cfg without them. */
static char *reload_key(const model_config_t *cfg)
{
    model_config_t c = *cfg;
    c.n_instance_group = 0;
    c.instance_group = NULL;
    c.version_policy = NULL;
    return config_to_json(&c);
}

static void remove_tree(const char *path)
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
                remove_tree(sub);
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

/* A model name is one directory name inside its repository: no '/', not
 * "." or "..". A '\\' is an ordinary character on POSIX file systems, and
 * Triton lets it through (its backends decide: the Python backend refuses
 * it in a stub name). */
static bool valid_model_name(const char *name)
{
    return name && *name && !strchr(name, '/') && !strchr(name, NS_SEP) && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

/* ---- Model keys (--model-namespacing) ---- */

static bool ns_on(const nereid_server_t *s)
{
    return s->opts.model_namespacing;
}

/* The key of model name in repository repo (NULL: none). */
static char *make_key(const nereid_server_t *s, const char *name, const char *repo)
{
    return ns_on(s) && repo ? xasprintf("%s%c%s", name, NS_SEP, repo) : xstrdup(name);
}

/* The name part of key (a new string); *ns points at its namespace in key,
 * or is NULL. */
static char *key_split(const char *key, const char **ns)
{
    const char *sep = strchr(key, NS_SEP);
    *ns = sep ? sep + 1 : NULL;
    if (!sep) return xstrdup(key);
    size_t n = (size_t)(sep - key);
    char *name = xmalloc(n + 1);
    memcpy(name, key, n);
    name[n] = '\0';
    return name;
}

/* Whether key is model name's key (in any namespace). */
static bool key_is_name(const char *key, const char *name)
{
    size_t n = strlen(name);
    return strncmp(key, name, n) == 0 && (key[n] == '\0' || key[n] == NS_SEP);
}

/* The key an ensemble step's model has once the ensemble is loaded (its
 * model_namespace, as Triton sets it, says which copy). */
static char *step_key(const nereid_server_t *s, const Inference__ModelEnsembling__Step *st)
{
    const char *ns = st->model_namespace && *st->model_namespace ? st->model_namespace : NULL;
    return make_key(s, st->model_name, ns);
}

/* Triton's ValidateModelName for explicit loads: the name, trimmed of
 * whitespace, must not be empty, ".." or contain a '/' (nor, here, be ".":
 * the repository itself). */
static nereid_error_t *check_load_name(const char *name)
{
    const char *ws = " \t\n\v\f\r";
    if (!name) name = "";
    size_t start = strspn(name, ws), len = strlen(name + start);
    while (len && strchr(ws, name[start + len - 1]))
        len--;
    if (len == 0)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "Model name cannot be empty. Please enter a valid name to deploy.");
    const char *t = name + start;
    bool dots = (len == 2 && memcmp(t, "..", 2) == 0) || (len == 1 && t[0] == '.');
    if (dots || memchr(t, '/', len) || !valid_model_name(name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "invalid model name '%s', model name must not contain path "
                                "traversal characters",
                                name);
    return NULL;
}

/* Writes the override files into a new temporary model directory. */
static nereid_error_t *make_override_dir(const char *name, const char *const *paths,
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
            remove_tree(dir);
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
static void set_pb_string(char **field, const char *value)
{
    if (*field && *field != protobuf_c_empty_string) free(*field);
    *field = xstrdup(value);
}

/* Infers platform/backend from the files of the version directories. */
static void infer_platform(model_config_t *cfg, const char *dir)
{
    if (cfg->platform[0] || cfg->backend[0]) return;
    int64_t *versions;
    size_t n = list_versions(dir, &versions, false);
    static const struct {
        const char *file, *platform, *backend;
    } known[] = {{"model.onnx", "onnxruntime_onnx", "onnxruntime"},
                 {"model.pt", "pytorch_libtorch", "pytorch"}};
    for (size_t v = n; v-- > 0;) {
        for (size_t k = 0; k < ARRAY_LEN(known); k++) {
            char *path = xasprintf("%s/%" PRId64 "/%s", dir, versions[v], known[k].file);
            bool found = is_file(path) || is_dir(path);
            free(path);
            if (found) {
                set_pb_string(&cfg->platform, known[k].platform);
                set_pb_string(&cfg->backend, known[k].backend);
                free(versions);
                return;
            }
        }
    }
    free(versions);
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

static bool autofill_allowed(const nereid_server_t *s)
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
        if (is_file(custom)) return custom;
        free(custom);
    }
    return xasprintf("%s/config.pbtxt", dir);
}

/* Reads (or takes the override of) a model's config and normalizes it. */
static nereid_error_t *read_config(nereid_server_t *s, const char *name, const char *dir,
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
    } else if (is_file(path)) {
        cfg = config_parse_file(path, &errors);
    } else if (s->opts.strict_model_config) {
        errors = xasprintf("%s: config.pbtxt not found and --strict-model-config is true", path);
    } else {
        cfg = config_from_json("{}", 2, &errors);
    }
    if (cfg) {
        if (!cfg->name[0]) set_pb_string(&cfg->name, name);
        infer_platform(cfg, dir);
        config_options_t opts = {.gpus_available = false, .allow_missing_io = autofill_allowed(s)};
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

static bool is_ensemble(const model_config_t *cfg)
{
    return cfg && strcmp(cfg->platform, "ensemble") == 0;
}

/* Which versions the policy selects from those on disk. */
static size_t select_versions(const model_config_t *cfg, const int64_t *avail, size_t n,
                              int64_t *out)
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

static char *error_reason(const nereid_error_t *err)
{
    return xasprintf("%s: %s", nereid_error_code_name(nereid_error_code(err)),
                     nereid_error_message(err));
}

/* ---- Entries ---- */

/* Index of the first entry whose key is not less than name (s->models is
 * sorted by key): a binary search, so a lookup stays cheap with thousands
 * of models. */
static size_t entry_lower_bound(const nereid_server_t *s, const char *name)
{
    size_t lo = 0, hi = s->n_models;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->models[mid]->key, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

model_entry_t *repository_find(nereid_server_t *s, const char *key)
{
    size_t i = entry_lower_bound(s, key);
    return i < s->n_models && strcmp(s->models[i]->key, key) == 0 ? s->models[i] : NULL;
}

model_entry_t *repository_resolve(nereid_server_t *s, const char *ns, const char *name,
                                  nereid_error_t **err)
{
    *err = NULL;
    if (!name || strchr(name, NS_SEP)) return NULL;
    if (!ns_on(s)) return repository_find(s, name);
    if (ns) {
        char *key = make_key(s, name, ns);
        model_entry_t *e = repository_find(s, key);
        free(key);
        return e;
    }
    model_entry_t *first = NULL, *known = NULL;
    size_t n_known = 0;
    for (size_t i = entry_lower_bound(s, name);
         i < s->n_models && strncmp(s->models[i]->key, name, strlen(name)) == 0; i++) {
        model_entry_t *e = s->models[i];
        if (!key_is_name(e->key, name)) continue;
        if (!first) first = e;
        if (e->state != MODEL_UNKNOWN_STATE) {
            n_known++;
            known = e;
        }
    }
    if (n_known > 1) {
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "There are %zu identifiers of model '%s' in global map, model "
                                "namespace must be provided to resolve ambiguity.",
                                n_known, name);
        return NULL;
    }
    return known ? known : first;
}

static void free_versions(version_entry_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].reason);
    free(v);
}

static void entry_free(model_entry_t *e)
{
    free_versions(e->versions, e->n_versions);
    if (e->config) config_free(e->config);
    free(e->config_key);
    free(e->load_dir);
    free(e->name);
    free(e->key);
    free(e->ns);
    free(e->dir);
    free(e->reason);
    for (size_t i = 0; i < e->n_tmp_dirs; i++) {
        remove_tree(e->tmp_dirs[i]);
        free(e->tmp_dirs[i]);
    }
    free(e->tmp_dirs);
    free(e);
}

/* Adds an entry (caller holds the write lock); keeps models sorted by key. */
static model_entry_t *entry_add(nereid_server_t *s, const char *key, const char *dir)
{
    model_entry_t *e = xcalloc(1, sizeof *e);
    const char *ns;
    e->name = key_split(key, &ns);
    e->key = xstrdup(key);
    e->ns = ns ? xstrdup(ns) : NULL;
    e->dir = xstrdup(dir);
    e->state = MODEL_UNKNOWN_STATE;
    size_t at = entry_lower_bound(s, key);
    s->models = xrealloc(s->models, (s->n_models + 1) * sizeof *s->models);
    memmove(&s->models[at + 1], &s->models[at], (s->n_models - at) * sizeof *s->models);
    s->models[at] = e;
    s->n_models++;
    return e;
}

static bool entry_has_ready(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++)
        if (e->versions[v].state == MODEL_READY) return true;
    return false;
}

/* Directories of model key in the repositories (its own only, when key
 * has a namespace): the first one, and how many. */
static char *locate(nereid_server_t *s, const char *key, size_t *count)
{
    char *found = NULL;
    *count = 0;
    const char *ns;
    char *name = key_split(key, &ns);
    for (size_t r = 0; r < s->n_repos; r++) {
        if (ns && strcmp(s->repos[r], ns) != 0) continue;
        char *dir = xasprintf("%s/%s", s->repos[r], name);
        if (is_dir(dir)) {
            (*count)++;
            if (!found) {
                found = dir;
                continue;
            }
        }
        free(dir);
    }
    free(name);
    return found;
}

/* Triton's ConnectDependencyGraph with --model-namespacing: a step names the
 * model in its ensemble's own repository first, else the one repository
 * that has it. The step's key, or NULL when no repository or several have
 * it. Without namespacing the step's name. */
static char *resolve_step(nereid_server_t *s, const char *ens_ns, const char *step)
{
    if (!ns_on(s)) return xstrdup(step);
    if (!valid_model_name(step)) return NULL;
    size_t count;
    if (ens_ns) {
        char *key = make_key(s, step, ens_ns);
        free(locate(s, key, &count));
        if (count) return key;
        free(key);
    }
    char *found = NULL;
    size_t n = 0;
    for (size_t r = 0; r < s->n_repos; r++) {
        char *dir = xasprintf("%s/%s", s->repos[r], step);
        if (is_dir(dir)) {
            n++;
            free(found);
            found = make_key(s, step, s->repos[r]);
        }
        free(dir);
    }
    if (n == 1) return found;
    free(found);
    return NULL;
}

/* ---- Control ---- */

struct repository_claim {
    char *key;
    pthread_t owner;
    bool handed_off; /* to a thread that has not taken it over yet: no owner */
};

/* Claims model key for the calling operation, waiting while another one has
 * it. held: the caller holds s->control (else, at start-up, it is taken
 * here). A claim the calling thread already has is refused: a model's own
 * init (on the thread loading it) cannot load or unload that model, and
 * waiting would never end. */
static nereid_error_t *claim(nereid_server_t *s, const char *key, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    nereid_error_t *err = NULL;
    for (bool waited = false;; waited = true) {
        if (waited && atomic_load(&s->stopping)) {
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
            break;
        }
        size_t i = 0;
        while (i < s->n_claims && strcmp(s->claims[i].key, key) != 0)
            i++;
        if (i == s->n_claims) {
            s->claims = xrealloc(s->claims, (s->n_claims + 1) * sizeof *s->claims);
            s->claims[s->n_claims++] =
                (struct repository_claim){xstrdup(key), pthread_self(), false};
            break;
        }
        if (!s->claims[i].handed_off && pthread_equal(s->claims[i].owner, pthread_self())) {
            const char *ns;
            char *name = key_split(key, &ns);
            err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                   "model '%s' is being loaded or unloaded by the call that "
                                   "made this one",
                                   name);
            free(name);
            break;
        }
        pthread_cond_wait(&s->claim_ended, &s->control);
    }
    if (!held) pthread_mutex_unlock(&s->control);
    return err;
}

static void unclaim(nereid_server_t *s, const char *key, bool held)
{
    if (!held) pthread_mutex_lock(&s->control);
    for (size_t i = 0; i < s->n_claims; i++) {
        if (strcmp(s->claims[i].key, key) != 0) continue;
        free(s->claims[i].key);
        s->claims[i] = s->claims[--s->n_claims];
        break;
    }
    if (!s->n_claims) {
        free(s->claims);
        s->claims = NULL;
    }
    pthread_cond_broadcast(&s->claim_ended);
    if (!held) pthread_mutex_unlock(&s->control);
}

/* Whether an operation works on model key. Caller holds s->control. */
static bool claimed(const nereid_server_t *s, const char *key)
{
    for (size_t i = 0; i < s->n_claims; i++)
        if (strcmp(s->claims[i].key, key) == 0) return true;
    return false;
}

/* Around a backend's model code (init, finalize): s->control is let go when
 * the caller holds it, so that code may itself load or unload models, and
 * other operations run meanwhile. */
static void control_lend(nereid_server_t *s, bool held)
{
    if (held) pthread_mutex_unlock(&s->control);
}

static void control_take_back(nereid_server_t *s, bool held)
{
    if (held) pthread_mutex_lock(&s->control);
}

/* ---- Loading ---- */

typedef struct load_ctx {
    const char *chain[MAX_ENSEMBLE_DEPTH + 1]; /* ensembles being loaded, outermost first */
    size_t depth;
    bool load_deps;         /* load an ensemble's composing models that are not ready */
    bool force;             /* reload versions even when nothing changed */
    bool held;              /* the caller holds s->control (all but start-up) */
    model_config_t *config; /* the model's config already read from its directory, or
                               NULL; taken (and freed) by load_model */
} load_ctx_t;

static nereid_error_t *load_model(nereid_server_t *s, const char *name, const char *override_json,
                                  const char *const *paths, const void *const *contents,
                                  const size_t *sizes, size_t n_files, load_ctx_t *ctx);

static bool model_ready(nereid_server_t *s, const char *name)
{
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    bool ready = e && entry_has_ready(e);
    pthread_rwlock_unlock(&s->lock);
    return ready;
}

/* The entry state of name (MODEL_UNKNOWN_STATE when never tried) and, when
 * failed, a copy of its reason. */
static model_state_t entry_state(nereid_server_t *s, const char *name, char **reason)
{
    if (reason) *reason = NULL;
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    model_state_t st = e ? e->state : MODEL_UNKNOWN_STATE;
    if (reason && e && !entry_has_ready(e)) {
        const char *r = e->reason;
        for (size_t v = 0; !r && v < e->n_versions; v++)
            r = e->versions[v].reason;
        if (r) *reason = xstrdup(r);
    }
    pthread_rwlock_unlock(&s->lock);
    return st;
}

static bool version_ready(nereid_server_t *s, const char *name, int64_t version)
{
    pthread_rwlock_rdlock(&s->lock);
    model_entry_t *e = repository_find(s, name);
    bool ready = false;
    for (size_t v = 0; e && v < e->n_versions && !ready; v++)
        ready = e->versions[v].version == version && e->versions[v].state == MODEL_READY;
    pthread_rwlock_unlock(&s->lock);
    return ready;
}

/* The composing model keys of the ensemble in directory key (none when it
 * is not an ensemble or its config does not read), as a new array. */
static char **ensemble_steps(nereid_server_t *s, const char *key, size_t *n)
{
    *n = 0;
    size_t count;
    char *dir = locate(s, key, &count);
    const char *ns;
    char *name = key_split(key, &ns);
    model_config_t *cfg = NULL;
    if (dir) nereid_error_free(read_config(s, name, dir, NULL, &cfg));
    free(dir);
    free(name);
    char **out = NULL;
    if (is_ensemble(cfg) && cfg->ensemble_scheduling) {
        const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
        out = xcalloc(es->n_step ? es->n_step : 1, sizeof *out);
        for (size_t i = 0; i < es->n_step; i++) {
            char *step = resolve_step(s, ns, es->step[i]->model_name);
            if (step) out[(*n)++] = step;
        }
    }
    if (cfg) config_free(cfg);
    return out;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Triton's circular dependency check: walks the composing models of
 * current (upstream, depth first) looking for start. */
static nereid_error_t *find_cycle(nereid_server_t *s, const char *start, const char *current,
                                  char **steps, size_t n_steps, int depth)
{
    nereid_error_t *err = NULL;
    for (size_t i = 0; i < n_steps && !err; i++) {
        size_t count;
        char *dir = locate(s, steps[i], &count);
        free(dir);
        if (count == 0) continue;
        if (strcmp(steps[i], start) == 0) {
            const char *ns;
            char *start_name = key_split(start, &ns), *cur_name = key_split(current, &ns);
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "circular dependency between ensembles: %s -> ... -> %s -> %s",
                                   start_name, cur_name, start_name);
            free(start_name);
            free(cur_name);
        } else if (depth < MAX_ENSEMBLE_DEPTH) {
            size_t n;
            char **up = ensemble_steps(s, steps[i], &n);
            err = find_cycle(s, start, steps[i], up, n, depth + 1);
            free_names(up, n);
        }
    }
    return err;
}

/* Makes every composing model of an ensemble ready (loading it when
 * ctx->load_deps, or when it is an ensemble not tried yet). Triton's checks
 * and texts, in its order: composing models that do not exist, circular
 * dependencies, then each composing model's state. */
static nereid_error_t *load_dependencies(nereid_server_t *s, const char *key, const char *name,
                                         model_config_t *cfg, load_ctx_t *ctx)
{
    const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
    size_t n_steps = es ? es->n_step : 0;
    const char *ens_ns;
    free(key_split(key, &ens_ns));
    char **steps = xcalloc(n_steps ? n_steps : 1, sizeof *steps);
    /* missing ones: sorted, unique, comma separated (Triton keeps a set) */
    char **missing = xcalloc(n_steps ? n_steps : 1, sizeof *missing);
    size_t n_missing = 0;
    for (size_t i = 0; i < n_steps; i++) {
        const char *step = es->step[i]->model_name;
        steps[i] = resolve_step(s, ens_ns, step);
        size_t count = 0, at = 0;
        if (steps[i]) free(locate(s, steps[i], &count));
        if (count != 0) {
            if (ns_on(s)) { /* Triton sets the namespace it found in the step */
                const char *step_ns;
                free(key_split(steps[i], &step_ns));
                set_pb_string(&es->step[i]->model_namespace, step_ns ? step_ns : "");
            }
            continue;
        }
        if (!steps[i]) steps[i] = xstrdup(step);
        while (at < n_missing && strcmp(missing[at], step) < 0)
            at++;
        if (at < n_missing && strcmp(missing[at], step) == 0) continue;
        memmove(&missing[at + 1], &missing[at], (n_missing - at) * sizeof *missing);
        missing[at] = es->step[i]->model_name;
        n_missing++;
    }
    char *list = xstrdup("");
    for (size_t k = 0; k < n_missing; k++) {
        char *m = xasprintf("%s%s%s", list, k ? ", " : "", missing[k]);
        free(list);
        list = m;
    }
    free(missing);
    nereid_error_t *err = NULL;
    if (n_missing) /* Triton names the ensemble <namespace>::<name> */
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "ensemble %s%s%s contains models that are not available or "
                               "ambiguous: %s",
                               ens_ns ? ens_ns : "", ens_ns ? "::" : "", name, list);
    free(list);
    if (!err) err = find_cycle(s, key, name, steps, n_steps, 0);
    for (size_t i = 0; !err && i < n_steps; i++) {
        const char *dep_key = steps[i];
        const char *dep = es->step[i]->model_name;
        int64_t version = es->step[i]->model_version;
        if (!model_ready(s, dep_key)) {
            char *reason = NULL;
            model_state_t st = entry_state(s, dep_key, &reason);
            size_t n_sub = 0;
            char **sub_steps = NULL;
            bool nested = ctx->load_deps;
            if (!nested && st == MODEL_UNKNOWN_STATE) {
                sub_steps = ensemble_steps(s, dep_key, &n_sub);
                nested = sub_steps != NULL;
                free_names(sub_steps, n_sub);
            }
            if (!nested) {
                if (reason)
                    err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                           "ensemble '%s' depends on '%s' which has no loaded "
                                           "version. Model '%s' loading failed with error: %s",
                                           name, dep, dep, reason);
                else
                    err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                           "ensemble '%s' depends on '%s' which has no loaded "
                                           "version.",
                                           name, dep);
                free(reason);
                break;
            }
            free(reason);
            if (ctx->depth + 1 >= MAX_ENSEMBLE_DEPTH) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "ensemble '%s' nests deeper than %d levels", name,
                                       MAX_ENSEMBLE_DEPTH);
                break;
            }
            load_ctx_t sub = *ctx;
            sub.depth = ctx->depth + 1;
            sub.chain[sub.depth] = dep_key;
            sub.force = false;
            nereid_error_t *lerr = load_model(s, dep_key, NULL, NULL, NULL, NULL, 0, &sub);
            if (lerr && !model_ready(s, dep_key)) {
                err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                       "ensemble '%s' depends on '%s' which has no loaded "
                                       "version. Model '%s' loading failed with error: %s",
                                       name, dep, dep, nereid_error_message(lerr));
                nereid_error_free(lerr);
                break;
            }
            nereid_error_free(lerr);
        }
        if (version > 0 && !version_ready(s, dep_key, version))
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                   "ensemble '%s' depends on '%s' whose required version %lld is "
                                   "not loaded.",
                                   name, dep, (long long)version);
    }
    free_names(steps, n_steps);
    return err;
}

static void set_entry_failure(nereid_server_t *s, model_entry_t *e, const nereid_error_t *err,
                              uint64_t sig)
{
    pthread_rwlock_wrlock(&s->lock);
    e->tree_sig = sig;
    free(e->reason);
    e->reason = error_reason(err);
    if (entry_has_ready(e)) {
        /* A broken change: the served versions stay, and say why. */
        for (size_t v = 0; v < e->n_versions; v++) {
            free(e->versions[v].reason);
            e->versions[v].reason = xstrdup(e->reason);
        }
    } else {
        /* Rows of earlier (unloaded, failed) versions give way to the
         * model-level failure. */
        free_versions(e->versions, e->n_versions);
        e->versions = NULL;
        e->n_versions = 0;
        e->state = MODEL_UNAVAILABLE;
    }
    pthread_rwlock_unlock(&s->lock);
}

static void add_tmp_dir(model_entry_t *e, char *dir)
{
    e->tmp_dirs = xrealloc(e->tmp_dirs, (e->n_tmp_dirs + 1) * sizeof *e->tmp_dirs);
    e->tmp_dirs[e->n_tmp_dirs++] = dir;
}

/* Removes override directories no served version was loaded from (their
 * models have been drained and read their files at load). */
static void drop_unused_tmp_dirs(nereid_server_t *s, model_entry_t *e)
{
    pthread_rwlock_wrlock(&s->lock);
    size_t w = 0;
    for (size_t i = 0; i < e->n_tmp_dirs; i++) {
        char *d = e->tmp_dirs[i];
        bool used = e->load_dir && strcmp(e->load_dir, d) == 0;
        for (size_t v = 0; v < e->n_versions && !used; v++)
            used = e->versions[v].model && strcmp(e->versions[v].model->dir, d) == 0;
        if (used) {
            e->tmp_dirs[w++] = d;
        } else {
            remove_tree(d);
            free(d);
        }
    }
    e->n_tmp_dirs = w;
    pthread_rwlock_unlock(&s->lock);
}

/* load_model of key, whose name and namespace (or NULL) are given. */
static int cmp_version_entry(const void *a, const void *b)
{
    return cmp_i64(&((const version_entry_t *)a)->version, &((const version_entry_t *)b)->version);
}

/* Newest modification time (wall-clock ns) of dir's entries, as Triton's
 * ModelTimestamp of a model directory's contents; 0 if unreadable. */
static int64_t dir_contents_mtime_ns(const char *dir)
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

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Unloads one version's model, with Triton's line (ModelLifeCycle's
 * OnDestroy: one per version). */
static void unload_version(const char *name, int64_t version, model_t *m)
{
    model_unload(m);
    LOG_INFO("successfully unloaded '%s' version %" PRId64, name, version);
}

static nereid_error_t *load_model_as(nereid_server_t *s, const char *key, const char *name,
                                     const char *ns, const char *override_json,
                                     const char *const *paths, const void *const *contents,
                                     const size_t *sizes, size_t n_files, load_ctx_t *ctx)
{
    if (!valid_model_name(name))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'",
                                name ? name : "");
    size_t count;
    char *dir = locate(s, key, &count);
    char *tmp = NULL;
    if (!dir && override_json && n_files) {
        /* Triton: a model given whole (config and files) needs no
         * directory in a repository; its files' directory stands in. */
        nereid_error_t *err = make_override_dir(name, paths, contents, sizes, n_files, &tmp);
        if (err) return err;
        dir = xstrdup(tmp);
    }
    if (!dir)
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to load '%s', failed to poll from model repository", name);
    /* Only the poll compares signatures: other modes skip the tree walk. */
    uint64_t sig = s->opts.model_control_mode == NEREID_MODEL_CONTROL_POLL
                       ? tree_sig(dir, 14695981039346656037ULL, 0)
                       : 0;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (!e) e = entry_add(s, key, dir);
    e->removed = false;
    /* Triton: after a load with a config override, a load without one
     * finds the model unmodified (no reload, the override stays) unless
     * something in its directory changed after the override. */
    if (!override_json && !n_files && !tmp && e->override_ns && entry_has_ready(e) &&
        dir_contents_mtime_ns(dir) <= e->override_ns) {
        pthread_rwlock_unlock(&s->lock);
        free(dir);
        return NULL;
    }
    if (!entry_has_ready(e)) e->state = MODEL_LOADING;
    pthread_rwlock_unlock(&s->lock);
    if (count > 1) {
        nereid_error_t *err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG, "model appears in two or more repositories");
        pthread_rwlock_wrlock(&s->lock);
        e->tree_sig = sig;
        e->state = MODEL_UNAVAILABLE;
        free(e->reason);
        e->reason = xstrdup("model appears in two or more repositories");
        pthread_rwlock_unlock(&s->lock);
        free(dir);
        return err;
    }

    nereid_error_t *err = NULL;
    if (n_files && !tmp) {
        err = make_override_dir(name, paths, contents, sizes, n_files, &tmp);
        if (err) {
            free(dir);
            if (!entry_has_ready(e)) set_entry_failure(s, e, err, sig);
            return err;
        }
    }
    const char *load_dir = tmp ? tmp : dir;
    model_config_t *cfg = NULL;
    if (ctx->config && !override_json && !tmp) {
        cfg = ctx->config; /* read by the start-up pass: not twice */
        ctx->config = NULL;
    } else {
        err = read_config(s, name, load_dir, override_json, &cfg);
    }
    if (!err && is_ensemble(cfg)) err = load_dependencies(s, key, name, cfg, ctx);
    int64_t *avail = NULL, *chosen = NULL;
    size_t k = 0;
    if (!err) {
        size_t n = list_versions(load_dir, &avail, true);
        chosen = xcalloc(n ? n : 1, sizeof *chosen);
        k = select_versions(cfg, avail, n, chosen);
        free(avail);
        if (k == 0)
            err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                   "failed to load '%s', no version is available", name);
    }
    if (err) {
        LOG_ERROR("failed to load '%s': %s", name, nereid_error_message(err));
        if (k == 0 && cfg && nereid_error_code(err) == NEREID_ERROR_INTERNAL) {
            /* Every version directory is gone: nothing is served any more. */
            pthread_rwlock_wrlock(&s->lock);
            version_entry_t *old = e->versions;
            size_t n_old = e->n_versions;
            e->versions = NULL;
            e->n_versions = 0;
            e->state = MODEL_UNAVAILABLE;
            free(e->reason);
            e->reason = error_reason(err);
            e->tree_sig = sig;
            pthread_rwlock_unlock(&s->lock);
            control_lend(s, ctx->held);
            for (size_t v = 0; v < n_old; v++)
                if (old[v].model) unload_version(name, old[v].version, old[v].model);
            control_take_back(s, ctx->held);
            free_versions(old, n_old);
        } else {
            set_entry_failure(s, e, err, sig);
        }
        if (cfg) config_free(cfg);
        free(chosen);
        if (tmp) {
            remove_tree(tmp);
            free(tmp);
        }
        free(dir);
        return err;
    }

    /* Prepare every chosen version (reusing unchanged ones) without locks. */
    char *cfg_key = config_to_json(cfg);
    pthread_rwlock_rdlock(&s->lock);
    bool same_dir = e->load_dir && strcmp(e->load_dir, load_dir) == 0;
    bool same_config = e->config_key && strcmp(e->config_key, cfg_key) == 0 && same_dir;
    /* Triton updates a served version in place when only its instance
     * groups (or version policy) changed and its files did not. */
    char *old_rkey = same_dir && !tmp && e->config && !is_ensemble(e->config) && !is_ensemble(cfg)
                         ? reload_key(e->config)
                         : NULL;
    pthread_rwlock_unlock(&s->lock);
    char *new_rkey = old_rkey ? reload_key(cfg) : NULL;
    bool may_update = old_rkey && strcmp(old_rkey, new_rkey) == 0;
    free(old_rkey);
    free(new_rkey);
    bool any_updated = false;
    version_entry_t *nv = xcalloc(k, sizeof *nv);
    model_t **fresh = xcalloc(k, sizeof *fresh); /* per version: loaded now, or NULL */
    bool any_new = false, any_failed = false;
    for (size_t i = 0; i < k; i++) {
        nv[i].version = chosen[i];
        model_t *old = NULL;
        uint64_t old_sig = 0;
        pthread_rwlock_rdlock(&s->lock);
        for (size_t v = 0; v < e->n_versions; v++)
            if (e->versions[v].version == chosen[i] && e->versions[v].state == MODEL_READY) {
                old = e->versions[v].model;
                old_sig = e->versions[v].files_sig;
            }
        pthread_rwlock_unlock(&s->lock);
        /* Triton's IsModelVersionModified: a version whose files changed
         * is loaded again even when its config did not. */
        bool same_files =
            old && (same_config || may_update) && version_files_sig(load_dir, chosen[i]) == old_sig;
        if (same_files && same_config && !ctx->force) {
            nv[i].model = old; /* unchanged: the same model keeps serving */
            nv[i].state = MODEL_READY;
            nv[i].files_sig = old_sig;
            continue;
        }
        if (same_files && may_update && model_can_update_instances(old)) {
            control_lend(s, ctx->held);
            nereid_error_t *uerr = model_update_instances(old, cfg);
            control_take_back(s, ctx->held);
            if (uerr && nereid_error_code(uerr) == NEREID_ERROR_UNAVAILABLE) {
                /* an instance cannot leave in place: a full reload */
                LOG_VERBOSE("'%s' version %" PRId64 " reloads: %s", name, chosen[i],
                            nereid_error_message(uerr));
                nereid_error_free(uerr);
                goto reload;
            }
            nv[i].model = old; /* the same model serves, with the new instances */
            nv[i].state = MODEL_READY;
            nv[i].files_sig = old_sig;
            if (uerr) {
                any_failed = true;
                nv[i].reason = error_reason(uerr);
                LOG_ERROR("failed to update '%s' version %" PRId64 ": %s", name, chosen[i],
                          nv[i].reason);
                nereid_error_free(uerr);
            } else {
                any_updated = true;
            }
            continue;
        }
    reload:;
        model_load_args_t args = {
            .name = name,
            .model_namespace = ns,
            .dir = load_dir,
            .version = chosen[i],
            .config = cfg,
            .backend_dir = s->backend_dir,
            .backend_settings = s->backend_settings,
            .n_backend_settings = s->n_backend_settings,
            .autocomplete_allowed = autofill_allowed(s),
        };
        model_t *m = NULL;
        LOG_INFO("loading: %s:%" PRId64, name, chosen[i]);
        control_lend(s, ctx->held);
        nereid_error_t *lerr = model_load(s, &args, &m);
        /* Triton's --model-load-retry-count: each version's load is tried
         * up to that many more times before it counts as failed. */
        for (int retry = 0; lerr && retry < s->opts.model_load_retry_count; retry++) {
            LOG_INFO("retrying load of '%s' version %" PRId64 " (%d of %d): %s", name, chosen[i],
                     retry + 1, s->opts.model_load_retry_count, nereid_error_message(lerr));
            nereid_error_free(lerr);
            m = NULL;
            lerr = model_load(s, &args, &m);
        }
        control_take_back(s, ctx->held);
        if (lerr) {
            any_failed = true;
            nv[i].state = MODEL_UNAVAILABLE;
            nv[i].reason = error_reason(lerr);
            LOG_ERROR("failed to load '%s' version %" PRId64 ": %s", name, chosen[i], nv[i].reason);
            nereid_error_free(lerr);
            if (old) {
                /* Keep the old model of this version serving. */
                nv[i].model = old;
                nv[i].state = MODEL_READY;
            }
        } else {
            nv[i].model = fresh[i] = m;
            nv[i].state = MODEL_READY;
            nv[i].files_sig = version_files_sig(load_dir, chosen[i]);
            any_new = true;
        }
    }
    free(chosen);
    char *err_text = NULL;
    for (size_t i = 0; i < k; i++) {
        if (!nv[i].reason) continue;
        char *prev = err_text;
        err_text = xasprintf("%sversion %" PRId64 " is at UNAVAILABLE state: %s;\n",
                             prev ? prev : "", nv[i].version, nv[i].reason);
        free(prev);
    }
    /* Triton (ModelLifeCycle::OnLoadFinal): when any version fails, every
     * version loaded by this load is unloaded again; what served before
     * keeps serving, the config included. */
    model_t **discard = NULL;
    int64_t *discard_v = NULL;
    size_t n_discard = 0;
    if (any_failed) {
        discard = xcalloc(k, sizeof *discard);
        discard_v = xcalloc(k, sizeof *discard_v);
        pthread_rwlock_rdlock(&s->lock);
        for (size_t i = 0; i < k; i++) {
            if (!fresh[i]) continue;
            discard_v[n_discard] = nv[i].version;
            discard[n_discard++] = fresh[i];
            nv[i].model = NULL;
            nv[i].state = MODEL_UNAVAILABLE;
            nv[i].reason = xstrdup("unloaded");
            for (size_t v = 0; v < e->n_versions; v++)
                if (e->versions[v].version == nv[i].version &&
                    e->versions[v].state == MODEL_READY) {
                    nv[i].model = e->versions[v].model;
                    nv[i].state = MODEL_READY;
                    nv[i].files_sig = e->versions[v].files_sig;
                    free(nv[i].reason);
                    nv[i].reason = NULL;
                }
        }
        /* Serving versions the new policy would not choose stay too. */
        for (size_t v = 0; v < e->n_versions; v++) {
            bool listed = false;
            for (size_t i = 0; i < k; i++)
                listed |= nv[i].version == e->versions[v].version;
            if (listed || e->versions[v].state != MODEL_READY) continue;
            nv = xrealloc(nv, (k + 1) * sizeof *nv);
            memset(&nv[k], 0, sizeof nv[k]);
            nv[k].version = e->versions[v].version;
            nv[k].model = e->versions[v].model;
            nv[k].state = MODEL_READY;
            nv[k].files_sig = e->versions[v].files_sig;
            k++;
        }
        pthread_rwlock_unlock(&s->lock);
        any_new = false;
    }
    /* An ensemble whose step was unloaded while the ensemble loaded (that
     * unload waited for the step's load, not for the ensemble's): Triton's
     * dependency graph unloads the ensemble once its load completes. */
    bool step_gone = false;
    size_t k_fresh = k; /* (k grows only when a version failed) */
    if (!any_failed && is_ensemble(cfg) && cfg->ensemble_scheduling &&
        !s->opts.model_load_on_demand) {
        pthread_rwlock_rdlock(&s->lock);
        const Inference__ModelEnsembling *es = cfg->ensemble_scheduling;
        for (size_t st = 0; st < es->n_step && !step_gone; st++) {
            char *sk = step_key(s, es->step[st]);
            model_entry_t *se = repository_find(s, sk);
            step_gone = !se || !entry_has_ready(se);
            if (step_gone) LOG_INFO("unloading '%s': its step '%s' is unloaded", name, sk);
            free(sk);
        }
        pthread_rwlock_unlock(&s->lock);
    }
    if (step_gone) {
        discard = xcalloc(k, sizeof *discard);
        discard_v = xcalloc(k, sizeof *discard_v);
        for (size_t i = 0; i < k; i++) {
            /* loaded now: discarded here; served before: drained below */
            if (i < k_fresh && fresh[i]) {
                discard_v[n_discard] = nv[i].version;
                discard[n_discard++] = fresh[i];
            }
            nv[i].model = NULL;
            nv[i].state = MODEL_UNAVAILABLE;
            free(nv[i].reason);
            nv[i].reason = xstrdup("unloaded");
        }
    }
    free(fresh);
    /* Triton's OnLoadFinal: one line for the whole load (and its trace line) */
    LOG_VERBOSE2("OnLoadFinal() '%s' for all version(s)", name);
    if (any_failed)
        LOG_INFO("failed to load '%s'", name);
    else if (any_new || any_updated || !same_config)
        LOG_INFO("successfully loaded '%s'", name);

    /* Swap under the write lock; collect what is replaced. */
    model_t **drain = NULL;
    int64_t *drain_v = NULL;
    size_t n_drain = 0;
    pthread_rwlock_wrlock(&s->lock);
    for (size_t v = 0; v < e->n_versions; v++) {
        model_t *m = e->versions[v].model;
        bool kept = false;
        for (size_t i = 0; i < k && m; i++)
            kept |= nv[i].model == m;
        if (m && !kept) {
            drain = xrealloc(drain, (n_drain + 1) * sizeof *drain);
            drain_v = xrealloc(drain_v, (n_drain + 1) * sizeof *drain_v);
            drain_v[n_drain] = e->versions[v].version;
            drain[n_drain++] = m;
        }
    }
    /* Triton keeps every version it had in the model's lifecycle: one the
     * new load no longer chooses (its directory gone, or the policy
     * changed) is UNAVAILABLE "unloaded" ("version N is not at ready
     * state"), not unknown. */
    size_t k_chosen = k;
    for (size_t v = 0; v < e->n_versions; v++) {
        bool listed = false;
        for (size_t i = 0; i < k_chosen; i++)
            listed |= nv[i].version == e->versions[v].version;
        if (listed) continue;
        nv = xrealloc(nv, (k + 1) * sizeof *nv);
        memset(&nv[k], 0, sizeof nv[k]);
        nv[k].version = e->versions[v].version;
        nv[k].state = MODEL_UNAVAILABLE;
        nv[k].reason = xstrdup("unloaded");
        k++;
    }
    if (k > k_chosen) qsort(nv, k, sizeof *nv, cmp_version_entry);
    bool any_ready = false;
    for (size_t i = 0; i < k; i++)
        if (nv[i].state == MODEL_READY) any_ready = true;
    free_versions(e->versions, e->n_versions);
    e->versions = nv;
    e->n_versions = k;
    e->state = any_ready ? MODEL_READY : MODEL_UNAVAILABLE;
    free(e->reason);
    e->reason = step_gone ? xstrdup("unloaded") : NULL;
    e->tree_sig = sig;
    if (any_new || any_updated || !e->config) {
        if (e->config) config_free(e->config);
        e->config = cfg;
        cfg = NULL;
        free(e->config_key);
        e->config_key = cfg_key;
        cfg_key = NULL;
        free(e->load_dir);
        e->load_dir = xstrdup(load_dir);
    }
    if (tmp) add_tmp_dir(e, tmp);
    if (!any_failed) e->override_ns = override_json && !n_files ? wall_ns() : 0;
    pthread_rwlock_unlock(&s->lock);

    control_lend(s, ctx->held);
    for (size_t i = 0; i < n_drain; i++)
        unload_version(name, drain_v[i], drain[i]);
    for (size_t i = 0; i < n_discard; i++)
        unload_version(name, discard_v[i], discard[i]);
    control_take_back(s, ctx->held);
    free(drain);
    free(drain_v);
    free(discard);
    free(discard_v);
    drop_unused_tmp_dirs(s, e);
    if (cfg) config_free(cfg);
    free(cfg_key);
    free(dir);
    if (err_text) {
        size_t len = strlen(err_text);
        if (len && err_text[len - 1] == '\n') err_text[len - 1] = 0;
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "load failed for model '%s': %s", name,
                               err_text);
        free(err_text);
        return err;
    }
    return NULL;
}

/* Loads or reloads model key, claimed meanwhile. */
static nereid_error_t *load_model(nereid_server_t *s, const char *key, const char *override_json,
                                  const char *const *paths, const void *const *contents,
                                  const size_t *sizes, size_t n_files, load_ctx_t *ctx)
{
    if (!key) return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'", "");
    nereid_error_t *err = claim(s, key, ctx->held);
    if (err) return err;
    const char *ns;
    char *name = key_split(key, &ns);
    err = load_model_as(s, key, name, ns, override_json, paths, contents, sizes, n_files, ctx);
    free(name);
    unclaim(s, key, ctx->held);
    return err;
}

/* ---- Unloading ---- */

/* Whether a ready ensemble other than except uses model key. */
/* used_by_other with s->lock held. */
static bool used_by_other_locked(nereid_server_t *s, const char *key, const char *except)
{
    bool used = false;
    for (size_t i = 0; i < s->n_models && !used; i++) {
        model_entry_t *e = s->models[i];
        if (strcmp(e->key, except) == 0 || !entry_has_ready(e) || !is_ensemble(e->config)) continue;
        const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
        for (size_t k = 0; es && k < es->n_step; k++) {
            char *sk = step_key(s, es->step[k]);
            used |= strcmp(sk, key) == 0;
            free(sk);
        }
    }
    return used;
}

static bool used_by_other(nereid_server_t *s, const char *name, const char *except)
{
    pthread_rwlock_rdlock(&s->lock);
    bool used = used_by_other_locked(s, name, except);
    pthread_rwlock_unlock(&s->lock);
    return used;
}

/* An unload in two steps: unload_detach takes model key's versions out of
 * service (UNLOADING: no new request finds them), unload_finish drains and
 * finalizes them and marks the model UNAVAILABLE. */
typedef struct unloading {
    char *key;
    char *name;       /* NULL: no such model */
    model_t **drain;  /* the versions' models */
    int64_t *drain_v; /* ... and their version numbers */
    size_t n_drain;
    char **deps; /* an ensemble's composing models */
    size_t n_deps;
} unloading_t;

/* Caller holds s->control and claimed key. */
static void unload_detach(nereid_server_t *s, const char *key, unloading_t *u)
{
    memset(u, 0, sizeof *u);
    u->key = xstrdup(key);
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (!e) {
        pthread_rwlock_unlock(&s->lock);
        return;
    }
    LOG_VERBOSE2("AsyncUnload() '%s'", e->name); /* Triton's trace line */
    u->drain = xcalloc(e->n_versions ? e->n_versions : 1, sizeof *u->drain);
    u->drain_v = xcalloc(e->n_versions ? e->n_versions : 1, sizeof *u->drain_v);
    for (size_t v = 0; v < e->n_versions; v++) {
        version_entry_t *ve = &e->versions[v];
        if (ve->model) {
            u->drain_v[u->n_drain] = ve->version;
            u->drain[u->n_drain++] = ve->model;
        }
        ve->model = NULL;
        ve->state = MODEL_UNLOADING;
        free(ve->reason);
        ve->reason = NULL;
    }
    if (e->n_versions) e->state = MODEL_UNLOADING;
    /* Dependents: the composing models of an ensemble (Triton unloads them
     * unless another loaded ensemble still uses them). */
    const Inference__ModelEnsembling *es =
        is_ensemble(e->config) ? e->config->ensemble_scheduling : NULL;
    for (size_t k = 0; es && k < es->n_step; k++) {
        char *sk = step_key(s, es->step[k]);
        bool have = false;
        for (size_t j = 0; j < u->n_deps; j++)
            have |= strcmp(u->deps[j], sk) == 0;
        if (have) {
            free(sk);
            continue;
        }
        u->deps = xrealloc(u->deps, (u->n_deps + 1) * sizeof *u->deps);
        u->deps[u->n_deps++] = sk;
    }
    u->name = xstrdup(e->name);
    pthread_rwlock_unlock(&s->lock);
}

/* Caller holds s->control and the claim of u->key; leaves u->deps. */
static void unload_finish(nereid_server_t *s, unloading_t *u)
{
    if (!u->name) return;
    control_lend(s, true);
    for (size_t i = 0; i < u->n_drain; i++)
        unload_version(u->name, u->drain_v[i], u->drain[i]);
    control_take_back(s, true);
    free(u->drain);
    free(u->drain_v);
    u->drain = NULL;
    u->drain_v = NULL;
    free(u->name);
    u->name = NULL;

    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, u->key);
    if (e) {
        for (size_t v = 0; v < e->n_versions; v++) {
            e->versions[v].state = MODEL_UNAVAILABLE;
            free(e->versions[v].reason);
            e->versions[v].reason = xstrdup("unloaded");
        }
        e->state = MODEL_UNAVAILABLE;
        free(e->reason);
        e->reason = xstrdup("unloaded");
        if (e->config) config_free(e->config);
        e->config = NULL;
        free(e->config_key);
        e->config_key = NULL;
        free(e->load_dir);
        e->load_dir = NULL;
    }
    pthread_rwlock_unlock(&s->lock);
    if (e) drop_unused_tmp_dirs(s, e);
}

/* Unloads model key, which the caller claimed; *deps, *n_deps: what an
 * ensemble's dependents are (for the caller to unload). Caller holds
 * s->control. */
static void unload_claimed(nereid_server_t *s, const char *key, char ***deps_out,
                           size_t *n_deps_out)
{
    unloading_t u;
    unload_detach(s, key, &u);
    unload_finish(s, &u);
    free(u.key);
    *deps_out = u.deps;
    *n_deps_out = u.n_deps;
}

static void unload_deps(nereid_server_t *s, const char *key, char **deps, size_t n_deps,
                        bool dependents, int depth);

static void unload_model(nereid_server_t *s, const char *key, bool dependents, int depth);

/* Triton's dependency graph: an ensemble with a step that is no longer
 * loaded is unloaded too. Unloads every ready ensemble that uses key.
 * Caller holds s->control. */
static void unload_users(nereid_server_t *s, const char *key, int depth)
{
    /* (load on demand evicts steps and loads them again on a request) */
    if (depth >= MAX_ENSEMBLE_DEPTH || s->opts.model_load_on_demand) return;
    char **users = NULL;
    size_t n_users = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        model_entry_t *e = s->models[i];
        if (strcmp(e->key, key) == 0 || !entry_has_ready(e) || !is_ensemble(e->config)) continue;
        const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
        bool uses = false;
        for (size_t k = 0; es && k < es->n_step && !uses; k++) {
            char *sk = step_key(s, es->step[k]);
            uses = strcmp(sk, key) == 0;
            free(sk);
        }
        if (!uses) continue;
        users = xrealloc(users, (n_users + 1) * sizeof *users);
        users[n_users++] = xstrdup(e->key);
    }
    pthread_rwlock_unlock(&s->lock);
    for (size_t i = 0; i < n_users; i++) {
        LOG_INFO("unloading '%s': its step '%s' is unloaded", users[i], key);
        unload_model(s, users[i], false, depth + 1);
        free(users[i]);
    }
    free(users);
}

/* Unloads model key (and, when dependents, the composing models no other
 * loaded ensemble uses), and the ensembles that use it. Caller holds
 * s->control. */
static void unload_model(nereid_server_t *s, const char *key, bool dependents, int depth)
{
    nereid_error_t *err = claim(s, key, true);
    if (err) {
        LOG_ERROR("failed to unload '%s': %s", key, nereid_error_message(err));
        nereid_error_free(err);
        return;
    }
    char **deps;
    size_t n_deps;
    unload_claimed(s, key, &deps, &n_deps);
    unclaim(s, key, true);
    unload_users(s, key, depth);
    unload_deps(s, key, deps, n_deps, dependents, depth);
}

/* Unloads (when dependents) the composing models deps of ensemble key that
 * no other loaded ensemble uses; frees deps. Caller holds s->control. */
static void unload_deps(nereid_server_t *s, const char *key, char **deps, size_t n_deps,
                        bool dependents, int depth)
{
    for (size_t i = 0; i < n_deps; i++) {
        if (dependents && depth < MAX_ENSEMBLE_DEPTH && !used_by_other(s, deps[i], key))
            unload_model(s, deps[i], true, depth + 1);
        free(deps[i]);
    }
    free(deps);
}

/* ---- Public control API ---- */

/* --model-namespacing: the keys of model name in the repositories that
 * have it, as a new array (NULL when none). */
static char **name_keys(nereid_server_t *s, const char *name, size_t *n)
{
    char **keys = NULL;
    *n = 0;
    for (size_t r = 0; r < s->n_repos && valid_model_name(name); r++) {
        char *dir = xasprintf("%s/%s", s->repos[r], name);
        if (is_dir(dir)) {
            keys = xrealloc(keys, (*n + 1) * sizeof *keys);
            keys[(*n)++] = make_key(s, name, s->repos[r]);
        }
        free(dir);
    }
    return keys;
}

static nereid_error_t *check_explicit(nereid_server_t *s)
{
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT)
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                "explicit model load / unload is not allowed if polling is "
                                "enabled");
    if (atomic_load(&s->stopping))
        return nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    return NULL;
}

nereid_error_t *nereid_server_load_model(nereid_server_t *s, const char *model,
                                         const char *config_json, const char *const *file_paths,
                                         const void *const *file_contents, const size_t *file_sizes,
                                         size_t n_files)
{
    nereid_error_t *err = check_explicit(s);
    if (err) return err;
    err = check_load_name(model);
    if (err) return err;
    if (n_files && (!file_paths || !file_contents || !file_sizes))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "file overrides are incomplete");
    /* Triton: file overrides come with a config override or the poll fails
     * (LocalizeRepoAgent: the override files are the whole model, not a patch
     * of its repository directory); the model stays as it was. */
    if (n_files && !config_json) {
        LOG_ERROR("Poll failed for model directory '%s': Load parameter 'config' must be "
                  "specified for model file override",
                  model);
        return nereid_error_new(NEREID_ERROR_INTERNAL,
                                "failed to load '%s', failed to poll from model repository", model);
    }
    pthread_mutex_lock(&s->control);
    err = n_files ? NULL : remote_repo_sync_for_load(s, model); /* object storage */
    if (err) {
        pthread_mutex_unlock(&s->control);
        return err;
    }
    /* With --model-namespacing every repository's copy loads (Triton polls
     * the name in each repository). */
    size_t n_keys = 0;
    char **keys = ns_on(s) ? name_keys(s, model, &n_keys) : NULL;
    for (size_t i = 0; i < (n_keys ? n_keys : 1); i++) {
        const char *key = n_keys ? keys[i] : model;
        load_ctx_t ctx = {
            .depth = 0, .load_deps = true, .force = config_json || n_files, .held = true};
        ctx.chain[0] = key;
        nereid_error_t *lerr =
            load_model(s, key, config_json, file_paths, file_contents, file_sizes, n_files, &ctx);
        if (err)
            nereid_error_free(lerr);
        else
            err = lerr;
    }
    free_names(keys, n_keys);
    pthread_mutex_unlock(&s->control);
    return err;
}

/* The keys an unload of model means: every namespace's copy with
 * --model-namespacing. Caller holds s->control. */
static char **unload_keys(nereid_server_t *s, const char *model, size_t *n)
{
    char **keys = NULL;
    *n = 0;
    if (!ns_on(s)) {
        keys = xcalloc(1, sizeof *keys);
        keys[(*n)++] = xstrdup(model);
        return keys;
    }
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        if (key_is_name(s->models[i]->key, model)) {
            keys = xrealloc(keys, (*n + 1) * sizeof *keys);
            keys[(*n)++] = xstrdup(s->models[i]->key);
        }
    pthread_rwlock_unlock(&s->lock);
    return keys;
}

/* An unload whose versions are out of service, finished on its own thread
 * (nereid_server_unload_model_async). */
typedef struct async_unload {
    nereid_server_t *s;
    unloading_t u;
    bool dependents;
} async_unload_t;

/* Hands the claim of key over (handing_off: to a thread still to start),
 * or has the calling thread take it over. Caller holds s->control. */
static void claim_transfer(nereid_server_t *s, const char *key, bool handing_off)
{
    for (size_t i = 0; i < s->n_claims; i++)
        if (strcmp(s->claims[i].key, key) == 0) {
            s->claims[i].owner = pthread_self();
            s->claims[i].handed_off = handing_off;
        }
}

/* Caller holds s->control. */
static void async_unload_run(async_unload_t *a)
{
    nereid_server_t *s = a->s;
    claim_transfer(s, a->u.key, false);
    unload_finish(s, &a->u);
    unclaim(s, a->u.key, true);
    unload_users(s, a->u.key, 0);
    unload_deps(s, a->u.key, a->u.deps, a->u.n_deps, a->dependents, 0);
    free(a->u.key);
    free(a);
    s->n_async_unloads--;
    pthread_cond_broadcast(&s->claim_ended);
}

static void *async_unload_main(void *arg)
{
    async_unload_t *a = arg;
    nereid_server_t *s = a->s;
    pthread_mutex_lock(&s->control);
    async_unload_run(a);
    pthread_mutex_unlock(&s->control);
    return NULL;
}

static nereid_error_t *unload_request(nereid_server_t *s, const char *model, bool dependents,
                                      bool wait)
{
    nereid_error_t *err = check_explicit(s);
    if (err) return err;
    if (!valid_model_name(model))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG, "invalid model name '%s'",
                                model ? model : "");
    pthread_mutex_lock(&s->control);
    size_t n;
    char **keys = unload_keys(s, model, &n);
    for (size_t i = 0; i < n; i++) {
        if (wait) {
            unload_model(s, keys[i], dependents, 0);
            continue;
        }
        err = claim(s, keys[i], true);
        if (err) {
            LOG_ERROR("failed to unload '%s': %s", keys[i], nereid_error_message(err));
            nereid_error_free(err);
            err = NULL;
            continue;
        }
        async_unload_t *a = xcalloc(1, sizeof *a);
        a->s = s;
        a->dependents = dependents;
        unload_detach(s, keys[i], &a->u);
        claim_transfer(s, keys[i], true);
        s->n_async_unloads++;
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, async_unload_main, a) != 0) async_unload_run(a);
        pthread_attr_destroy(&attr);
    }
    free_names(keys, n);
    pthread_mutex_unlock(&s->control);
    return NULL;
}

nereid_error_t *nereid_server_unload_model(nereid_server_t *s, const char *model,
                                           bool unload_dependents)
{
    return unload_request(s, model, unload_dependents, true);
}

nereid_error_t *nereid_server_unload_model_async(nereid_server_t *s, const char *model,
                                                 bool unload_dependents)
{
    return unload_request(s, model, unload_dependents, false);
}

/* ---- Load on demand ---- */

/* The process's resident bytes (/proc/self/statm), 0 when unknown. */
static long long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return resident * (long long)sysconf(_SC_PAGESIZE);
}

/* Whether a request or an ensemble still uses one of e's models (beyond the
 * loader's reference). Caller holds s->lock. */
static bool entry_in_use(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++) {
        model_t *m = e->versions[v].model;
        if (m && (atomic_load(&m->refcount) > 1 || atomic_load(&m->holds) > 0)) return true;
    }
    return false;
}

/* The backend e's loaded version runs on; NULL for an ensemble (or none
 * loaded). Caller holds s->lock. */
static const struct backend_lib *entry_backend(const model_entry_t *e)
{
    for (size_t v = 0; v < e->n_versions; v++)
        if (e->versions[v].model) return e->versions[v].model->backend;
    return NULL;
}

/* Whether other can hold memory that the victim's load brought in: a model
 * on the same backend (a shared session, the backend's library and
 * environment) or, for an ensemble (backend NULL), one of its steps. Caller
 * holds s->lock. */
static bool shares_memory(const struct backend_lib *backend, char *const *steps, size_t n_steps,
                          const model_entry_t *other)
{
    if (!entry_has_ready(other)) return false;
    if (backend) return entry_backend(other) == backend;
    for (size_t k = 0; k < n_steps; k++)
        if (strcmp(steps[k], other->name) == 0) return true;
    return false;
}

/* After victim's unload freed `freed` of its `charged` bytes: what stayed
 * resident is held by a model it shares memory with (a session several
 * identical models use, the runtime its first load brought in), so it is
 * charged to the most recently used such model; what was freed beyond the
 * charge was charged to those models (victim released the last hold on a
 * shared session), so it comes off their charges. Bytes no loaded model can
 * hold (the last model of a backend went) leave the accounting. The total
 * thereby follows the process's RSS: --model-memory-budget bounds what the
 * loaded models really keep resident, not only what each load added. */
static void move_charge(nereid_server_t *s, const char *victim_name,
                        const struct backend_lib *backend, char *const *steps, size_t n_steps,
                        long long charged, long long freed)
{
    pthread_rwlock_wrlock(&s->lock);
    long long delta = freed - charged; /* < 0: stayed resident; > 0: freed for others */
    while (delta != 0) {
        model_entry_t *to = NULL;
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = s->models[i];
            if (e->memory_bytes <= 0 || strcmp(e->name, victim_name) == 0 ||
                !shares_memory(backend, steps, n_steps, e))
                continue;
            if (delta > 0 && e->memory_bytes <= 1) continue; /* nothing to take off */
            if (!to || atomic_load(&e->last_used_ns) > atomic_load(&to->last_used_ns)) to = e;
        }
        if (!to) break;
        if (delta < 0) {
            to->memory_bytes -= delta;
            LOG_INFO("'%s' still holds %lld bytes that '%s' shared after its unload", to->name,
                     -delta, victim_name);
            delta = 0;
        } else {
            long long take = to->memory_bytes - 1 < delta ? to->memory_bytes - 1 : delta;
            to->memory_bytes -= take;
            delta -= take;
        }
    }
    pthread_rwlock_unlock(&s->lock);
}

/* Unloads least recently used models until the loaded ones fit the budget;
 * keep (just loaded) stays. Each unload's freed memory is measured (RSS
 * before and after, free heap pages returned first) and what stayed
 * resident is charged on (move_charge). Caller holds s->control. */
static void evict_over_budget(nereid_server_t *s, const char *keep)
{
    long long budget = s->opts.model_memory_budget_bytes;
    while (budget > 0) {
        pthread_rwlock_rdlock(&s->lock);
        long long total = 0;
        model_entry_t *victim = NULL;
        for (size_t i = 0; i < s->n_models; i++) {
            model_entry_t *e = s->models[i];
            if (!entry_has_ready(e)) continue;
            total += e->memory_bytes;
            if (e->pinned || strcmp(e->key, keep) == 0 || entry_in_use(e) || claimed(s, e->key) ||
                used_by_other_locked(s, e->key, e->key))
                continue;
            if (!victim || atomic_load(&e->last_used_ns) < atomic_load(&victim->last_used_ns))
                victim = e;
        }
        char *name = victim && total > budget ? xstrdup(victim->key) : NULL;
        long long bytes = victim ? victim->memory_bytes : 0;
        const struct backend_lib *backend = victim ? entry_backend(victim) : NULL;
        char **steps = NULL; /* an ensemble's: they hold what its load brought in */
        size_t n_steps = 0;
        const Inference__ModelEnsembling *es = name && victim->config && is_ensemble(victim->config)
                                                   ? victim->config->ensemble_scheduling
                                                   : NULL;
        if (es) {
            steps = xcalloc(es->n_step ? es->n_step : 1, sizeof *steps);
            for (size_t k = 0; k < es->n_step; k++)
                steps[n_steps++] = xstrdup(es->step[k]->model_name);
        }
        pthread_rwlock_unlock(&s->lock);
        if (!name) {
            if (total > budget)
                LOG_WARN("loaded models use %lld bytes, over the memory budget of %lld bytes, "
                         "and none can be unloaded (pinned, in use or just loaded)",
                         total, budget);
            return;
        }
        LOG_INFO("unloading '%s' (%lld bytes, least recently used): loaded models use %lld bytes, "
                 "over the memory budget of %lld bytes",
                 name, bytes, total, budget);
        malloc_trim(0);
        long long rss0 = rss_bytes();
        unload_model(s, name, false, 0);
        malloc_trim(0);
        long long freed = rss0 - rss_bytes();
        if (freed < 0) freed = 0;
        move_charge(s, name, backend, steps, n_steps, bytes, freed);
        for (size_t k = 0; k < n_steps; k++)
            free(steps[k]);
        free(steps);
        pthread_rwlock_wrlock(&s->lock);
        model_entry_t *e = repository_find(s, name);
        if (e) e->memory_bytes = 0;
        pthread_rwlock_unlock(&s->lock);
        atomic_fetch_add(&s->on_demand_evictions, 1);
        free(name);
    }
}

/* Set on the thread running an on-demand load: a request that the load
 * itself makes (a backend's model init) must not wait for s->control. */
static _Thread_local bool loading_on_demand;

bool repository_loading_on_demand(void)
{
    return loading_on_demand;
}

bool repository_has_model(nereid_server_t *s, const char *name)
{
    if (!valid_model_name(name)) return false;
    size_t count;
    char *dir = locate(s, name, &count);
    bool found = dir != NULL;
    free(dir);
    return found;
}

bool repository_decoupled_on_disk(nereid_server_t *s, const char *name)
{
    size_t count;
    char *dir = locate(s, name, &count);
    model_config_t *cfg = NULL;
    if (dir) nereid_error_free(read_config(s, name, dir, NULL, &cfg));
    bool decoupled =
        cfg && cfg->model_transaction_policy && cfg->model_transaction_policy->decoupled;
    if (cfg) config_free(cfg);
    free(dir);
    return decoupled;
}

/* --model-namespacing: the key of the one repository's copy of name an
 * on-demand load means (name itself when no repository has it); NULL and
 * Triton's ambiguity error when several have it. */
static const char *on_demand_key(nereid_server_t *s, const char *name, nereid_error_t **err)
{
    size_t n;
    char **keys = name_keys(s, name, &n);
    const char *key = name;
    if (n == 1) {
        key = keys[0];
        keys[0] = NULL;
    } else if (n > 1) {
        key = NULL;
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "There are %zu identifiers of model '%s' in global map, model "
                                "namespace must be provided to resolve ambiguity.",
                                n, name);
    }
    free_names(keys, n);
    return key;
}

nereid_error_t *repository_load_on_demand(nereid_server_t *s, const char *name)
{
    const char *plain = name;
    if (!valid_model_name(name) || loading_on_demand)
        return nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                "Request for unknown model: '%s' is not found", name ? name : "");
    /* One on-demand load at a time, each charged its own RSS growth; other
     * operations may still run while its model initializes. */
    pthread_mutex_lock(&s->on_demand_load);
    pthread_mutex_lock(&s->control);
    loading_on_demand = true;
    nereid_error_t *err = NULL;
    if (atomic_load(&s->stopping)) {
        err = nereid_error_new(NEREID_ERROR_UNAVAILABLE, "Server not ready");
    } else if (ns_on(s) && !(name = on_demand_key(s, name, &err))) {
        /* err: Triton's ambiguity error */
    } else if (!model_ready(s, name)) { /* else another request loaded it meanwhile */
        size_t count;
        char *dir = locate(s, name, &count);
        bool found = dir != NULL;
        free(dir);
        if (!found) {
            err = nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                   "Request for unknown model: '%s' is not found", name);
        } else {
            LOG_INFO("loading '%s' on demand", name);
            long long rss0 = rss_bytes();
            uint64_t t0 = util_now_ns();
            load_ctx_t ctx = {.depth = 0, .load_deps = true, .held = true};
            ctx.chain[0] = name;
            err = load_model(s, name, NULL, NULL, NULL, NULL, 0, &ctx);
            atomic_fetch_add(&s->on_demand_load_ns, util_now_ns() - t0);
            long long grown = rss_bytes() - rss0;
            if (err || !model_ready(s, name)) {
                atomic_fetch_add(&s->on_demand_load_failures, 1);
                if (!err)
                    err = nereid_error_new(NEREID_ERROR_UNAVAILABLE,
                                           "Request for unknown model: '%s' has no available "
                                           "versions",
                                           name);
            } else {
                atomic_fetch_add(&s->on_demand_loads, 1);
                pthread_rwlock_wrlock(&s->lock);
                model_entry_t *e = repository_find(s, name);
                if (e) {
                    e->memory_bytes = grown > 0 ? grown : 1;
                    atomic_store(&e->last_used_ns, util_now_ns());
                }
                pthread_rwlock_unlock(&s->lock);
                LOG_INFO("loaded '%s' on demand (%lld bytes)", name, grown > 0 ? grown : 1);
                evict_over_budget(s, name);
            }
        }
    }
    loading_on_demand = false;
    if (ns_on(s) && name != plain) free((char *)name);
    pthread_mutex_unlock(&s->control);
    pthread_mutex_unlock(&s->on_demand_load);
    return err;
}

/* ---- Start-up ---- */

typedef struct load_pool {
    nereid_server_t *server;
    char **names;
    size_t n;
    bool *is_ensemble;        /* [n], set by the workers */
    bool measure;             /* one worker; each load's RSS growth is its charge */
    model_config_t **configs; /* [n], read in the first pass, taken by the loads */
    pthread_mutex_t lock;
    pthread_cond_t all_read;
    size_t next_read, n_read, next; /* lock */
    struct prefetch *prefetches;    /* lock: one per backend named */
} load_pool_t;

/* A backend loaded ahead of the start-up loads (backend_prefetch), on a
 * thread of its own while the workers read the other configs. */
typedef struct prefetch {
    struct prefetch *next;
    char *backend, *model_dir, *runtime; /* the first model's search that named it */
    const nereid_server_t *server;
    backend_lib_t *lib; /* the reference it holds until the loads end */
    pthread_t thread;
    bool started;
} prefetch_t;

static void *prefetch_main(void *arg)
{
    prefetch_t *f = arg;
    backend_search_t search = {
        f->server->backend_dir,       f->model_dir, 0, f->runtime, f->server->backend_settings,
        f->server->n_backend_settings};
    f->lib = backend_prefetch(&search, f->backend);
    return NULL;
}

/* Starts loading cfg's backend ahead of the loads, the first time a config
 * names it. */
static void prefetch_backend(load_pool_t *p, const model_config_t *cfg, const char *dir)
{
    const char *backend = model_backend_for(cfg);
    if (!backend) return;
    pthread_mutex_lock(&p->lock);
    prefetch_t *f = p->prefetches;
    while (f && strcmp(f->backend, backend) != 0)
        f = f->next;
    if (!f) {
        f = xcalloc(1, sizeof *f);
        f->backend = xstrdup(backend);
        f->model_dir = xstrdup(dir);
        f->runtime = xstrdup(cfg->runtime ? cfg->runtime : "");
        f->server = p->server;
        f->next = p->prefetches;
        p->prefetches = f;
        f->started = pthread_create(&f->thread, NULL, prefetch_main, f) == 0;
    }
    pthread_mutex_unlock(&p->lock);
}

/* After the loads: the prefetched backends' references go (a backend no
 * model loaded on is then finished and closed, as without the prefetch). */
static void prefetch_end(load_pool_t *p)
{
    while (p->prefetches) {
        prefetch_t *f = p->prefetches;
        p->prefetches = f->next;
        if (f->started) pthread_join(f->thread, NULL);
        backend_release(f->lib);
        free(f->backend);
        free(f->model_dir);
        free(f->runtime);
        free(f);
    }
}

/* Charges key's loaded model the RSS its load added (at least 1 byte) and
 * logs it: what --model-memory-budget counts for a model loaded at
 * start-up (--load-model: pinned), as for one loaded on demand. */
static void charge_pinned_load(nereid_server_t *s, const char *key, long long grown)
{
    if (!model_ready(s, key)) return;
    if (grown < 1) grown = 1;
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t *e = repository_find(s, key);
    if (e) {
        e->memory_bytes = grown;
        atomic_store(&e->last_used_ns, util_now_ns());
    }
    pthread_rwlock_unlock(&s->lock);
    LOG_INFO("loaded pinned '%s' (%lld bytes)", key, grown);
}

/* After the pinned models' start-up loads: whether they alone exceed the
 * budget (then every on-demand load unloads the previous on-demand model). */
static void warn_pinned_over_budget(nereid_server_t *s)
{
    long long total = 0, budget = s->opts.model_memory_budget_bytes;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++)
        if (s->models[i]->pinned && entry_has_ready(s->models[i]))
            total += s->models[i]->memory_bytes;
    pthread_rwlock_unlock(&s->lock);
    if (total > budget)
        LOG_WARN("pinned models (--load-model) use %lld bytes, over the memory budget of %lld "
                 "bytes: only the model loaded last on demand stays beside them",
                 total, budget);
}

/* Loads the plain models among p->names; an ensemble (it needs its steps)
 * is only marked in p->is_ensemble for the caller. Each config is read once,
 * in a first pass, and handed to load_model in the second. The first pass
 * starts loading each backend the configs name (prefetch_backend), so the
 * backend's start overlaps the reads instead of every load waiting for it
 * in turn. */
static void *load_worker(void *arg)
{
    load_pool_t *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next_read++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) break;
        size_t count;
        char *dir = locate(p->server, p->names[i], &count);
        model_config_t *cfg = NULL;
        const char *ns;
        char *name = key_split(p->names[i], &ns);
        if (dir && count == 1) nereid_error_free(read_config(p->server, name, dir, NULL, &cfg));
        free(name);
        if (is_ensemble(cfg)) {
            config_free(cfg);
            cfg = NULL;
            p->is_ensemble[i] = true;
        } else if (cfg && !p->measure) { /* measured: the backend's start is the load's */
            prefetch_backend(p, cfg, dir);
        }
        free(dir);
        pthread_mutex_lock(&p->lock);
        p->configs[i] = cfg;
        if (++p->n_read == p->n) pthread_cond_broadcast(&p->all_read);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_lock(&p->lock);
    while (p->n_read < p->n)
        pthread_cond_wait(&p->all_read, &p->lock);
    pthread_mutex_unlock(&p->lock);
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t i = p->next++;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->n) return NULL;
        if (p->is_ensemble[i]) continue;
        load_ctx_t ctx = {.depth = 0, .load_deps = false, .config = p->configs[i]};
        p->configs[i] = NULL;
        ctx.chain[0] = p->names[i];
        long long rss0 = p->measure ? rss_bytes() : 0;
        nereid_error_free(load_model(p->server, p->names[i], NULL, NULL, NULL, NULL, 0, &ctx));
        if (p->measure) charge_pinned_load(p->server, p->names[i], rss_bytes() - rss0);
        if (ctx.config) config_free(ctx.config);
    }
}

/* Loads names' plain models on --model-load-thread-count threads and sets
 * is_ensemble[i] for each ensemble among them (not loaded). measure: one
 * at a time, each charged what its load added to the RSS (loads in
 * parallel would blur each other's growth). */
static void load_parallel(nereid_server_t *s, char **names, size_t n, bool *is_ensemble,
                          bool measure)
{
    load_pool_t pool = {.server = s,
                        .names = names,
                        .n = n,
                        .is_ensemble = is_ensemble,
                        .measure = measure,
                        .configs = xcalloc(n ? n : 1, sizeof *pool.configs)};
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.all_read, NULL);
    size_t nt = s->opts.model_load_thread_count > 0 ? (size_t)s->opts.model_load_thread_count : 1;
    if (measure) nt = 1;
    if (nt > n) nt = n;
    pthread_t *threads = xcalloc(nt ? nt : 1, sizeof *threads);
    size_t started = 0;
    for (size_t i = 0; i < nt; i++)
        if (pthread_create(&threads[i], NULL, load_worker, &pool) == 0) started++;
    if (started == 0) load_worker(&pool);
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    prefetch_end(&pool);
    free(threads);
    free(pool.configs);
    pthread_cond_destroy(&pool.all_read);
    pthread_mutex_destroy(&pool.lock);
}

static bool wanted_name_at_start(nereid_server_t *s, const char *name)
{
    /* Poll mode with on-demand loads: like explicit, only --load-model. */
    if (s->opts.model_control_mode != NEREID_MODEL_CONTROL_EXPLICIT &&
        !s->opts.model_load_on_demand)
        return true;
    for (size_t i = 0; i < s->opts.n_load_models; i++)
        if (strcmp(s->opts.load_models[i], "*") == 0 || strcmp(s->opts.load_models[i], name) == 0)
            return true;
    return false;
}

static bool wanted_at_start(nereid_server_t *s, const char *key)
{
    const char *ns;
    char *name = key_split(key, &ns);
    bool wanted = wanted_name_at_start(s, name);
    free(name);
    return wanted;
}

/* Model directory names across the repositories (sorted, unique); with
 * --model-namespacing each repository's model keys. */
static size_t scan_names(nereid_server_t *s, char ***out, nereid_error_t **err)
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
            bool ok = is_dir(dir) && !strchr(de->d_name, NS_SEP);
            free(dir);
            if (!ok) continue;
            if (n % 64 == 0) names = xrealloc(names, (n + 64) * sizeof *names);
            names[n++] = make_key(s, de->d_name, s->repos[r]);
        }
        closedir(d);
    }
    if (n) qsort(names, n, sizeof *names, cmp_str);
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

static void *poll_main(void *arg);

nereid_error_t *repository_start(nereid_server_t *s)
{
    pthread_mutex_init(&s->control, NULL);
    pthread_cond_init(&s->claim_ended, NULL);
    pthread_mutex_init(&s->on_demand_load, NULL);
    pthread_mutex_init(&s->poll_lock, NULL);
    pthread_cond_init(&s->poll_cond, NULL);
    nereid_error_t *remote_err = remote_repo_open_all(s);
    if (remote_err) return remote_err;
    char **names;
    nereid_error_t *err;
    size_t n = scan_names(s, &names, &err);
    if (err) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return err;
    }
    /* Every model on disk is listed, even those never loaded. */
    pthread_rwlock_wrlock(&s->lock);
    for (size_t i = 0; i < n; i++) {
        size_t count;
        char *dir = locate(s, names[i], &count);
        if (dir && !repository_find(s, names[i])) entry_add(s, names[i], dir);
        free(dir);
    }
    pthread_rwlock_unlock(&s->lock);
    if (s->opts.model_load_on_demand) { /* what --load-model names is never evicted */
        pthread_rwlock_wrlock(&s->lock);
        for (size_t i = 0; i < s->n_models; i++)
            s->models[i]->pinned = wanted_name_at_start(s, s->models[i]->name);
        pthread_rwlock_unlock(&s->lock);
    }
    /* Plain models in parallel, then ensembles (they need their steps). */
    char **wanted = xcalloc(n ? n : 1, sizeof *wanted);
    bool *ens = xcalloc(n ? n : 1, sizeof *ens);
    size_t n_wanted = 0;
    for (size_t i = 0; i < n; i++)
        if (wanted_at_start(s, names[i])) wanted[n_wanted++] = names[i];
    /* Under a memory budget the pinned models count too: each one's load
     * is measured, so they load one at a time. */
    bool measure = s->opts.model_load_on_demand && s->opts.model_memory_budget_bytes > 0;
    load_parallel(s, wanted, n_wanted, ens, measure);
    for (size_t i = 0; i < n_wanted; i++) {
        /* loaded (or tried) as another ensemble's step */
        if (!ens[i] || model_ready(s, wanted[i]) ||
            entry_state(s, wanted[i], NULL) != MODEL_UNKNOWN_STATE)
            continue;
        load_ctx_t ctx = {.depth = 0,
                          .load_deps = s->opts.model_control_mode == NEREID_MODEL_CONTROL_EXPLICIT};
        ctx.chain[0] = wanted[i];
        long long rss0 = measure ? rss_bytes() : 0;
        nereid_error_free(load_model(s, wanted[i], NULL, NULL, NULL, NULL, 0, &ctx));
        if (measure) charge_pinned_load(s, wanted[i], rss_bytes() - rss0);
    }
    if (measure) warn_pinned_over_budget(s);
    free(wanted);
    free(ens);
    /* Triton (PollModels): a --load-model name no repository has is logged,
     * and with --exit-on-error the server does not start. */
    nereid_error_t *missing = NULL;
    for (size_t i = 0;
         s->opts.model_control_mode == NEREID_MODEL_CONTROL_EXPLICIT && i < s->opts.n_load_models;
         i++) {
        const char *want = s->opts.load_models[i];
        bool found = strcmp(want, "*") == 0;
        for (size_t j = 0; j < n && !found; j++) {
            const char *ns;
            char *name = key_split(names[j], &ns);
            found = strcmp(name, want) == 0;
            free(name);
        }
        if (found) continue;
        LOG_ERROR("failed to poll model '%s': model not found in any model repository.", want);
        if (!missing && s->opts.exit_on_error)
            missing =
                nereid_error_new(NEREID_ERROR_INTERNAL,
                                 "failed to load '%s', failed to poll from model repository", want);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (missing) return missing;
    if (s->opts.model_control_mode == NEREID_MODEL_CONTROL_POLL &&
        pthread_create(&s->poll_thread, NULL, poll_main, s) == 0)
        s->poll_started = true;
    return NULL;
}

/* ---- Poll mode ---- */

static void remove_entry(nereid_server_t *s, const char *key)
{
    nereid_error_t *err = claim(s, key, true);
    if (err) {
        nereid_error_free(err);
        return;
    }
    char **deps;
    size_t n_deps;
    unload_claimed(s, key, &deps, &n_deps);
    free_names(deps, n_deps);
    const char *ns;
    char *name = key_split(key, &ns);
    pthread_rwlock_wrlock(&s->lock);
    /* Triton (PollAndUpdate): a deleted model is unloaded, and its
     * lifecycle entry stays: a request for it is told "has no available
     * versions", not "is not found". (Namespacing and load on demand drop
     * the entry, as before.) */
    model_entry_t *kept = ns_on(s) || s->opts.model_load_on_demand ? NULL : repository_find(s, key);
    if (kept) {
        kept->removed = true;
        kept->tree_sig = 0;
    }
    for (size_t i = 0; i < s->n_models && !kept; i++) {
        if (strcmp(s->models[i]->key, key) != 0) continue;
        entry_free(s->models[i]);
        memmove(&s->models[i], &s->models[i + 1], (s->n_models - i - 1) * sizeof *s->models);
        s->n_models--;
        break;
    }
    pthread_rwlock_unlock(&s->lock);
    unclaim(s, key, true);
    LOG_INFO("model '%s' was removed from the repository", name);
    free(name);
}

/* Whether ready ensemble e's steps resolve to other model keys than those
 * it was loaded with. Caller holds s->lock (read). */
static bool steps_moved(nereid_server_t *s, const model_entry_t *e)
{
    if (!e->config || !entry_has_ready(e) || !is_ensemble(e->config) ||
        !e->config->ensemble_scheduling)
        return false;
    const Inference__ModelEnsembling *es = e->config->ensemble_scheduling;
    bool moved = false;
    for (size_t i = 0; i < es->n_step && !moved; i++) {
        char *now = resolve_step(s, e->ns, es->step[i]->model_name);
        char *was = step_key(s, es->step[i]);
        moved = !now || strcmp(now, was) != 0;
        free(now);
        free(was);
    }
    return moved;
}

void repository_poll(nereid_server_t *s)
{
    pthread_mutex_lock(&s->control);
    if (atomic_load(&s->stopping)) {
        pthread_mutex_unlock(&s->control);
        return;
    }
    nereid_error_t *err = remote_repo_sync(s, NULL);
    if (err) {
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    char **names;
    size_t n = scan_names(s, &names, &err);
    if (err) {
        LOG_ERROR("%s", nereid_error_message(err));
        nereid_error_free(err);
    }
    /* Removed models. */
    char **gone = NULL;
    size_t n_gone = 0;
    pthread_rwlock_rdlock(&s->lock);
    for (size_t i = 0; i < s->n_models; i++) {
        const char *key = s->models[i]->key;
        if (s->models[i]->removed) continue; /* removed by an earlier poll */
        if (!n || !bsearch(&key, names, n, sizeof *names, cmp_str)) {
            gone = xrealloc(gone, (n_gone + 1) * sizeof *gone);
            gone[n_gone++] = xstrdup(s->models[i]->key);
        }
    }
    pthread_rwlock_unlock(&s->lock);
    for (size_t i = 0; i < n_gone; i++) {
        remove_entry(s, gone[i]);
        free(gone[i]);
    }
    free(gone);
    /* New and changed models: plain ones first so ensembles find their steps. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            size_t count;
            char *dir = locate(s, names[i], &count);
            if (!dir) continue;
            uint64_t sig = tree_sig(dir, 14695981039346656037ULL, 0);
            pthread_rwlock_rdlock(&s->lock);
            model_entry_t *e = repository_find(s, names[i]);
            bool changed = !e || e->tree_sig != sig;
            /* Namespacing: a loaded ensemble whose steps now resolve to
             * other copies (one removed or added) is loaded again, as
             * Triton reconnects its dependency graph. */
            if (!changed && pass == 1 && ns_on(s)) changed = steps_moved(s, e);
            /* On demand: a model not loaded is loaded by its first request,
             * not by the poll; a new one is only listed. */
            bool listed_only = s->opts.model_load_on_demand && (!e || !entry_has_ready(e));
            pthread_rwlock_unlock(&s->lock);
            if (changed && listed_only) {
                pthread_rwlock_wrlock(&s->lock);
                if (!repository_find(s, names[i])) entry_add(s, names[i], dir);
                pthread_rwlock_unlock(&s->lock);
                free(dir);
                continue;
            }
            model_config_t *cfg = NULL;
            const char *ns;
            char *name = key_split(names[i], &ns);
            if (changed) nereid_error_free(read_config(s, name, dir, NULL, &cfg));
            if (changed && is_ensemble(cfg) == (pass == 1)) {
                LOG_INFO("model '%s' changed on disk, (re)loading", name);
                load_ctx_t ctx = {.depth = 0, .load_deps = true, .config = cfg, .held = true};
                ctx.chain[0] = names[i];
                nereid_error_free(load_model(s, names[i], NULL, NULL, NULL, NULL, 0, &ctx));
                cfg = ctx.config;
            }
            if (cfg) config_free(cfg);
            free(name);
            free(dir);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    pthread_mutex_unlock(&s->control);
}

static void *poll_main(void *arg)
{
    nereid_server_t *s = arg;
    int secs = s->opts.repository_poll_secs > 0 ? s->opts.repository_poll_secs : 15;
    pthread_mutex_lock(&s->poll_lock);
    while (!s->poll_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += secs;
        while (!s->poll_stop &&
               pthread_cond_timedwait(&s->poll_cond, &s->poll_lock, &until) != ETIMEDOUT) {
        }
        if (s->poll_stop) break;
        pthread_mutex_unlock(&s->poll_lock);
        repository_poll(s);
        pthread_mutex_lock(&s->poll_lock);
    }
    pthread_mutex_unlock(&s->poll_lock);
    return NULL;
}

/* ---- Shutdown ---- */

void repository_stop(nereid_server_t *s)
{
    if (s->poll_started) {
        pthread_mutex_lock(&s->poll_lock);
        s->poll_stop = true;
        pthread_cond_broadcast(&s->poll_cond);
        pthread_mutex_unlock(&s->poll_lock);
        pthread_join(s->poll_thread, NULL);
        s->poll_started = false;
    }
    pthread_mutex_lock(&s->control);
    while (s->n_claims || s->n_async_unloads) /* operations under way end (new ones see stopping) */
        pthread_cond_wait(&s->claim_ended, &s->control);
    pthread_rwlock_wrlock(&s->lock);
    model_entry_t **models = s->models;
    size_t n = s->n_models;
    s->models = NULL;
    s->n_models = 0;
    pthread_rwlock_unlock(&s->lock);
    /* Ensembles first: their in-flight steps then fail fast on lookup. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++) {
            model_entry_t *e = models[i];
            if (is_ensemble(e->config) != (pass == 0)) continue;
            if (entry_has_ready(e)) LOG_VERBOSE2("AsyncUnload() '%s'", e->name);
            for (size_t v = 0; v < e->n_versions; v++)
                if (e->versions[v].model) {
                    unload_version(e->name, e->versions[v].version, e->versions[v].model);
                    e->versions[v].model = NULL;
                }
        }
    for (size_t i = 0; i < n; i++)
        entry_free(models[i]);
    free(models);
    pthread_mutex_unlock(&s->control);
}
