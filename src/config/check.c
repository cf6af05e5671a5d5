/*
 * This file contains `nereid check-config`: it validates the config.pbtxt of
 * every model directory given (or of every model in a given repository)
 * without starting a server, prints each normalized configuration as one
 * line of JSON on stdout and each error as path:line:col: message on
 * stderr, and exits non-zero when any configuration is invalid.
 */
#include <dirent.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_internal.h"
#include "nereid/common.h"

/* Checks one model directory. Returns 0 when valid. */
static int check_model_dir(const char *dir)
{
    char path[4096];
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    snprintf(path, sizeof path, "%.*s/config.pbtxt", (int)dl, dir);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%.*s", (int)dl, dir);
    const char *model_name = basename(tmp);

    char *errors = NULL;
    model_config_t *cfg;
    if (nereid_is_file(path)) {
        cfg = config_parse_file(path, &errors);
    } else {
        /* Triton can auto-complete a model without config.pbtxt. */
        cfg = config_parse_text("", 0, path, &errors);
    }
    if (!cfg) {
        fputs(errors ? errors : "error\n", stderr);
        free(errors);
        return 1;
    }
    config_options_t opts = {.gpus_available = false, .allow_missing_io = true};
    int rc = config_normalize(cfg, model_name, path, &opts, &errors);
    if (rc != 0) {
        fputs(errors ? errors : "error\n", stderr);
        free(errors);
        config_free(cfg);
        return 1;
    }
    char *json = config_to_json(cfg);
    if (json) {
        puts(json);
        free(json);
    }
    config_free(cfg);
    return 0;
}

/* A directory with a numeric subdirectory is a model directory (possibly
 * without config.pbtxt); otherwise it is taken as a repository. */
static bool has_version_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(dp))) {
        const char *s = e->d_name;
        if (!*s) continue;
        while (*s >= '0' && *s <= '9')
            s++;
        if (*s) continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        found = nereid_is_dir(p);
    }
    closedir(dp);
    return found;
}

/* Checks every model of a repository directory. */
static int check_repository(const char *repo)
{
    DIR *dp = opendir(repo);
    if (!dp) {
        fprintf(stderr, "%s: unable to open directory\n", repo);
        return 1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", repo, e->d_name);
        if (!nereid_is_dir(p)) continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn) break;
        names = nn;
        names[n] = strdup(p);
        if (names[n]) n++;
    }
    closedir(dp);
    qsort(names, n, sizeof *names, nereid_cmp_str);
    int rc = 0;
    if (n == 0) {
        fprintf(stderr, "%s: no model directories found\n", repo);
        rc = 1;
    }
    for (size_t i = 0; i < n; i++) {
        rc |= check_model_dir(names[i]);
        free(names[i]);
    }
    free(names);
    return rc;
}

int config_check_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: nereid check-config <model-dir-or-repository>...\n"
                "Validates config.pbtxt files, prints each normalized configuration as JSON on\n"
                "stdout and every error as path:line:col: message on stderr.\n");
        return argc < 2 ? 2 : 0;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        char path[4096];
        snprintf(path, sizeof path, "%s/config.pbtxt", arg);
        if (nereid_is_file(arg)) {
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s", arg);
            rc |= check_model_dir(dirname(tmp));
        } else if (!nereid_is_dir(arg)) {
            fprintf(stderr, "%s: no such model directory or repository\n", arg);
            rc = 1;
        } else if (nereid_is_file(path) || has_version_dir(arg)) {
            rc |= check_model_dir(arg);
        } else {
            rc |= check_repository(arg);
        }
    }
    return rc ? 1 : 0;
}
