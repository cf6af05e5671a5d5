/*
 * This file contains the unit tests of the JSON reader's string scanner,
 * which skips plain bytes eight at a time: every byte that needs a look (the
 * closing quote, an escape, a control byte, valid and invalid UTF-8, the end
 * of the text) is put at every offset of a string that starts at every
 * alignment, and the parse must give the same value, or the same error text
 * at the same offset, as the byte-by-byte rules say. The string writer,
 * which copies plain bytes eight at a time, is checked the same way against
 * a byte-by-byte escaper.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/infer_reply.h"
#include "http/json_reader.h"

/* Parses text; returns the error message or NULL, and the string member
 * "k" of the root object (with its length) on success. */
static const char *parse(const char *text, size_t len, jarena_t *arena, const jv_t **k)
{
    jv_t *root;
    static char msg[256];
    nereid_error_t *err = json_reader_parse(text, len, arena, &root);
    if (err) {
        snprintf(msg, sizeof msg, "%s", nereid_error_message(err));
        nereid_error_free(err);
        return msg;
    }
    *k = jv_get(root, "k");
    return NULL;
}

/* Whether msg ends with "<what> at <offset>". */
static bool error_at(const char *msg, const char *what, size_t offset)
{
    char want[128];
    snprintf(want, sizeof want, "%s at %zu", what, offset);
    size_t n = strlen(msg), w = strlen(want);
    return msg && n >= w && !strcmp(msg + n - w, want);
}

/* The writer's rules one byte at a time: '"' and '\\' escaped, control
 * bytes as \n \r \t \b \f or \u00XX, everything else as it is. */
static size_t escape_slowly(const unsigned char *s, size_t n, char *o)
{
    char *start = o;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        const char *named = c == '\n'   ? "n"
                            : c == '\r' ? "r"
                            : c == '\t' ? "t"
                            : c == '\b' ? "b"
                            : c == '\f' ? "f"
                                        : NULL;
        if (c == '"' || c == '\\')
            o += sprintf(o, "\\%c", c);
        else if (named)
            o += sprintf(o, "\\%s", named);
        else if (c < 0x20)
            o += sprintf(o, "\\u%04x", c);
        else
            *o++ = (char)c;
    }
    *o++ = '"';
    return (size_t)(o - start);
}

static void test_writer(void)
{
    static const unsigned char specials[] = {'"', '\\', '\n', 0x01, 0x1F, 0x7F, 0x80, 0xFF, ' '};
    int bad = 0;
    for (size_t len = 0; len <= 40; len++) {
        for (size_t pos = 0; pos < len || (len == 0 && pos == 0); pos++) {
            for (size_t k = 0; k < sizeof specials; k++) {
                unsigned char in[64];
                char want[512];
                memset(in, 'a' + (int)(len % 26), len);
                if (len) in[pos] = specials[k];
                if (len > 3 && pos + 3 < len) in[pos + 3] = specials[(k + 1) % sizeof specials];
                size_t wn = escape_slowly(in, len, want);
                sbuf_t b = {0};
                if (sbuf_append_json_string(&b, (const char *)in, len) || b.len != wn ||
                    memcmp(b.data, want, wn))
                    bad++;
                free(b.data);
            }
        }
    }
    CHECK_MSG(bad == 0, "%d written strings differ", bad);
}

int main(void)
{
    test_writer();
    int bad = 0;
    for (int align = 1; align <= 8; align++) {
        for (int pos = 0; pos <= 24; pos++) {
            char text[128];
            /* {"k":   "aaaa<special>aaaa"}: the spaces move the string's start. */
            int head = snprintf(text, sizeof text, "{\"k\":%*s\"", align, "");
            memset(text + head, 'a', (size_t)pos);
            size_t at = (size_t)head + (size_t)pos; /* offset of the special byte */
            const jv_t *k = NULL;
            const char *err;
            jarena_t arena;

            /* The closing quote right there. */
            jarena_init(&arena);
            memcpy(text + at, "\"}", 2);
            err = parse(text, at + 2, &arena, &k);
            if (err || !k || k->type != JV_STRING || k->len != (size_t)pos) bad++;
            jarena_free(&arena);

            /* An escape, then more plain bytes and the quote. */
            jarena_init(&arena);
            memcpy(text + at, "\\nbbbbbbbbbb\"}", 14);
            err = parse(text, at + 14, &arena, &k);
            if (err || !k || k->len != (size_t)pos + 11 || k->v.s[pos] != '\n') bad++;
            jarena_free(&arena);

            /* Valid two- and four-byte UTF-8. */
            jarena_init(&arena);
            memcpy(text + at,
                   "\xC3\xA9\xF0\x9F\x98\x80"
                   "bbbbbbbbb\"}",
                   17);
            err = parse(text, at + 17, &arena, &k);
            if (err)
                bad++;
            else if (!k || k->len != (size_t)pos + 15 ||
                     memcmp(k->v.s + pos, "\xC3\xA9\xF0\x9F\x98\x80", 6))
                bad++;
            jarena_free(&arena);

            /* A control byte, an invalid UTF-8 byte, a bad escape, a
             * missing quote: the error and its offset. */
            static const struct {
                const char *bytes;
                const char *what;
                size_t delta; /* where the error points, from the special byte */
            } errors[] = {
                {"\x01xxxxxxxxxx\"}", "Invalid encoding in string.", 0},
                {"\x1Fxxxxxxxxxx\"}", "Invalid encoding in string.", 0},
                {"\xFFxxxxxxxxxx\"}", "Invalid encoding in string.", 0},
                {"\xC3(xxxxxxxxx\"}", "Invalid encoding in string.", 0},
                {"\\qxxxxxxxxxx\"}", "Invalid escape character in string.", 1},
                {"\\u12G4xxxxxx\"}", "Incorrect hex digit after \\u escape in string.", 2},
            };
            for (size_t e = 0; e < sizeof errors / sizeof errors[0]; e++) {
                jarena_init(&arena);
                size_t n = strlen(errors[e].bytes);
                memcpy(text + at, errors[e].bytes, n);
                err = parse(text, at + n, &arena, &k);
                if (!err || !error_at(err, errors[e].what, at + errors[e].delta)) {
                    if (bad++ < 10)
                        fprintf(stderr, "align %d pos %d case %zu: %s\n", align, pos, e,
                                err ? err : "no error");
                }
                jarena_free(&arena);
            }

            /* The text ends inside the string. */
            jarena_init(&arena);
            err = parse(text, at, &arena, &k);
            if (!err || !error_at(err, "Missing a closing quotation mark in string.", at)) {
                if (bad++ < 10)
                    fprintf(stderr, "align %d pos %d unterminated: %s\n", align, pos,
                            err ? err : "no error");
            }
            jarena_free(&arena);
        }
    }
    CHECK_MSG(bad == 0, "%d string cases differ", bad);
    return check_summary();
}
