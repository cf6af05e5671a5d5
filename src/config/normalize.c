/*
 * This file contains config_normalize: Triton's server-side auto-complete
 * of backend fields and its defaults (version policy, preferred batch sizes,
 * sequence idle time, pinned memory, instance groups), then the validation
 * (normalize_validate.c, normalize_ensemble.c), with Triton's error texts.
 * Each error is reported at the position of the offending field when the
 * text-format parser recorded one. Checks in independent areas all run, so
 * one pass reports every problem.
 */
#include <dirent.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_internal.h"
#include "config/normalize_internal.h"
#include "nereid/server.h"

void nerr(nctx_t *c, const void *msg, const char *field, int index, const char *fmt, ...)
{
    uint32_t line = 0, col = 0;
    bool have = false;
    if (msg) {
        const ProtobufCMessage *m = msg;
        uint32_t id = 0;
        if (field) {
            const ProtobufCFieldDescriptor *f =
                cfg_field_by_name(m->descriptor, field, strlen(field));
            if (f) id = f->id;
        }
        have = cfg_pos_find(c->cfg, msg, id, index, &line, &col);
    }
    if (have)
        cfg_buf_printf(&c->err, "%s:%u:%u: ", c->filename, line, col);
    else
        cfg_buf_printf(&c->err, "%s: ", c->filename);
    va_list ap;
    va_start(ap, fmt);
    cfg_buf_vprintf(&c->err, fmt, ap);
    va_end(ap);
    cfg_buf_puts(&c->err, "\n");
    c->n_errors++;
}

bool streq(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

bool empty(const char *s)
{
    return !s || !*s;
}

/* ---- auto-complete of backend fields ---- */

typedef struct model_dir {
    bool has_version;
    char version_path[4096];
} model_dir_t;

/* Finds the first subdirectory (by name: bytewise, as Triton's std::set
 * orders them) of the model directory, the only one Triton's
 * AutoCompleteBackendFields inspects to guess the backend: not the highest
 * version, not every version. Entries whose name starts with '.' are
 * skipped. dir NULL: the directory of filename (the config file). */
static void inspect_model_dir(const char *dir, const char *filename, model_dir_t *md)
{
    md->has_version = false;
    char tmp[4096];
    if (!dir) {
        if (!filename) return;
        snprintf(tmp, sizeof tmp, "%s", filename);
        dir = dirname(tmp);
    }
    DIR *dp = opendir(dir);
    if (!dp) return;
    char first[256] = "";
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        if (first[0] && strcmp(e->d_name, first) >= 0) continue;
        char p[4096];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strlen(e->d_name) < sizeof first && stat(p, &st) == 0 && S_ISDIR(st.st_mode))
            snprintf(first, sizeof first, "%s", e->d_name);
    }
    closedir(dp);
    if (first[0]) {
        md->has_version = true;
        snprintf(md->version_path, sizeof md->version_path, "%s/%s", dir, first);
    }
}

/* 1 = file, 2 = directory, 0 = absent */
static int version_entry(const model_dir_t *md, const char *name)
{
    if (!md->has_version) return 0;
    char p[8192];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", md->version_path, name);
    if (stat(p, &st) != 0) return 0;
    return S_ISDIR(st.st_mode) ? 2 : 1;
}

static int set_str(char **slot, const char *v)
{
    return cfg_set_string(slot, v);
}

/* Triton's AutoCompleteBackendFields. Returns false on error. */
static bool autocomplete_backend(nctx_t *c, const char *model_name, const model_dir_t *md)
{
    model_config_t *cfg = c->cfg;
    bool no_file = empty(cfg->default_model_filename);
    if (empty(cfg->platform) && (empty(cfg->backend) || streq(cfg->backend, "tensorflow"))) {
        if (streq(cfg->default_model_filename, "model.savedmodel"))
            set_str(&cfg->platform, "tensorflow_savedmodel");
        else if (streq(cfg->default_model_filename, "model.graphdef"))
            set_str(&cfg->platform, "tensorflow_graphdef");
        else if (no_file && version_entry(md, "model.savedmodel") == 2)
            set_str(&cfg->platform, "tensorflow_savedmodel");
        else if (no_file && version_entry(md, "model.graphdef") == 1)
            set_str(&cfg->platform, "tensorflow_graphdef");
    }
    if (streq(cfg->platform, "tensorflow_savedmodel") ||
        streq(cfg->platform, "tensorflow_graphdef")) {
        if (empty(cfg->backend)) set_str(&cfg->backend, "tensorflow");
        if (empty(cfg->default_model_filename))
            set_str(&cfg->default_model_filename, streq(cfg->platform, "tensorflow_savedmodel")
                                                      ? "model.savedmodel"
                                                      : "model.graphdef");
        return true;
    }
    static const struct {
        const char *backend, *platform, *file;
        int kind; /* required entry kind: 1 file, 3 file or directory */
    } simple[] = {
        {"tensorrt", "tensorrt_plan", "model.plan", 1},
        {"onnxruntime", "onnxruntime_onnx", "model.onnx", 3},
        {"openvino", NULL, "model.xml", 3},
    };
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++) {
        if (empty(cfg->backend)) {
            if ((simple[i].platform && streq(cfg->platform, simple[i].platform)) ||
                streq(cfg->default_model_filename, simple[i].file)) {
                set_str(&cfg->backend, simple[i].backend);
            } else if (empty(cfg->platform) && no_file) {
                int k = version_entry(md, simple[i].file);
                if (k && (k & simple[i].kind)) set_str(&cfg->backend, simple[i].backend);
            }
        }
        if (streq(cfg->backend, simple[i].backend)) {
            if (simple[i].platform && empty(cfg->platform))
                set_str(&cfg->platform, simple[i].platform);
            if (empty(cfg->default_model_filename))
                set_str(&cfg->default_model_filename, simple[i].file);
            return true;
        }
    }
    if (empty(cfg->backend)) {
        if (streq(cfg->platform, "pytorch_libtorch") || streq(cfg->platform, "libtorch") ||
            streq(cfg->default_model_filename, "model.pt")) {
            set_str(&cfg->backend, "pytorch");
        } else if (streq(cfg->platform, "torch_aoti") ||
                   streq(cfg->default_model_filename, "model.pt2")) {
            set_str(&cfg->backend, "pytorch");
        } else if (md->has_version && no_file && empty(cfg->platform)) {
            if (version_entry(md, "model.pt") == 1) {
                set_str(&cfg->backend, "pytorch");
                set_str(&cfg->platform, "pytorch_libtorch");
            } else if (version_entry(md, "model.pt2") == 1) {
                set_str(&cfg->backend, "pytorch");
                set_str(&cfg->platform, "torch_aoti");
            }
        }
    }
    if (streq(cfg->backend, "pytorch")) {
        if (empty(cfg->platform)) {
            set_str(&cfg->platform, "pytorch_libtorch");
            if (empty(cfg->default_model_filename))
                set_str(&cfg->default_model_filename, "model.pt");
        } else if (streq(cfg->platform, "torch_aoti") && empty(cfg->default_model_filename)) {
            set_str(&cfg->default_model_filename, "model.pt2");
        }
        return true;
    }
    if (empty(cfg->backend)) {
        if (streq(cfg->default_model_filename, "model.py"))
            set_str(&cfg->backend, "python");
        else if (empty(cfg->platform) && no_file && version_entry(md, "model.py"))
            set_str(&cfg->backend, "python");
    }
    if (streq(cfg->backend, "python")) {
        if (empty(cfg->default_model_filename)) set_str(&cfg->default_model_filename, "model.py");
        return true;
    }
    if (empty(cfg->backend) && empty(cfg->platform) && empty(cfg->default_model_filename)) {
        const char *dot = strchr(model_name, '.');
        if (!dot) {
            nerr(c, NULL, NULL, -1,
                 "Invalid model name: Could not determine backend for model '%s' with no backend "
                 "in model configuration. Expected model name of the form 'model.<backend_name>'.",
                 model_name);
            return false;
        }
        set_str(&cfg->backend, dot + 1);
        char file[512];
        snprintf(file, sizeof file, "model.%s", dot + 1);
        set_str(&cfg->default_model_filename, file);
    }
    return true;
}

/* ---- defaults ---- */

static bool append_int32(ProtobufCMessage *m, const char *field, int32_t v)
{
    const ProtobufCFieldDescriptor *f = cfg_field_by_name(m->descriptor, field, strlen(field));
    int32_t *slot = f ? cfg_repeated_append(m, f) : NULL;
    if (!slot) return false;
    *slot = v;
    return true;
}

static Inference__ModelOptimizationPolicy__PinnedMemoryBuffer *pinned_enabled(void)
{
    Inference__ModelOptimizationPolicy__PinnedMemoryBuffer *p = malloc(sizeof *p);
    if (p) {
        inference__model_optimization_policy__pinned_memory_buffer__init(p);
        p->enable = 1;
    }
    return p;
}

static bool fill_defaults(nctx_t *c)
{
    model_config_t *cfg = c->cfg;
    if (!cfg->version_policy) {
        Inference__ModelVersionPolicy *vp = malloc(sizeof *vp);
        Inference__ModelVersionPolicy__Latest *latest = malloc(sizeof *latest);
        if (!vp || !latest) {
            free(vp);
            free(latest);
            return false;
        }
        inference__model_version_policy__init(vp);
        inference__model_version_policy__latest__init(latest);
        latest->num_versions = 1;
        vp->policy_choice_case = INFERENCE__MODEL_VERSION_POLICY__POLICY_CHOICE_LATEST;
        vp->latest = latest;
        cfg->version_policy = vp;
    }
    if (cfg->scheduling_choice_case ==
            INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_DYNAMIC_BATCHING &&
        cfg->dynamic_batching) {
        if (cfg->dynamic_batching->n_preferred_batch_size == 0 && cfg->max_batch_size > 0)
            if (!append_int32(&cfg->dynamic_batching->base, "preferred_batch_size",
                              cfg->max_batch_size))
                return false;
    }
    if (cfg->scheduling_choice_case ==
            INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_SEQUENCE_BATCHING &&
        cfg->sequence_batching) {
        Inference__ModelSequenceBatching *sb = cfg->sequence_batching;
        if (sb->max_sequence_idle_microseconds == 0) sb->max_sequence_idle_microseconds = 1000000;
        if (sb->strategy_choice_case ==
                INFERENCE__MODEL_SEQUENCE_BATCHING__STRATEGY_CHOICE_OLDEST &&
            sb->oldest && sb->oldest->n_preferred_batch_size == 0 && cfg->max_batch_size > 0)
            if (!append_int32(&sb->oldest->base, "preferred_batch_size", cfg->max_batch_size))
                return false;
    }
    if (cfg->scheduling_choice_case !=
        INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING) {
        if (!cfg->optimization) {
            cfg->optimization = malloc(sizeof *cfg->optimization);
            if (!cfg->optimization) return false;
            inference__model_optimization_policy__init(cfg->optimization);
        }
        if (!cfg->optimization->input_pinned_memory)
            cfg->optimization->input_pinned_memory = pinned_enabled();
        if (!cfg->optimization->output_pinned_memory)
            cfg->optimization->output_pinned_memory = pinned_enabled();
        if (!cfg->optimization->input_pinned_memory || !cfg->optimization->output_pinned_memory)
            return false;
    } else if (!cfg->model_transaction_policy) {
        /* Triton's ensemble validation always sets it (decoupled when a
         * step is). */
        cfg->model_transaction_policy = malloc(sizeof *cfg->model_transaction_policy);
        if (!cfg->model_transaction_policy) return false;
        inference__model_transaction_policy__init(cfg->model_transaction_policy);
    }
    return true;
}

static bool normalize_instance_groups(nctx_t *c, const config_options_t *opts)
{
    model_config_t *cfg = c->cfg;
    if (cfg->scheduling_choice_case ==
        INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING)
        return true;
    if (cfg->n_instance_group == 0) {
        const ProtobufCFieldDescriptor *f =
            cfg_field_by_name(cfg->base.descriptor, "instance_group", 14);
        Inference__ModelInstanceGroup **slot = cfg_repeated_append(&cfg->base, f);
        if (!slot) return false;
        *slot = malloc(sizeof **slot);
        if (!*slot) {
            cfg->n_instance_group--;
            return false;
        }
        inference__model_instance_group__init(*slot);
        if (set_str(&(*slot)->name, cfg->name) != 0) return false;
    }
    for (size_t i = 0; i < cfg->n_instance_group; i++) {
        Inference__ModelInstanceGroup *g = cfg->instance_group[i];
        if (empty(g->name)) {
            char name[1024];
            snprintf(name, sizeof name, "%s_%zu", cfg->name, i);
            if (set_str(&g->name, name) != 0) return false;
        }
        if (g->kind == INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_AUTO)
            g->kind = (opts && opts->gpus_available)
                          ? INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_GPU
                          : INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU;
        if (g->count == 0) { /* unset (proto3); a negative count is an error */
            g->count = 1;
            if (g->kind == INFERENCE__MODEL_INSTANCE_GROUP__KIND__KIND_CPU &&
                (streq(cfg->backend, "tensorflow") || streq(cfg->backend, "onnxruntime")))
                g->count = 2;
        }
    }
    return true;
}
int config_normalize(model_config_t *cfg, const char *model_name, const char *filename,
                     const config_options_t *opts, char **errors)
{
    if (errors) *errors = NULL;
    nctx_t c = {.cfg = cfg, .filename = filename ? filename : "<config>"};
    if (!cfg) return -1;
    /* Triton checks the directory name after completing and validating the
     * config: its errors come first. */
    bool misnamed = false;
    if (model_name && *model_name) {
        if (empty(cfg->name)) {
            if (set_str(&cfg->name, model_name) != 0) goto oom;
        } else {
            misnamed = !streq(cfg->name, model_name);
        }
    }
    c.name = cfg->name ? cfg->name : "";
    if (empty(cfg->name)) {
        nerr(&c, NULL, NULL, -1, "model configuration must specify 'name'");
        goto out;
    }
    model_dir_t md;
    inspect_model_dir(opts ? opts->model_dir : NULL, filename, &md);
    if (!autocomplete_backend(&c, model_name && *model_name ? model_name : cfg->name, &md))
        goto out;
    if (!fill_defaults(&c) || !normalize_instance_groups(&c, opts)) goto oom;
    validate_model_config(&c);
    validate_instance_groups(&c, opts);
    validate_io(&c, opts);
    if (cfg->scheduling_choice_case !=
        INFERENCE__MODEL_CONFIG__SCHEDULING_CHOICE_ENSEMBLE_SCHEDULING)
        validate_warmup(&c);
    goto out;
oom:
    nerr(&c, NULL, NULL, -1, "out of memory");
out:
    if (misnamed)
        nerr(&c, cfg, "name", -1,
             "unexpected directory name '%s' for model '%s', directory name must equal model "
             "name",
             model_name, cfg->name);
    if (c.n_errors == 0 && !c.err.oom) {
        cfg_buf_free(&c.err);
        return 0;
    }
    if (errors)
        *errors = cfg_buf_take(&c.err);
    else
        cfg_buf_free(&c.err);
    return -1;
}
