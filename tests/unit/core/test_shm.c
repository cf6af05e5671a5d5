/*
 * This file contains unit tests of the system shared memory registry
 * (src/core/shm.c): the --allow-client-shm switch, key checks (Triton's, and
 * names outside /dev/shm), registration bounds, the status document, the
 * checks and texts of a tensor's place in a region, unaligned inputs and
 * outputs, a region unregistered while in use (it stays until its last use
 * goes), and an object shrunk behind the server's back.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "nereid/shm.h"

static char key[64];

/* A fresh POSIX shared memory object of size bytes, filled with byte i % 251. */
static void make_object(size_t size)
{
    snprintf(key, sizeof key, "/nereid_unit_shm_%d", (int)getpid());
    shm_unlink(key);
    int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) abort();
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) abort();
    for (size_t i = 0; i < size; i++)
        p[i] = (unsigned char)(i % 251);
    munmap(p, size);
    close(fd);
}

static char *status(nereid_shm_registry_t *reg, const char *name)
{
    char *json = NULL;
    nereid_error_t *err = nereid_shm_status(reg, name, &json);
    if (err) {
        nereid_error_free(err);
        return NULL;
    }
    return json;
}

static void test_disabled(void)
{
    nereid_shm_registry_t *reg = nereid_shm_registry_new(false);
    CHECK(!nereid_shm_allowed(reg) && !nereid_shm_allowed(NULL));
    CHECK_ERROR(nereid_shm_register(reg, "r", key, 0, 8), NEREID_ERROR_UNSUPPORTED,
                "Client shared memory is disabled. Start the server with "
                "'--allow-client-shm=true' to enable.");
    CHECK_ERROR(nereid_shm_unregister(reg, NULL), NEREID_ERROR_UNSUPPORTED, "disabled");
    char *s = status(reg, NULL);
    CHECK_STR(s, "[]");
    free(s);
    nereid_shm_use_t *use = NULL;
    const void *data;
    CHECK_ERROR(nereid_shm_use_input(&use, reg, "r", 0, 8, NEREID_TYPE_FP32, &data),
                NEREID_ERROR_NOT_FOUND, "Unable to find shared memory region: 'r'");
    nereid_shm_use_free(use);
    nereid_shm_registry_free(reg);
}

static void test_register(void)
{
    nereid_shm_registry_t *reg = nereid_shm_registry_new(true);
    CHECK_ERROR(nereid_shm_register(reg, "r", "", 0, 8), NEREID_ERROR_INVALID_ARG,
                "cannot register shared memory region 'r' - invalid shm key ''");
    CHECK_ERROR(nereid_shm_register(reg, "r", "//", 0, 8), NEREID_ERROR_INVALID_ARG,
                "invalid shm key '//'");
    CHECK_ERROR(nereid_shm_register(reg, "r", "/triton_python_backend_shm_region_1", 0, 8),
                NEREID_ERROR_INVALID_ARG, "contains the reserved prefix");
    const char *outside[] = {"/a/b", "/../x", "/..", "/.", "a/"};
    for (size_t i = 0; i < sizeof outside / sizeof *outside; i++)
        CHECK_ERROR(nereid_shm_register(reg, "r", outside[i], 0, 8), NEREID_ERROR_INTERNAL,
                    "Unable to open shared memory region");
    CHECK_ERROR(nereid_shm_register(reg, "r", key, 4096, 4097), NEREID_ERROR_INVALID_ARG,
                "failed to register shared memory region 'r': invalid args");
    CHECK_ERROR(nereid_shm_register(reg, "r", key, UINT64_MAX - 3, 8), NEREID_ERROR_INVALID_ARG,
                "invalid args");
    CHECK_ERROR(nereid_shm_register(reg, "r", key, 0, 0), NEREID_ERROR_INVALID_ARG,
                "unable to process address spaceInvalid argument");
    CHECK(nereid_shm_register(reg, "b", key + 1, 4096, 4096) == NULL); /* no leading slash */
    CHECK(nereid_shm_register(reg, "a", key, 5, 100) == NULL);
    CHECK_ERROR(nereid_shm_register(reg, "a", key, 0, 8), NEREID_ERROR_ALREADY_EXISTS,
                "shared memory region 'a' already in manager");
    char *s = status(reg, NULL);
    char want[512];
    snprintf(want, sizeof want,
             "[{\"name\":\"a\",\"key\":\"%s\",\"offset\":5,\"byte_size\":100},"
             "{\"name\":\"b\",\"key\":\"%s\",\"offset\":4096,\"byte_size\":4096}]",
             key, key + 1);
    CHECK_STR(s, want);
    free(s);
    CHECK(status(reg, "zz") == NULL);
    char *json = NULL;
    CHECK_ERROR(nereid_shm_status(reg, "zz", &json), NEREID_ERROR_NOT_FOUND,
                "Unable to find system shared memory region: 'zz'");
    CHECK(json == NULL);
    CHECK(nereid_shm_unregister(reg, "zz") == NULL);
    CHECK(nereid_shm_unregister(reg, "a") == NULL);
    s = status(reg, "b");
    CHECK_STR_CONTAINS(s, "\"name\":\"b\"");
    free(s);
    CHECK(nereid_shm_unregister(reg, "") == NULL);
    s = status(reg, NULL);
    CHECK_STR(s, "[]");
    free(s);
    nereid_shm_registry_free(reg);
}

static void test_use(void)
{
    nereid_shm_registry_t *reg = nereid_shm_registry_new(true);
    CHECK(nereid_shm_register(reg, "r", key, 4096, 64) == NULL);
    nereid_shm_use_t *use = NULL;
    const void *data = NULL;
    CHECK_ERROR(nereid_shm_use_input(&use, reg, "r", 64, 0, NEREID_TYPE_FP32, &data),
                NEREID_ERROR_INVALID_ARG, "Invalid offset for shared memory region: 'r'");
    CHECK_ERROR(nereid_shm_use_input(&use, reg, "r", 8, 57, NEREID_TYPE_FP32, &data),
                NEREID_ERROR_INVALID_ARG,
                "Invalid offset + byte size for shared memory region: 'r'");
    CHECK_ERROR(nereid_shm_use_input(&use, reg, "r", 32, UINT64_MAX - 31, NEREID_TYPE_FP32, &data),
                NEREID_ERROR_INVALID_ARG,
                "Integer overflow detected: byte_size (18446744073709551584) + offset (32) "
                "exceeds maximum value (18446744073709551615) for region 'r'");
    CHECK(data == NULL);
    /* aligned: a view of the region */
    CHECK(nereid_shm_use_input(&use, reg, "r", 8, 16, NEREID_TYPE_FP32, &data) == NULL);
    CHECK(data && ((const unsigned char *)data)[0] == (4096 + 8) % 251);
    /* unaligned for FP32: an aligned copy of the same bytes */
    CHECK(nereid_shm_use_input(&use, reg, "r", 3, 8, NEREID_TYPE_FP32, &data) == NULL);
    CHECK(data && (uintptr_t)data % 4 == 0 && ((const unsigned char *)data)[0] == (4096 + 3) % 251);
    CHECK(nereid_shm_use_output(&use, reg, "OUT", "r", 1, 8) == NULL);
    CHECK(nereid_shm_use_output(&use, reg, "OUT2", "r", 40, 8) == NULL);
    CHECK(nereid_shm_use_has_output(use, "OUT") && !nereid_shm_use_has_output(use, "X"));
    void *buf;
    nereid_error_t *err;
    CHECK(!nereid_shm_use_alloc(use, "X", NEREID_TYPE_FP32, 8, &buf, &err) && err == NULL);
    CHECK(nereid_shm_use_alloc(use, "OUT", NEREID_TYPE_FP32, 12, &buf, &err));
    CHECK_ERROR(err, NEREID_ERROR_INTERNAL,
                "shared memory size specified with the request for output 'OUT' (8 bytes) should "
                "be at least 12 bytes to hold the results");
    CHECK(nereid_shm_use_alloc(use, "OUT", NEREID_TYPE_FP32, 8, &buf, &err) && err == NULL);
    CHECK(buf && (uintptr_t)buf % 4 == 0);
    memcpy(buf, "ABCDEFGH", 8);
    CHECK(nereid_shm_use_alloc(use, "OUT2", NEREID_TYPE_FP32, 4, &buf, &err) && err == NULL);
    memcpy(buf, "WXYZ", 4);

    /* unregistered while in use: still listed and mapped */
    CHECK(nereid_shm_unregister(reg, NULL) == NULL);
    char *s = status(reg, "r");
    CHECK(s != NULL);
    free(s);
    CHECK_ERROR(nereid_shm_register(reg, "r", key, 0, 8), NEREID_ERROR_ALREADY_EXISTS, "");
    /* a second request may still use it (Triton) and holds it too */
    nereid_shm_use_t *use2 = NULL;
    CHECK(nereid_shm_use_input(&use2, reg, "r", 0, 4, NEREID_TYPE_UINT8, &data) == NULL);
    nereid_shm_use_finish(use); /* copies the unaligned output into place */
    nereid_shm_use_finish(use); /* once */
    s = status(reg, "r");
    CHECK(s != NULL);
    free(s);
    CHECK(((const unsigned char *)data)[0] == 4096 % 251); /* still mapped */
    nereid_shm_use_free(use);
    nereid_shm_use_free(use2); /* the last use: the region goes */
    CHECK(status(reg, "r") == NULL);

    int fd = shm_open(key, O_RDWR, 0);
    unsigned char *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(p != MAP_FAILED && memcmp(p + 4097, "ABCDEFGH", 8) == 0 &&
          memcmp(p + 4096 + 40, "WXYZ", 4) == 0);
    munmap(p, 8192);

    /* an object shrunk after registration is refused, not touched */
    CHECK(nereid_shm_register(reg, "r", key, 4096, 64) == NULL);
    CHECK(ftruncate(fd, 4096) == 0);
    use = NULL;
    CHECK_ERROR(nereid_shm_use_input(&use, reg, "r", 0, 8, NEREID_TYPE_UINT8, &data),
                NEREID_ERROR_INVALID_ARG, "smaller than when it was registered");
    nereid_shm_use_free(use);
    close(fd);
    nereid_shm_registry_free(reg); /* unmaps what is still registered */
}

int main(void)
{
    make_object(8192);
    test_disabled();
    test_register();
    test_use();
    shm_unlink(key);
    return check_summary();
}
