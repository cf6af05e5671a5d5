/*
 * This file contains the libFuzzer harness of the repository load API: the
 * first byte picks the model name (one in the repository, an ensemble over
 * it, or one that only exists through file overrides), the rest is the HTTP
 * request body ({"parameters": {"config": "<json>", "file:<path>": "<b64>"}}).
 * The body is read as the HTTP frontend reads it, the model is loaded with
 * its overrides (config JSON parsing, normalization and validation, override
 * files written to a temporary directory, backend load, warmup) and then
 * unloaded with its dependents.
 *
 * Everything happens under one temporary root (repository, backends, TMPDIR).
 * After every input the harness checks that nothing was written outside
 * TMPDIR and that no override directory outlives the unload.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/load_request.h"
#include "nereid/server.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static nereid_server_t *server;
static char root[] = "/tmp/nereid-fuzz-load-XXXXXX";
static char tmpdir[sizeof(root) + 8];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) abort();
}

static void make_dir(const char *fmt, const char *arg)
{
    char path[512];
    snprintf(path, sizeof(path), fmt, root, arg);
    if (mkdir(path, 0755) != 0) abort();
}

/* Number of entries of dir other than "." and "..". */
static size_t count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) abort();
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

static void remove_root(void)
{
    char cmd[sizeof(root) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "fuzz_load: could not remove %s\n", root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (mkdtemp(root) == NULL) abort();
    atexit(remove_root);
    snprintf(tmpdir, sizeof(tmpdir), "%s/tmp", root);
    make_dir("%s/%s", "tmp");
    make_dir("%s/%s", "repo");
    make_dir("%s/repo/%s", "m");
    make_dir("%s/repo/%s/1", "m");
    make_dir("%s/repo/%s", "e");
    make_dir("%s/repo/%s/1", "e");
    make_dir("%s/%s", "backends");
    char path[512];
    snprintf(path, sizeof(path), "%s/repo/m/config.pbtxt", root);
    write_file(path, "backend: \"identity\"\nmax_batch_size: 4\n"
                     "input [ { name: \"INPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                     "output [ { name: \"OUTPUT0\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n");
    snprintf(path, sizeof(path), "%s/repo/e/config.pbtxt", root);
    write_file(path, "platform: \"ensemble\"\nmax_batch_size: 4\n"
                     "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                     "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ -1 ] } ]\n"
                     "ensemble_scheduling { step [ { model_name: \"m\" model_version: -1\n"
                     "  input_map { key: \"INPUT0\" value: \"IN\" }\n"
                     "  output_map { key: \"OUTPUT0\" value: \"OUT\" } } ] }\n");
    /* Only the in-tree backends that neither sleep nor parse model files. */
    static const char *const backends[] = {"identity", "add_sub", "accumulator"};
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
        char target[512];
        snprintf(target, sizeof(target), "%s/libnereid_%s.so", NEREID_DEFAULT_BACKEND_DIR,
                 backends[i]);
        snprintf(path, sizeof(path), "%s/backends/libnereid_%s.so", root, backends[i]);
        if (symlink(target, path) != 0) abort();
        /* Held open for good: the server's dlclose on unload must not unmap
         * the library's coverage counters while libFuzzer reads them. */
        if (dlopen(path, RTLD_NOW | RTLD_NODELETE) == NULL) {
            fprintf(stderr, "fuzz_load: %s\n", dlerror());
            abort();
        }
    }
    setenv("TMPDIR", tmpdir, 1);

    char repo[512], backend_dir[512];
    snprintf(repo, sizeof(repo), "%s/repo", root);
    snprintf(backend_dir, sizeof(backend_dir), "%s/backends", root);
    const char *repos[] = {repo};
    nereid_server_options_t opts;
    nereid_server_options_init(&opts);
    opts.model_repositories = repos;
    opts.n_model_repositories = 1;
    opts.backend_directory = backend_dir;
    opts.model_control_mode = NEREID_MODEL_CONTROL_EXPLICIT;
    opts.log_info = opts.log_warning = opts.log_error = false;
    nereid_error_t *err = nereid_server_new(&opts, &server);
    if (err != NULL) {
        fprintf(stderr, "fuzz_load: %s\n", nereid_error_message(err));
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const char *const names[] = {"m", "e", "new", "m"};
    const char *name = names[data[0] % 4];
    json_t *body = size > 1 ? json_loadb((const char *)data + 1, size - 1, 0, NULL) : NULL;
    if (size > 1 && body == NULL) return 0;
    load_request_t req;
    nereid_error_t *err = load_request_read(body, &req);
    if (err == NULL)
        err = nereid_server_load_model(server, name, req.config, req.paths,
                                       (const void *const *)req.contents, req.sizes, req.n_files);
    if (getenv("FUZZ_LOAD_VERBOSE") != NULL)
        fprintf(stderr, "fuzz_load: '%s': %s\n", name, err ? nereid_error_message(err) : "loaded");
    nereid_error_free(err);
    load_request_free(&req);
    json_decref(body);
    nereid_error_free(nereid_server_unload_model(server, name, true));
    nereid_error_free(nereid_server_unload_model(server, "m", true));

    /* Writes stay inside TMPDIR, and the unload removed them. */
    char path[sizeof(root) + 16];
    size_t repo_entries = 0;
    static const char *const dirs[] = {"repo", "repo/m", "repo/e"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", root, dirs[i]);
        repo_entries += count_entries(path);
    }
    if (count_entries(root) != 3 || repo_entries != 6) {
        fprintf(stderr, "fuzz_load: a file was written outside %s\n", tmpdir);
        abort();
    }
    if (count_entries(tmpdir) != 0) {
        fprintf(stderr, "fuzz_load: an override directory outlived its model in %s\n", tmpdir);
        abort();
    }
    return 0;
}
