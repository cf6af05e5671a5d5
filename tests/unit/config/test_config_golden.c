/*
 * Golden model-configuration cases: every directory tests/config/<case>/
 * holds a config.pbtxt (parsed and normalized for model name <case>) and
 * either expected.json (the normalized config in Triton's JSON form) or
 * expected_error (the error lines, with paths relative to the case
 * directory). Valid cases also round-trip through config_from_json and
 * config_copy. Run from the source directory (CTest does). Set
 * NEREID_GOLDEN_UPDATE=1 to (re)write the expected files.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config.h"

#define CASES_DIR "tests/config"

static char *read_all(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, fp) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(fp);
    return s;
}

static void rstrip(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

/* Removes every occurrence of prefix from s (in place). */
static void strip_prefix_everywhere(char *s, const char *prefix)
{
    size_t pl = strlen(prefix);
    char *r = s, *w = s;
    while (*r) {
        if (strncmp(r, prefix, pl) == 0) {
            r += pl;
            continue;
        }
        *w++ = *r++;
    }
    *w = '\0';
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_case(const char *name, bool update)
{
    char dir[1024], cfg_path[1200], exp_json[1200], exp_err[1200];
    snprintf(dir, sizeof dir, CASES_DIR "/%s", name);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.pbtxt", dir);
    snprintf(exp_json, sizeof exp_json, "%s/expected.json", dir);
    snprintf(exp_err, sizeof exp_err, "%s/expected_error", dir);

    char *errors = NULL;
    char *json = NULL;
    model_config_t *cfg = config_parse_file(cfg_path, &errors);
    if (cfg) {
        config_options_t opts = {.gpus_available = false, .allow_missing_io = true};
        if (config_normalize(cfg, name, cfg_path, &opts, &errors) == 0) json = config_to_json(cfg);
    }
    int failed = 0;
    if (json) {
        /* round trips: JSON in, copy */
        char *jerr = NULL;
        model_config_t *back = config_from_json(json, strlen(json), &jerr);
        char *json2 = back ? config_to_json(back) : NULL;
        model_config_t *copy = config_copy(cfg);
        char *json3 = copy ? config_to_json(copy) : NULL;
        if (!json2 || strcmp(json, json2) != 0) {
            fprintf(stderr, "FAIL %s: JSON round trip differs: %s\n", name,
                    jerr ? jerr : (json2 ? json2 : "(null)"));
            failed = 1;
        }
        if (!json3 || strcmp(json, json3) != 0) {
            fprintf(stderr, "FAIL %s: config_copy differs\n", name);
            failed = 1;
        }
        free(jerr);
        free(json2);
        free(json3);
        config_free(back);
        config_free(copy);
    }
    config_free(cfg);

    char prefix[1100];
    snprintf(prefix, sizeof prefix, "%s/", dir);
    if (errors) {
        strip_prefix_everywhere(errors, prefix);
        rstrip(errors);
    }
    if (update) {
        remove(exp_json);
        remove(exp_err);
        if (json) {
            FILE *fp = fopen(exp_json, "wb");
            if (fp) {
                fprintf(fp, "%s\n", json);
                fclose(fp);
            }
        } else {
            FILE *fp = fopen(exp_err, "wb");
            if (fp) {
                fprintf(fp, "%s\n", errors ? errors : "");
                fclose(fp);
            }
        }
        free(json);
        free(errors);
        return failed;
    }

    char *want_json = read_all(exp_json);
    char *want_err = read_all(exp_err);
    if (want_json) rstrip(want_json);
    if (want_err) rstrip(want_err);
    if (!want_json && !want_err) {
        fprintf(stderr, "FAIL %s: no expected.json or expected_error\n", name);
        failed = 1;
    } else if (want_json) {
        if (!json) {
            fprintf(stderr, "FAIL %s: expected a valid config, got errors:\n%s\n", name,
                    errors ? errors : "");
            failed = 1;
        } else if (strcmp(json, want_json) != 0) {
            fprintf(stderr, "FAIL %s: JSON differs\n  got:  %s\n  want: %s\n", name, json,
                    want_json);
            failed = 1;
        }
    } else {
        if (json) {
            fprintf(stderr, "FAIL %s: expected an error, config was accepted: %s\n", name, json);
            failed = 1;
        } else if (strcmp(errors ? errors : "", want_err) != 0) {
            fprintf(stderr, "FAIL %s: error differs\n  got:  %s\n  want: %s\n", name,
                    errors ? errors : "", want_err);
            failed = 1;
        }
    }
    free(want_json);
    free(want_err);
    free(json);
    free(errors);
    return failed;
}

int main(void)
{
    bool update = getenv("NEREID_GOLDEN_UPDATE") != NULL;
    DIR *dp = opendir(CASES_DIR);
    if (!dp) {
        fprintf(stderr, "cannot open " CASES_DIR " (run from the source directory)\n");
        return 1;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.') continue;
        char **nn = realloc(names, (n + 1) * sizeof *nn);
        if (!nn) return 1;
        names = nn;
        names[n++] = strdup(e->d_name);
    }
    closedir(dp);
    qsort(names, n, sizeof *names, cmp_str);
    int failures = 0, valid = 0, invalid = 0;
    for (size_t i = 0; i < n; i++) {
        char p[1200];
        struct stat st;
        snprintf(p, sizeof p, CASES_DIR "/%s/expected.json", names[i]);
        if (stat(p, &st) == 0)
            valid++;
        else
            invalid++;
        failures += run_case(names[i], update);
        free(names[i]);
    }
    free(names);
    printf("%d golden cases (%d valid, %d invalid), %d failed\n", valid + invalid, valid, invalid,
           failures);
    return failures ? 1 : 0;
}
