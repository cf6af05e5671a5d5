/*
 * This file contains the system shared memory registry (include/nereid/shm.h):
 * regions registered by clients, each an mmap of part of a POSIX shared
 * memory object, and their use by requests. The workload assumed: a few
 * regions, registered once and used by many requests, so the registry is a
 * sorted list under one mutex, and a request holds a counted reference to
 * each region it uses. Texts and codes follow Triton's
 * shared_memory_manager.cc.
 *
 * A region's refs counts the registry (1 while listed) and every use. A
 * region is unmapped only when it leaves the list, which happens when it is
 * unregistered unused, or when the last use of a region marked for
 * unregistration is released; so an address handed to a request stays
 * mapped until the request releases it.
 */
#include "nereid/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Keys Triton reserves for the shared memory its Python backend creates. */
#define RESERVED_PREFIX "triton_python_backend_shm_region_"

typedef struct shm_region {
    struct shm_region *next; /* the registry's list, sorted by name */
    char *name, *key;
    uint64_t offset, byte_size; /* as registered: [offset, offset+byte_size) of the object */
    int fd;                     /* kept open to re-check the object's size on use */
    void *map;                  /* mmap of the page holding offset through the region's end */
    size_t map_len;
    char *base;    /* map + offset % page: the region's first byte */
    size_t refs;   /* 1 while listed + 1 per use; under the registry mutex */
    bool awaiting; /* unregistered while in use: goes when the last use does */
} shm_region_t;

struct nereid_shm_registry {
    pthread_mutex_t mu;
    bool allow;
    shm_region_t *head;
};

/* An output of one request that goes to shared memory. */
typedef struct shm_target {
    char *output_name;
    shm_region_t *region;
    char *addr;        /* in the region */
    size_t byte_size;  /* shared_memory_byte_size of the output */
    void *bounce;      /* aligned buffer the backend wrote, or NULL */
    size_t bounce_len; /* bytes written to bounce */
} shm_target_t;

struct nereid_shm_use {
    nereid_shm_registry_t *reg;
    shm_region_t **held; /* one reference per resolved tensor */
    size_t n_held, cap_held;
    void **copies; /* aligned copies of inputs */
    size_t n_copies;
    shm_target_t *targets;
    size_t n_targets;
    bool finished;
};

static nereid_error_t *oom(void)
{
    return nereid_error_new(NEREID_ERROR_INTERNAL, "out of memory");
}

/* ---- Registry ------------------------------------------------------------- */

nereid_shm_registry_t *nereid_shm_registry_new(bool allow_client_shm)
{
    nereid_shm_registry_t *reg = calloc(1, sizeof *reg);
    if (!reg) abort();
    pthread_mutex_init(&reg->mu, NULL);
    reg->allow = allow_client_shm;
    return reg;
}

static void region_destroy(shm_region_t *r)
{
    munmap(r->map, r->map_len);
    close(r->fd);
    free(r->name);
    free(r->key);
    free(r);
}

void nereid_shm_registry_free(nereid_shm_registry_t *reg)
{
    if (!reg) return;
    for (shm_region_t *r = reg->head, *next; r; r = next) {
        next = r->next;
        region_destroy(r);
    }
    pthread_mutex_destroy(&reg->mu);
    free(reg);
}

bool nereid_shm_allowed(const nereid_shm_registry_t *reg)
{
    return reg && reg->allow;
}

/* The link that points at region name (or where it would be inserted). */
static shm_region_t **region_slot(nereid_shm_registry_t *reg, const char *name)
{
    shm_region_t **p = &reg->head;
    while (*p && strcmp((*p)->name, name) < 0)
        p = &(*p)->next;
    return p;
}

static shm_region_t *region_find(nereid_shm_registry_t *reg, const char *name)
{
    shm_region_t *r = *region_slot(reg, name);
    return r && !strcmp(r->name, name) ? r : NULL;
}

/* Unlists and unmaps r if nothing uses it (Triton's UnregisterHelper), or
 * marks it to go with its last use. Called with reg->mu held. */
static void region_unregister_locked(nereid_shm_registry_t *reg, shm_region_t *r)
{
    if (r->refs > 1) {
        r->awaiting = true;
        return;
    }
    *region_slot(reg, r->name) = r->next;
    region_destroy(r);
}

/* Triton's ValidateSharedMemoryKey, then what shm_open itself refuses: after
 * the leading slashes, the key must be one file name in /dev/shm. */
static nereid_error_t *check_key(const char *name, const char *key)
{
    const char *k = key;
    while (*k == '/')
        k++;
    if (!*k)
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "cannot register shared memory region '%s' - invalid shm key '%s'",
                                name, key);
    if (!strncmp(k, RESERVED_PREFIX, strlen(RESERVED_PREFIX)))
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "cannot register shared memory region '%s' with key '%s' as the "
                                "key contains the reserved prefix '" RESERVED_PREFIX "'",
                                name, key);
    if (strchr(k, '/') || !strcmp(k, ".") || !strcmp(k, ".."))
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Unable to open shared memory region: '%s'",
                                key);
    return NULL;
}

/* Opens, checks and maps key for region name; on success *out is a new
 * region with refs 1. Called with reg->mu held (as Triton does). */
static nereid_error_t *region_open(const char *name, const char *key, uint64_t offset,
                                   uint64_t byte_size, shm_region_t **out)
{
    *out = NULL;
    int fd = shm_open(key, O_RDWR, S_IRUSR | S_IWUSR);
    if (fd < 0)
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Unable to open shared memory region: '%s'",
                                key);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
        close(fd);
        return nereid_error_new(NEREID_ERROR_INTERNAL, "Invalid shared memory region: '%s'", key);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (offset > size || byte_size > size - offset) {
        close(fd);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to register shared memory region '%s': invalid args", name);
    }
    /* mmap wants a page-aligned file offset: map from the page holding
     * offset (Triton maps at offset itself, so it refuses unaligned ones). */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t lead = offset % page;
    void *map = MAP_FAILED;
    int map_errno = EINVAL; /* Triton's mmap of 0 bytes fails with EINVAL */
    if (byte_size > 0 && byte_size + lead <= SIZE_MAX) {
        map = mmap(NULL, (size_t)(byte_size + lead), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   (off_t)(offset - lead));
        map_errno = errno;
    }
    if (map == MAP_FAILED) {
        close(fd);
        return nereid_error_new(NEREID_ERROR_INVALID_ARG,
                                "failed to register shared memory region '%s': unable to process "
                                "address space%s",
                                name, strerror(map_errno));
    }
    shm_region_t *r = calloc(1, sizeof *r);
    char *name_copy = strdup(name), *key_copy = strdup(key);
    if (!r || !name_copy || !key_copy) abort();
    r->name = name_copy;
    r->key = key_copy;
    r->offset = offset;
    r->byte_size = byte_size;
    r->fd = fd;
    r->map = map;
    r->map_len = (size_t)(byte_size + lead);
    r->base = (char *)map + lead;
    r->refs = 1;
    *out = r;
    return NULL;
}

nereid_error_t *nereid_shm_register(nereid_shm_registry_t *reg, const char *name, const char *key,
                                    uint64_t offset, uint64_t byte_size)
{
    if (!nereid_shm_allowed(reg))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
    nereid_error_t *err = check_key(name, key);
    if (err) return err;
    pthread_mutex_lock(&reg->mu);
    shm_region_t *r = NULL;
    if (region_find(reg, name))
        err = nereid_error_new(NEREID_ERROR_ALREADY_EXISTS,
                               "shared memory region '%s' already in manager", name);
    else
        err = region_open(name, key, offset, byte_size, &r);
    if (r) {
        shm_region_t **slot = region_slot(reg, name);
        r->next = *slot;
        *slot = r;
    }
    pthread_mutex_unlock(&reg->mu);
    return err;
}

nereid_error_t *nereid_shm_unregister(nereid_shm_registry_t *reg, const char *name)
{
    if (!nereid_shm_allowed(reg))
        return nereid_error_new(NEREID_ERROR_UNSUPPORTED, NEREID_SHM_DISABLED_TEXT);
    pthread_mutex_lock(&reg->mu);
    if (name && name[0]) {
        shm_region_t *r = region_find(reg, name);
        if (r) region_unregister_locked(reg, r);
    } else {
        for (shm_region_t *r = reg->head, *next; r; r = next) {
            next = r->next;
            region_unregister_locked(reg, r);
        }
    }
    pthread_mutex_unlock(&reg->mu);
    return NULL;
}

static json_t *region_json(const shm_region_t *r)
{
    return json_pack("{s:s,s:s,s:I,s:I}", "name", r->name, "key", r->key, "offset",
                     (json_int_t)r->offset, "byte_size", (json_int_t)r->byte_size);
}

nereid_error_t *nereid_shm_status(nereid_shm_registry_t *reg, const char *name, char **json_out)
{
    *json_out = NULL;
    json_t *arr = json_array();
    if (!arr) return oom();
    nereid_error_t *err = NULL;
    if (reg) pthread_mutex_lock(&reg->mu);
    if (name && name[0]) {
        shm_region_t *r = reg ? region_find(reg, name) : NULL;
        if (r)
            json_array_append_new(arr, region_json(r));
        else
            err = nereid_error_new(NEREID_ERROR_NOT_FOUND,
                                   "Unable to find system shared memory region: '%s'", name);
    } else {
        for (shm_region_t *r = reg ? reg->head : NULL; r; r = r->next)
            json_array_append_new(arr, region_json(r));
    }
    if (reg) pthread_mutex_unlock(&reg->mu);
    if (!err && !(*json_out = json_dumps(arr, JSON_COMPACT | JSON_PRESERVE_ORDER))) err = oom();
    json_decref(arr);
    return err;
}

/* ---- Use by one request ----------------------------------------------------- */

/* Triton's GetMemoryInfo: finds region and checks [offset, offset+byte_size)
 * against it; on success holds it (refs + 1) and sets *addr. */
static nereid_error_t *region_acquire(nereid_shm_registry_t *reg, const char *name, uint64_t offset,
                                      uint64_t byte_size, shm_region_t **out, char **addr)
{
    *out = NULL;
    if (reg) pthread_mutex_lock(&reg->mu);
    shm_region_t *r = reg ? region_find(reg, name) : NULL;
    nereid_error_t *err = NULL;
    struct stat st;
    if (!r)
        err = nereid_error_new(NEREID_ERROR_NOT_FOUND, "Unable to find shared memory region: '%s'",
                               name);
    else if (offset >= r->byte_size)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Invalid offset for shared memory region: '%s'", name);
    else if (byte_size > SIZE_MAX - offset)
        err =
            nereid_error_new(NEREID_ERROR_INVALID_ARG,
                             "Integer overflow detected: byte_size (%" PRIu64 ") + offset (%" PRIu64
                             ") exceeds maximum value (%zu) for region '%s'",
                             byte_size, offset, (size_t)SIZE_MAX, name);
    else if (offset + byte_size > r->byte_size)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "Invalid offset + byte size for shared memory region: '%s'", name);
    /* A client that shrank the object would make touching the mapping fault
     * (SIGBUS); refuse instead of crashing. */
    else if (fstat(r->fd, &st) != 0 || (uint64_t)st.st_size < r->offset + r->byte_size)
        err = nereid_error_new(NEREID_ERROR_INVALID_ARG,
                               "shared memory region '%s' is smaller than when it was registered",
                               name);
    if (!err) {
        r->refs++;
        *out = r;
        *addr = r->base + offset;
    }
    if (reg) pthread_mutex_unlock(&reg->mu);
    return err;
}

static void region_release(nereid_shm_registry_t *reg, shm_region_t *r)
{
    pthread_mutex_lock(&reg->mu);
    if (--r->refs == 1 && r->awaiting) region_unregister_locked(reg, r);
    pthread_mutex_unlock(&reg->mu);
}

static nereid_error_t *use_hold(nereid_shm_use_t **usep, nereid_shm_registry_t *reg,
                                const char *region, uint64_t offset, uint64_t byte_size,
                                char **addr)
{
    nereid_shm_use_t *use = *usep;
    if (!use) {
        if (!(use = calloc(1, sizeof *use))) return oom();
        use->reg = reg;
        *usep = use;
    }
    if (use->n_held == use->cap_held) {
        size_t cap = use->cap_held ? 2 * use->cap_held : 4;
        shm_region_t **held = realloc(use->held, cap * sizeof *held);
        if (!held) return oom();
        use->held = held;
        use->cap_held = cap;
    }
    shm_region_t *r;
    nereid_error_t *err = region_acquire(reg, region, offset, byte_size, &r, addr);
    if (err) return err;
    use->held[use->n_held++] = r;
    return NULL;
}

nereid_error_t *nereid_shm_use_input(nereid_shm_use_t **use, nereid_shm_registry_t *reg,
                                     const char *region, uint64_t offset, uint64_t byte_size,
                                     nereid_datatype_t datatype, const void **data)
{
    char *addr;
    *data = NULL;
    nereid_error_t *err = use_hold(use, reg, region, offset, byte_size, &addr);
    if (err) return err;
    /* Backends read typed elements in place: copy a misaligned tensor. */
    size_t align = nereid_datatype_byte_size(datatype);
    if (align > 1 && (uintptr_t)addr % align) {
        void **copies = realloc((*use)->copies, ((*use)->n_copies + 1) * sizeof *copies);
        void *copy = malloc(byte_size ? (size_t)byte_size : 1);
        if (!copies || !copy) {
            free(copy);
            if (copies) (*use)->copies = copies;
            return oom();
        }
        memcpy(copy, addr, (size_t)byte_size);
        copies[(*use)->n_copies++] = copy;
        (*use)->copies = copies;
        addr = copy;
    }
    *data = addr;
    return NULL;
}

nereid_error_t *nereid_shm_use_output(nereid_shm_use_t **use, nereid_shm_registry_t *reg,
                                      const char *output_name, const char *region, uint64_t offset,
                                      uint64_t byte_size)
{
    char *addr;
    nereid_error_t *err = use_hold(use, reg, region, offset, byte_size, &addr);
    if (err) return err;
    nereid_shm_use_t *u = *use;
    shm_target_t *targets = realloc(u->targets, (u->n_targets + 1) * sizeof *targets);
    char *name = strdup(output_name);
    if (!targets || !name) {
        free(name);
        if (targets) u->targets = targets;
        return oom();
    }
    u->targets = targets;
    targets[u->n_targets++] = (shm_target_t){.output_name = name,
                                             .region = u->held[u->n_held - 1],
                                             .addr = addr,
                                             .byte_size = (size_t)byte_size};
    return NULL;
}

static shm_target_t *find_target(const nereid_shm_use_t *use, const char *output_name)
{
    for (size_t i = 0; use && i < use->n_targets; i++)
        if (!strcmp(use->targets[i].output_name, output_name)) return &use->targets[i];
    return NULL;
}

bool nereid_shm_use_has_output(const nereid_shm_use_t *use, const char *output_name)
{
    return find_target(use, output_name) != NULL;
}

bool nereid_shm_use_alloc(nereid_shm_use_t *use, const char *output_name,
                          nereid_datatype_t datatype, size_t byte_size, void **buffer,
                          nereid_error_t **err)
{
    *err = NULL;
    shm_target_t *t = find_target(use, output_name);
    if (!t) return false;
    *buffer = NULL;
    if (byte_size > t->byte_size) {
        *err = nereid_error_new(NEREID_ERROR_INTERNAL,
                                "shared memory size specified with the request for output '%s' "
                                "(%zu bytes) should be at least %zu bytes to hold the results",
                                output_name, t->byte_size, byte_size);
        return true;
    }
    size_t align = nereid_datatype_byte_size(datatype);
    if (align > 1 && (uintptr_t)t->addr % align) {
        free(t->bounce);
        t->bounce = malloc(byte_size ? byte_size : 1);
        if (!t->bounce) {
            *err = oom();
            return true;
        }
        t->bounce_len = byte_size;
        *buffer = t->bounce;
        return true;
    }
    *buffer = t->addr;
    return true;
}

static void use_release(nereid_shm_use_t *use)
{
    if (use->finished) return;
    use->finished = true;
    for (size_t i = 0; i < use->n_held; i++)
        region_release(use->reg, use->held[i]);
}

void nereid_shm_use_finish(nereid_shm_use_t *use)
{
    if (!use || use->finished) return;
    for (size_t i = 0; i < use->n_targets; i++) {
        shm_target_t *t = &use->targets[i];
        if (t->bounce) memcpy(t->addr, t->bounce, t->bounce_len);
    }
    use_release(use);
}

void nereid_shm_use_free(nereid_shm_use_t *use)
{
    if (!use) return;
    use_release(use);
    for (size_t i = 0; i < use->n_copies; i++)
        free(use->copies[i]);
    for (size_t i = 0; i < use->n_targets; i++) {
        free(use->targets[i].output_name);
        free(use->targets[i].bounce);
    }
    free(use->copies);
    free(use->targets);
    free(use->held);
    free(use);
}
