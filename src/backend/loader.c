/*
 * This file contains the backend loader (see loader.h).
 */
#include "backend/loader.h"

#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "tritonapi/adapter.h"

static pthread_mutex_t loader_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nereid_backend **loaded;
static size_t n_loaded;

/* A backend name comes from a model config: a plain name, never a path. */
static bool plain_name(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static nereid_error_t *not_found(const char *name)
{
    return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                            "unable to find backend library for backend '%s', try specifying "
                            "runtime on the model configuration.",
                            name);
}

static char *nereid_library(const char *dir, const char *name)
{
    char *candidates[2] = {xasprintf("%s/%s/libnereid_%s.so", dir, name, name),
                           xasprintf("%s/libnereid_%s.so", dir, name)};
    for (int i = 0; i < 2; i++)
        if (access(candidates[i], R_OK) == 0) {
            free(candidates[1 - i]);
            return candidates[i];
        }
    free(candidates[0]);
    free(candidates[1]);
    return NULL;
}

/* Triton's search (backend_model.cc): the runtime file name or
 * libtriton_<name>.so in <model>/<version>/, <model>/, <dir>/<name>/. */
static char *triton_library(const backend_search_t *s, const char *name)
{
    const char *rt = s->runtime;
    bool use_rt = rt && rt[0] && !strchr(rt, '/') && strcmp(rt, "..") != 0 && strlen(rt) > 3 &&
                  strcmp(rt + strlen(rt) - 3, ".so") == 0;
    char *file = use_rt ? xstrdup(rt) : xasprintf("libtriton_%s.so", name);
    char *dirs[3] = {
        s->model_dir ? xasprintf("%s/%lld", s->model_dir, (long long)s->version) : NULL,
        s->model_dir ? xstrdup(s->model_dir) : NULL, xasprintf("%s/%s", s->backend_dir, name)};
    char *found = NULL;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i]) continue;
        char *path = xasprintf("%s/%s", dirs[i], file);
        if (!found && access(path, R_OK) == 0)
            found = path;
        else
            free(path);
        free(dirs[i]);
    }
    free(file);
    return found;
}

/* Triton's Python-based backends (backend_model.cc): a model whose runtime
 * is "model.py", or whose backend has no library but a
 * <backend-dir>/<name>/model.py, runs on the python backend (which finds
 * that model.py from the model's backend name). *err is set when the
 * runtime names model.py and the backend directory has none. */
static bool python_based(const backend_search_t *s, const char *name, nereid_error_t **err)
{
    *err = NULL;
    if (!plain_name(name) || strcmp(name, "python") == 0) return false;
    const char *rt = s->runtime;
    if (rt && rt[0] && strcmp(rt, "model.py") != 0) return false;
    char *path = xasprintf("%s/%s/model.py", s->backend_dir, name);
    bool found = access(path, R_OK) == 0;
    const char *slash = s->model_dir ? strrchr(s->model_dir, '/') : NULL;
    if (rt && rt[0] && !found)
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to find Python backend based backend library 'model.py' "
                                "for model '%s', searched: '%s'",
                                slash ? slash + 1 : name, path);
    free(path);
    if (*err || !found) return false;
    if (rt && rt[0]) return true;
    char *lib = nereid_library(s->backend_dir, name);
    if (!lib) lib = triton_library(s, name);
    bool has_library = lib != NULL;
    free(lib);
    return !has_library;
}

/* libtritonserver.so: next to the executable, else where the build put it. */
static const tritonapi_entry_t *_Atomic tritonapi_loaded;

static const tritonapi_entry_t *tritonapi(nereid_error_t **err)
{
    const tritonapi_entry_t *entry = atomic_load(&tritonapi_loaded);
    if (entry) return entry;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *paths[2] = {NULL, xstrdup(NEREID_TRITONSERVER_LIB)};
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        paths[0] = xasprintf("%s/%s", exe, TRITONAPI_LIBRARY_NAME);
    }
    void *h = NULL;
    const char *why = "not found";
    for (int i = 0; i < 2 && !h; i++) {
        if (!paths[i] || access(paths[i], R_OK) != 0) continue;
        h = dlopen(paths[i], RTLD_NOW | RTLD_GLOBAL);
        if (!h) why = dlerror();
    }
    free(paths[0]);
    free(paths[1]);
    tritonapi_entry_fn fn = h ? (tritonapi_entry_fn)dlsym(h, TRITONAPI_ENTRY_SYMBOL) : NULL;
    if (!fn) {
        *err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "unable to load %s (Triton backend API) next to the nereid "
                                "executable: %s",
                                TRITONAPI_LIBRARY_NAME, h ? "no " TRITONAPI_ENTRY_SYMBOL : why);
        return NULL;
    }
    entry = fn();
    atomic_store(&tritonapi_loaded, entry);
    return entry;
}

static nereid_error_t *open_library(const backend_search_t *s, const char *name,
                                    struct nereid_backend *b)
{
    if (!plain_name(name)) return not_found(name);
    char *path = nereid_library(s->backend_dir, name);
    if (path) {
        b->lib.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!b->lib.handle) {
            free(path);
            return nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to load backend '%s': %s",
                                    name, dlerror());
        }
        b->lib.path = path;
        return NULL;
    }
    path = triton_library(s, name);
    if (!path) {
        LOG_INFO("no library for backend '%s': searched '%s/%s/libnereid_%s.so', "
                 "'%s/libnereid_%s.so' and libtriton_%s.so in the model, version and backend "
                 "directories",
                 name, s->backend_dir, name, name, s->backend_dir, name, name);
        return not_found(name);
    }
    b->lib.path = path;
    b->lib.triton = true;
    return NULL;
}

/* Triton's resolution: global settings, then the backend's own over them,
 * in setting order (a std::map there), then the defaults neither set. */
static void resolve_config(backend_lib_t *lib, const nereid_backend_setting_t *settings,
                           size_t n_settings)
{
    lib->config_settings = xcalloc(n_settings + 1, sizeof *lib->config_settings);
    lib->config_values = xcalloc(n_settings + 1, sizeof *lib->config_values);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n_settings; i++) {
            const nereid_backend_setting_t *s = &settings[i];
            if (pass == 0 ? s->backend[0] != '\0' : strcmp(s->backend, lib->name) != 0) continue;
            size_t k = 0;
            while (k < lib->n_config && strcmp(lib->config_settings[k], s->setting) < 0)
                k++;
            if (k < lib->n_config && strcmp(lib->config_settings[k], s->setting) == 0) {
                free(lib->config_values[k]);
                lib->config_values[k] = xstrdup(s->value);
                continue;
            }
            memmove(&lib->config_settings[k + 1], &lib->config_settings[k],
                    (lib->n_config - k) * sizeof *lib->config_settings);
            memmove(&lib->config_values[k + 1], &lib->config_values[k],
                    (lib->n_config - k) * sizeof *lib->config_values);
            lib->config_settings[k] = xstrdup(s->setting);
            lib->config_values[k] = xstrdup(s->value);
            lib->n_config++;
        }
    bool has_default = false;
    for (size_t k = 0; k < lib->n_config; k++)
        if (strcmp(lib->config_settings[k], "default-max-batch-size") == 0) {
            has_default = true;
            /* Triton's SetBackendConfigDefaults lines (L0_backend_config greps them) */
            LOG_VERBOSE("Found overwritten default setting: default-max-batch-size,%s",
                        lib->config_values[k]);
        }
    if (!has_default) {
        LOG_VERBOSE("Adding default backend config setting: default-max-batch-size,4");
        lib->config_settings[lib->n_config] = xstrdup("default-max-batch-size");
        lib->config_values[lib->n_config++] = xstrdup("4");
    }
    json_t *cmdline = json_object();
    for (size_t k = 0; k < lib->n_config; k++)
        json_object_set_new(cmdline, lib->config_settings[k], json_string(lib->config_values[k]));
    json_t *root = json_object();
    json_object_set_new(root, "cmdline", cmdline);
    char *text = json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT);
    lib->config_json = xstrdup(text ? text : "{}");
    free(text);
    json_decref(root);
}

static void free_lib(struct nereid_backend *b)
{
    for (size_t k = 0; k < b->lib.n_config; k++) {
        free(b->lib.config_settings[k]);
        free(b->lib.config_values[k]);
    }
    free(b->lib.config_settings);
    free(b->lib.config_values);
    free(b->lib.config_json);
    free(b->lib.name);
    free(b->lib.path);
    free(b);
}

static nereid_error_t *resolve(struct nereid_backend *b)
{
    if (b->lib.triton) {
        nereid_error_t *err = NULL;
        const tritonapi_entry_t *t = tritonapi(&err);
        if (!t) return err;
        b->lib.fini = t->fini;
        b->lib.model_init = t->model_init;
        b->lib.model_fini = t->model_fini;
        b->lib.instance_init = t->instance_init;
        b->lib.instance_fini = t->instance_fini;
        b->lib.execute = t->execute;
        return t->open(b, b->lib.path);
    }
    void *h = b->lib.handle;
    uint32_t (*version)(void) = (uint32_t(*)(void))dlsym(h, "nereid_backend_abi_version");
    uint32_t v = version ? version() : (1u << 16);
    if ((v >> 16) != NEREID_BACKEND_ABI_MAJOR || (v & 0xffff) > NEREID_BACKEND_ABI_MINOR)
        return nereid_error_new(
            NEREID_ERROR_INVALID_ARG, "backend '%s' uses ABI %u.%u, server supports %u.%u",
            b->lib.name, v >> 16, v & 0xffff, NEREID_BACKEND_ABI_MAJOR, NEREID_BACKEND_ABI_MINOR);
    b->lib.fini = (backend_fn)dlsym(h, "nereid_backend_fini");
    b->lib.model_init = (model_fn)dlsym(h, "nereid_backend_model_init");
    b->lib.model_fini = (model_fn)dlsym(h, "nereid_backend_model_fini");
    b->lib.instance_init = (instance_fn)dlsym(h, "nereid_backend_instance_init");
    b->lib.instance_fini = (instance_fn)dlsym(h, "nereid_backend_instance_fini");
    b->lib.execute = (execute_fn)dlsym(h, "nereid_backend_execute");
    b->lib.instance_ready = (instance_fn)dlsym(h, "nereid_backend_instance_ready");
    b->lib.instance_abort = (instance_fn)dlsym(h, "nereid_backend_instance_abort");
    b->lib.body_alloc =
        (void *(*)(nereid_model_t *, size_t, void **))dlsym(h, "nereid_backend_model_body_alloc");
    b->lib.body_release = (void (*)(void *))dlsym(h, "nereid_backend_model_body_release");
    if (!b->lib.body_alloc || !b->lib.body_release) b->lib.body_alloc = NULL;
    if (!b->lib.execute)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "backend '%s' does not export nereid_backend_execute", b->lib.name);
    backend_fn init = (backend_fn)dlsym(h, "nereid_backend_init");
    return init ? init(b) : NULL;
}

nereid_error_t *backend_acquire(const backend_search_t *search, const char *name,
                                backend_lib_t **out)
{
    *out = NULL;
    nereid_error_t *py_err = NULL;
    if (python_based(search, name, &py_err)) name = "python";
    if (py_err) return py_err;
    pthread_mutex_lock(&loader_lock);
    struct nereid_backend *b = xcalloc(1, sizeof *b);
    b->lib.name = xstrdup(name);
    nereid_error_t *err = open_library(search, name, b);
    /* One library per path, shared by every model that finds it there. */
    for (size_t i = 0; !err && i < n_loaded; i++)
        if (strcmp(loaded[i]->lib.path, b->lib.path) == 0) {
            if (b->lib.handle) dlclose(b->lib.handle);
            free_lib(b);
            loaded[i]->lib.refcount++;
            *out = &loaded[i]->lib;
            pthread_mutex_unlock(&loader_lock);
            return NULL;
        }
    if (!err) resolve_config(&b->lib, search->settings, search->n_settings);
    if (!err) err = resolve(b);
    if (err) {
        if (b->lib.handle) dlclose(b->lib.handle);
        free_lib(b);
        pthread_mutex_unlock(&loader_lock);
        return err;
    }
    b->lib.refcount = 1;
    loaded = xrealloc(loaded, (n_loaded + 1) * sizeof *loaded);
    loaded[n_loaded++] = b;
    *out = &b->lib;
    pthread_mutex_unlock(&loader_lock);
    LOG_INFO("loaded backend '%s' from %s", name, b->lib.path);
    /* Triton's backends log their resolved configuration when they start
     * (L0_backend_config reads it back); Nereid's own do it here. */
    if (!b->lib.triton) LOG_INFO("backend configuration:\n%s", b->lib.config_json);
    return NULL;
}

backend_lib_t *backend_prefetch(const backend_search_t *search, const char *name)
{
    nereid_error_t *err = NULL;
    if (python_based(search, name, &err)) name = "python";
    if (err || !plain_name(name)) {
        nereid_error_free(err);
        return NULL;
    }
    char *path = nereid_library(search->backend_dir, name);
    if (!path) return NULL;
    free(path);
    backend_lib_t *lib = NULL;
    nereid_error_free(backend_acquire(search, name, &lib));
    return lib;
}

void backend_release(backend_lib_t *lib)
{
    if (!lib) return;
    pthread_mutex_lock(&loader_lock);
    if (--lib->refcount > 0) {
        pthread_mutex_unlock(&loader_lock);
        return;
    }
    struct nereid_backend *b = (struct nereid_backend *)lib;
    for (size_t i = 0; i < n_loaded; i++)
        if (loaded[i] == b) {
            loaded[i] = loaded[--n_loaded];
            break;
        }
    if (n_loaded == 0) {
        free(loaded);
        loaded = NULL;
    }
    pthread_mutex_unlock(&loader_lock);
    if (lib->fini) nereid_error_free(lib->fini(b));
    if (lib->handle && !getenv("NEREID_NO_DLCLOSE")) dlclose(lib->handle);
    free_lib(b);
}

const char *nereid_backend_name(const nereid_backend_t *backend)
{
    return backend->lib.name;
}

void nereid_backend_set_state(nereid_backend_t *backend, void *state)
{
    backend->lib.state = state;
}

void *nereid_backend_state(const nereid_backend_t *backend)
{
    return backend->lib.state;
}

const char *nereid_backend_config(const nereid_backend_t *backend, const char *setting)
{
    for (size_t k = 0; setting && k < backend->lib.n_config; k++)
        if (strcmp(backend->lib.config_settings[k], setting) == 0)
            return backend->lib.config_values[k];
    return NULL;
}

const char *nereid_backend_config_json(const nereid_backend_t *backend)
{
    return backend->lib.config_json;
}
