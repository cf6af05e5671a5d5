/*
 * This file contains unit tests of the confined reading of files a model
 * configuration names (util_confine_path, util_read_confined): absolute
 * paths, ".." escapes and symlinks leaving the directory, non-regular
 * files, the size bound and its prefix mode, and NUL bytes in text.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/util.h"
#include "test_util.h"

static char *in_repo(const char *rel)
{
    return xasprintf("%s/%s", repo, rel);
}

static void symlink_in_repo(const char *target, const char *rel)
{
    char *p = in_repo(rel);
    if (symlink(target, p) != 0) abort();
    free(p);
}

/* Reads rel under repo/m and returns the error (NULL on success, then the
 * bytes are compared with want). */
static nereid_error_t *read_case(const char *rel, size_t max, unsigned flags, const char *want,
                                 size_t want_len)
{
    char *root = in_repo("m");
    char *buf = (char *)1;
    size_t len = 7;
    nereid_error_t *err = util_read_confined(root, rel, max, flags, "file 'x'", &buf, &len);
    free(root);
    if (err) {
        CHECK(buf == NULL && len == 0);
        return err;
    }
    CHECK_MSG(len == want_len && memcmp(buf, want, len) == 0, "reading %s", rel);
    CHECK(buf[len] == 0);
    free(buf);
    return NULL;
}

static void test_paths(void)
{
    char *root = in_repo("m");
    char *got = NULL;
    CHECK(util_confine_path(root, "/etc/passwd", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "../secret", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "a/../../secret", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "./../m/labels.txt", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "1/../labels.txt", &got) == UTIL_PATH_INSIDE);
    CHECK(got && strstr(got, "/m/labels.txt") && got[0] == '/');
    free(got);
    CHECK(util_confine_path(root, "nope/../../x", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "missing", &got) == UTIL_PATH_MISSING && got == NULL);
    CHECK(util_confine_path(root, "out_link", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "dir_link/secret", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path(root, "in_link", NULL) == UTIL_PATH_INSIDE);
    /* a sibling whose name starts with the root's name is still outside */
    CHECK(util_confine_path(root, "sibling_link", NULL) == UTIL_PATH_OUTSIDE);
    CHECK(util_confine_path("/", "etc", NULL) == UTIL_PATH_INSIDE);
    free(root);
}

static void test_reads(void)
{
    CHECK(read_case("labels.txt", 100, UTIL_READ_TEXT, "a\nb\n", 4) == NULL);
    CHECK(read_case("in_link", 100, UTIL_READ_TEXT, "a\nb\n", 4) == NULL);
    CHECK(read_case("empty", 100, UTIL_READ_TEXT, "", 0) == NULL);
    CHECK_ERROR(read_case("../secret", 100, 0, NULL, 0), NEREID_ERROR_UNSUPPORTED,
                "file 'x' is outside model directory");
    CHECK_ERROR(read_case("out_link", 100, 0, NULL, 0), NEREID_ERROR_UNSUPPORTED,
                "is outside model directory");
    CHECK_ERROR(read_case("zero_link", 100, 0, NULL, 0), NEREID_ERROR_UNSUPPORTED,
                "is outside model directory");
    CHECK_ERROR(read_case("fifo", 100, 0, NULL, 0), NEREID_ERROR_INVALID_ARG,
                "file 'x' is not a regular file");
    CHECK_ERROR(read_case("1", 100, 0, NULL, 0), NEREID_ERROR_INVALID_ARG, "is not a regular file");
    CHECK_ERROR(read_case("missing", 100, 0, NULL, 0), NEREID_ERROR_INVALID_ARG,
                "unable to open file 'x': No such file or directory");
    CHECK_ERROR(read_case("labels.txt", 3, UTIL_READ_TEXT, NULL, 0), NEREID_ERROR_INVALID_ARG,
                "file 'x' is 4 bytes, more than the limit of 3 bytes");
    CHECK(read_case("labels.txt", 3, UTIL_READ_PREFIX, "a\nb", 3) == NULL);
    CHECK(read_case("nul.bin", 100, 0, "a\0b", 3) == NULL);
    CHECK_ERROR(read_case("nul.bin", 100, UTIL_READ_TEXT, NULL, 0), NEREID_ERROR_INVALID_ARG,
                "file 'x' contains a NUL byte");
}

int main(void)
{
    make_repo_dir("util");
    write_file("secret", "TOPSECRET");
    write_file("m/labels.txt", "a\nb\n");
    write_file("m/empty", "");
    write_bytes("m/nul.bin", "a\0b", 3);
    write_file("m/1/.keep", "");
    write_file("m_sibling/x", "");
    char *p = in_repo("secret");
    symlink_in_repo(p, "m/out_link");
    free(p);
    symlink_in_repo("..", "m/dir_link");
    symlink_in_repo("labels.txt", "m/in_link");
    symlink_in_repo("../m_sibling/x", "m/sibling_link");
    symlink_in_repo("/dev/zero", "m/zero_link");
    p = in_repo("m/fifo");
    if (mkfifo(p, 0600) != 0) abort();
    free(p);

    test_paths();
    test_reads();

    char *cmd = xasprintf("rm -rf '%s'", repo);
    if (system(cmd) != 0) check_failed++;
    free(cmd);
    return check_summary();
}
