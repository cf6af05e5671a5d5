/*
 * This file contains the libFuzzer harness of object storage listings and
 * errors: the first byte picks the service (even: S3 ListObjectsV2, odd:
 * Azure List Blobs), the rest is a listing page as a server would send it.
 * Every key the page yields goes through the mirror's key check, and the
 * page through the error-text reader. Checked: no crash, no leak, and a
 * key the check accepts has no "..", "." or empty component and does not
 * start with '/'.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "storage/storage_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_accepted(const char *key)
{
    if (key[0] == '/') abort();
    const char *p = key;
    for (;;) {
        size_t c = strcspn(p, "/");
        if (c == 0 || (c == 1 && p[0] == '.') || (c == 2 && p[0] == '.' && p[1] == '.')) abort();
        if (!p[c]) break;
        p += c + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const storage_service_t *svc = data[0] & 1 ? &storage_azure : &storage_s3;
    const char *page = (const char *)data + 1;
    size_t len = size - 1;
    storage_listing_t l = {0};
    char *next = NULL;
    if (svc->parse_list(page, len, &l, &next) == 0) {
        for (size_t i = 0; i < l.n; i++) {
            const char *slash = strchr(l.objects[i].key, '/');
            if (!storage_check_key(l.objects[i].key, false)) check_accepted(l.objects[i].key);
            if (slash && !storage_check_key(slash + 1, false)) check_accepted(slash + 1);
        }
    }
    free(next);
    storage_listing_clear(&l);
    free(storage_error_text(page, len));
    return 0;
}
