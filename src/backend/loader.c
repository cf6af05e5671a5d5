/*
 * This file contains the backend loader (see loader.h).
 */
#include "backend/loader.h"

#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"

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

static nereid_error_t *open_library(const char *dir, const char *name, struct nereid_backend *b)
{
    if (!plain_name(name)) return not_found(name);
    char *candidates[2] = {xasprintf("%s/%s/libnereid_%s.so", dir, name, name),
                           xasprintf("%s/libnereid_%s.so", dir, name)};
    nereid_error_t *err = NULL;
    for (int i = 0; i < 2 && !b->lib.handle; i++) {
        if (access(candidates[i], R_OK) != 0) continue;
        b->lib.handle = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (!b->lib.handle) {
            err = nereid_error_new(NEREID_ERROR_INVALID_ARG, "unable to load backend '%s': %s",
                                   name, dlerror());
            break;
        }
        b->lib.path = xstrdup(candidates[i]);
    }
    if (!b->lib.handle && !err) {
        LOG_INFO("backend", "no library for backend '%s': searched '%s' and '%s'", name,
                 candidates[0], candidates[1]);
        err = not_found(name);
    }
    free(candidates[0]);
    free(candidates[1]);
    return err;
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
        has_default |= strcmp(lib->config_settings[k], "default-max-batch-size") == 0;
    if (!has_default) {
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
    if (!b->lib.execute)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "backend '%s' does not export nereid_backend_execute", b->lib.name);
    backend_fn init = (backend_fn)dlsym(h, "nereid_backend_init");
    return init ? init(b) : NULL;
}

nereid_error_t *backend_acquire(const char *dir, const char *name,
                                const nereid_backend_setting_t *settings, size_t n_settings,
                                backend_lib_t **out)
{
    *out = NULL;
    pthread_mutex_lock(&loader_lock);
    for (size_t i = 0; i < n_loaded; i++)
        if (strcmp(loaded[i]->lib.name, name) == 0) {
            loaded[i]->lib.refcount++;
            *out = &loaded[i]->lib;
            pthread_mutex_unlock(&loader_lock);
            return NULL;
        }
    struct nereid_backend *b = xcalloc(1, sizeof *b);
    b->lib.name = xstrdup(name);
    resolve_config(&b->lib, settings, n_settings);
    nereid_error_t *err = open_library(dir, name, b);
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
    LOG_INFO("backend", "loaded backend '%s' from %s", name, b->lib.path);
    return NULL;
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
    if (!getenv("NEREID_NO_DLCLOSE")) dlclose(lib->handle);
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
