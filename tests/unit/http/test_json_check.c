/*
 * This file contains the unit tests of json_reader_check, the recursion-free
 * check of every non-inference JSON body: on random documents and random
 * mutations of them (a byte changed, dropped or repeated, the text cut), it
 * must accept exactly what the recursive reader (json_reader_parse) accepts
 * and refuse the rest with the same text at the same offset; at any depth it
 * must not recurse; and its flattened copy must read as the same document
 * with every container below keep_depth empty. (A NUL escape in a string is
 * left to jansson, which reads the checked text next: not generated here.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/json_reader.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;

static unsigned next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 11);
}

/* Appends a random JSON value of at most depth levels to buf. */
static void gen_value(char *buf, size_t cap, size_t *len, int depth)
{
    static const char *const scalars[] = {
        "0",     "-12",  "3.5e2",        "1e400", "true",
        "false", "null", "\"a\\u00e9\"", "\"\"",  "18446744073709551616"};
    unsigned r = next() % (depth > 0 ? 4 : 1);
    if (*len + 64 >= cap) r = 0;
    if (r == 0) {
        *len += (size_t)snprintf(buf + *len, cap - *len, "%s", scalars[next() % 10]);
        return;
    }
    bool obj = r == 1;
    buf[(*len)++] = obj ? '{' : '[';
    unsigned n = next() % 4;
    for (unsigned i = 0; i < n && *len + 64 < cap; i++) {
        if (i) *len += (size_t)snprintf(buf + *len, cap - *len, "%s", next() % 2 ? "," : " , ");
        if (obj) *len += (size_t)snprintf(buf + *len, cap - *len, "\"k%u\" : ", i);
        gen_value(buf, cap, len, depth - 1);
    }
    buf[(*len)++] = obj ? '}' : ']';
}

/* The error text of a reader, or "" when it accepts. */
static void outcome(nereid_error_t *err, char *out, size_t cap)
{
    snprintf(out, cap, "%s", err ? nereid_error_message(err) : "");
    nereid_error_free(err);
}

static void same_as_parse(const char *text, size_t len)
{
    char a[256], b[256];
    jarena_t arena;
    jarena_init(&arena);
    jv_t *root;
    outcome(json_reader_parse(text, len, &arena, &root), a, sizeof a);
    jarena_free(&arena);
    char *flat;
    size_t flat_len;
    outcome(json_reader_check(text, len, 1000, &flat, &flat_len), b, sizeof b);
    CHECK_MSG(!strcmp(a, b), "\"%.*s\": parse \"%s\", check \"%s\"", (int)len, text, a, b);
    CHECK(flat == NULL);
    free(flat);
}

static void test_random_documents(void)
{
    char buf[4096], mut[4097];
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = 0;
        gen_value(buf, sizeof buf, &len, 6);
        same_as_parse(buf, len);
        /* One mutation: a byte replaced, dropped or doubled, or the end cut. */
        size_t at = len ? next() % len : 0, n = len;
        memcpy(mut, buf, len);
        switch (next() % 4) {
        case 0:
            mut[at] = " ,:[]{}\"\\e0-.x"[next() % 15];
            break;
        case 1:
            memmove(mut + at, mut + at + 1, len - at - 1);
            n--;
            break;
        case 2:
            memmove(mut + at + 1, mut + at, len - at);
            n++;
            break;
        default:
            n = at;
        }
        same_as_parse(mut, n);
    }
}

static void test_any_depth_and_flattening(void)
{
    /* 200000 levels: the recursive reader refuses, the check accepts and
     * flattens below keep_depth. */
    size_t depth = 200000, len = 0;
    char *text = malloc(2 * depth + 64);
    len += (size_t)sprintf(text, "{\"a\":");
    memset(text + len, '[', depth), len += depth;
    memset(text + len, ']', depth), len += depth;
    len += (size_t)sprintf(text + len, ",\"b\":{\"c\":[1,{\"d\":2}]},\"e\":true}");
    char *flat;
    size_t flat_len;
    nereid_error_t *err = json_reader_check(text, len, 3, &flat, &flat_len);
    CHECK(err == NULL);
    nereid_error_free(err);
    CHECK_MSG(flat && !strcmp(flat, "{\"a\":[[[]]],\"b\":{\"c\":[1,{}]},\"e\":true}"), "flat %s",
              flat ? flat : "(null)");
    free(flat);
    /* The same text, broken after the deep part: refused with its offset. */
    text[len - 1] = ','; /* "true," and the end: a member name is missing */
    err = json_reader_check(text, len, 3, &flat, &flat_len);
    char want[128];
    snprintf(want, sizeof want,
             "failed to parse the request JSON buffer: Missing a name for object member. at %zu",
             len);
    CHECK_ERROR(err, NEREID_ERROR_INTERNAL, want);
    CHECK(flat == NULL);
    free(text);
    /* Shallow documents are not copied. */
    err = json_reader_check("{\"x\":[1]}", 9, 64, &flat, &flat_len);
    CHECK(err == NULL && flat == NULL);
    nereid_error_free(err);
    CHECK_ERROR(json_reader_check("", 0, 64, &flat, &flat_len), NEREID_ERROR_INTERNAL,
                "failed to parse the request JSON buffer: The document is empty. at 0");
}

int main(void)
{
    test_random_documents();
    test_any_depth_and_flattening();
    return check_summary();
}
