/*
 * This file contains the reader of the repository load API's request body:
 * the "config" override and the base64-decoded "file:<path>" overrides.
 */
#include "http/load_request.h"

#include <stdlib.h>
#include <string.h>

static const signed char b64_table[256] = {
#define R(x) [x] = (signed char)
    ['A'] = 0,  ['B'] = 1,  ['C'] = 2,  ['D'] = 3,  ['E'] = 4,  ['F'] = 5,  ['G'] = 6,  ['H'] = 7,
    ['I'] = 8,  ['J'] = 9,  ['K'] = 10, ['L'] = 11, ['M'] = 12, ['N'] = 13, ['O'] = 14, ['P'] = 15,
    ['Q'] = 16, ['R'] = 17, ['S'] = 18, ['T'] = 19, ['U'] = 20, ['V'] = 21, ['W'] = 22, ['X'] = 23,
    ['Y'] = 24, ['Z'] = 25, ['a'] = 26, ['b'] = 27, ['c'] = 28, ['d'] = 29, ['e'] = 30, ['f'] = 31,
    ['g'] = 32, ['h'] = 33, ['i'] = 34, ['j'] = 35, ['k'] = 36, ['l'] = 37, ['m'] = 38, ['n'] = 39,
    ['o'] = 40, ['p'] = 41, ['q'] = 42, ['r'] = 43, ['s'] = 44, ['t'] = 45, ['u'] = 46, ['v'] = 47,
    ['w'] = 48, ['x'] = 49, ['y'] = 50, ['z'] = 51, ['0'] = 52, ['1'] = 53, ['2'] = 54, ['3'] = 55,
    ['4'] = 56, ['5'] = 57, ['6'] = 58, ['7'] = 59, ['8'] = 60, ['9'] = 61, ['+'] = 62, ['/'] = 63,
#undef R
};

/* Decodes standard base64 (padding optional). Returns the length or -1. */
static long b64_decode(const char *in, size_t n, unsigned char *out)
{
    unsigned acc = 0;
    int bits = 0;
    long len = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (ch == '=') break;
        if (ch != 'A' && b64_table[ch] == 0) return -1;
        acc = (acc << 6) | (unsigned)b64_table[ch];
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    return len;
}

nereid_error_t *load_request_read(json_t *root, load_request_t *req)
{
    memset(req, 0, sizeof *req);
    json_t *params = root && json_is_object(root) ? json_object_get(root, "parameters") : NULL;
    if (!params || !json_is_object(params)) return NULL;
    size_t cap = json_object_size(params);
    req->paths = calloc(cap + 1, sizeof *req->paths);
    req->contents = calloc(cap + 1, sizeof *req->contents);
    req->sizes = calloc(cap + 1, sizeof *req->sizes);
    if (!req->paths || !req->contents || !req->sizes)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(params, key, v)
    {
        if (!json_is_string(v))
            return nereid_error_new(NEREID_ERROR_INTERNAL,
                                    "unexpected error on creating Triton parameter");
        if (!strcmp(key, "config")) {
            req->config = json_string_value(v);
        } else if (!strncmp(key, "file:", 5)) {
            size_t len = json_string_length(v);
            unsigned char *buf = malloc(len / 4 * 3 + 4);
            long dl = buf ? b64_decode(json_string_value(v), len, buf) : -1;
            if (dl < 0) {
                free(buf);
                return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                        "failed to decode base64 content of '%s'", key);
            }
            req->paths[req->n_files] = key + 5;
            req->contents[req->n_files] = buf;
            req->sizes[req->n_files++] = (size_t)dl;
        }
    }
    return NULL;
}

void load_request_free(load_request_t *req)
{
    for (size_t i = 0; i < req->n_files; i++)
        free(req->contents[i]);
    free(req->paths);
    free(req->contents);
    free(req->sizes);
    memset(req, 0, sizeof *req);
}
