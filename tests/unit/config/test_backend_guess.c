/*
 * Unit tests of the one rule that guesses a model's backend from its files
 * when the config names neither platform nor backend (config_normalize,
 * Triton's AutoCompleteBackendFields): the first subdirectory by name of
 * the model directory is inspected, not the highest version and not every
 * version; opts.model_dir (what the repository passes) names the model
 * directory when the config file lives elsewhere (--model-config-name).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"

static char root[256];

static void touch(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}

/* Normalizes an empty config of model name in <root>/<name>; model_dir
 * given: passed as opts.model_dir, with the config file in configs/.
 * Returns the config (NULL on error, *errors set). */
static model_config_t *guess(const char *name, bool model_dir, char **errors)
{
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(file, sizeof file, "%s/%s", dir, model_dir ? "configs/custom.pbtxt" : "config.pbtxt");
    model_config_t *cfg = config_parse_text("", 0, file, errors);
    config_options_t opts = {.allow_missing_io = true, .model_dir = model_dir ? dir : NULL};
    if (cfg && config_normalize(cfg, name, file, &opts, errors) != 0) {
        config_free(cfg);
        cfg = NULL;
    }
    return cfg;
}

static void check_guess(const char *name, bool model_dir, const char *backend, const char *platform)
{
    char *errors = NULL;
    model_config_t *cfg = guess(name, model_dir, &errors);
    CHECK_MSG(cfg != NULL, "%s: %s", name, errors ? errors : "");
    if (cfg) {
        CHECK_STR(cfg->backend, backend);
        CHECK_STR(cfg->platform, platform);
        config_free(cfg);
    }
    free(errors);
}

int main(void)
{
    snprintf(root, sizeof root, "%s/nereid-guess-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    /* The first version directory decides, not the highest one. */
    touch("first/1/model.pt");
    touch("first/2/model.onnx");
    check_guess("first", false, "pytorch", "pytorch_libtorch");
    /* First by name (bytewise), as Triton's sorted set: "10" before "9". */
    touch("byname/9/model.pt");
    touch("byname/10/model.onnx");
    check_guess("byname", false, "onnxruntime", "onnxruntime_onnx");
    /* model.plan is looked for before model.onnx (Triton's order). */
    touch("plan/1/model.plan");
    touch("plan/1/model.onnx");
    check_guess("plan", false, "tensorrt", "tensorrt_plan");
    touch("python/1/model.py");
    check_guess("python", false, "python", "");
    /* A config read from configs/ (--model-config-name): the model
     * directory's versions are inspected, not configs/. */
    touch("custom/configs/custom.pbtxt");
    touch("custom/1/model.onnx");
    check_guess("custom", true, "onnxruntime", "onnxruntime_onnx");
    /* Nothing to go by: Triton's error. */
    touch("nothing/1/readme.txt");
    char *errors = NULL;
    model_config_t *cfg = guess("nothing", false, &errors);
    CHECK(cfg == NULL);
    CHECK_STR_CONTAINS(errors, "Could not determine backend for model 'nothing'");
    free(errors);
    if (cfg) config_free(cfg);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
    return check_summary();
}
