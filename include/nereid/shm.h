/*
 * This file contains Nereid's system shared memory API (Triton's shared
 * memory extension): a registry of POSIX shared memory regions that clients
 * register by name, and the per-request use of those regions for input and
 * output tensors. The HTTP and gRPC frontends share one registry, created by
 * the program that starts them.
 *
 * Lifetime: a region stays mapped while any request uses it. Unregistering
 * a region in use (Triton's rule) only marks it: it stays listed and usable
 * until the last request using it completes, which then unregisters it.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef NEREID_SHM_H
#define NEREID_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nereid/server.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nereid_shm_registry nereid_shm_registry_t;

/* Triton's text when client shared memory is off (--allow-client-shm=false). */
#define NEREID_SHM_DISABLED_TEXT                                                                   \
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to "        \
    "enable."

/* A new, empty registry. allow_client_shm is Triton's --allow-client-shm:
 * when false, register and unregister fail (UNSUPPORTED, NEREID_SHM_DISABLED_TEXT).
 * Caller frees with nereid_shm_registry_free once no frontend uses it. */
NEREID_EXPORT nereid_shm_registry_t *nereid_shm_registry_new(bool allow_client_shm);
/* Unmaps every region and frees reg; NULL is fine. */
NEREID_EXPORT void nereid_shm_registry_free(nereid_shm_registry_t *reg);
/* --allow-client-shm; false for NULL. */
NEREID_EXPORT bool nereid_shm_allowed(const nereid_shm_registry_t *reg);

/* Registers byte_size bytes at offset of the POSIX shared memory object key
 * (opened read/write with shm_open, so only names under /dev/shm: one name,
 * leading slashes allowed) as region name, with Triton's checks and texts:
 * a reserved or empty key (INVALID_ARG), a name already registered
 * (ALREADY_EXISTS), an object that cannot be opened (INTERNAL), a range past
 * the object's end (INVALID_ARG "... invalid args"). name and key are
 * copied. */
NEREID_EXPORT nereid_error_t *nereid_shm_register(nereid_shm_registry_t *reg, const char *name,
                                                  const char *key, uint64_t offset,
                                                  uint64_t byte_size);
/* Unregisters region name, or every region when name is NULL or "". An
 * unknown name is no error (Triton). A region in use is unregistered when
 * its last request completes. */
NEREID_EXPORT nereid_error_t *nereid_shm_unregister(nereid_shm_registry_t *reg, const char *name);
/* Triton's status document: [{"name","key","offset","byte_size"},...] sorted
 * by name, of every region (name NULL or "") or of one (NOT_FOUND "Unable to
 * find system shared memory region: '<name>'"). *json_out is NUL-terminated;
 * caller frees with free(). */
NEREID_EXPORT nereid_error_t *nereid_shm_status(nereid_shm_registry_t *reg, const char *name,
                                                char **json_out);

/* ---- Use by one request --------------------------------------------------- */

/* The regions one request uses and its outputs that go to shared memory.
 * Starts as NULL (no shared memory: nothing to do, nothing to free). */
typedef struct nereid_shm_use nereid_shm_use_t;

/* Resolves an input tensor of byte_size bytes at offset of region (Triton's
 * checks and texts: NOT_FOUND for an unknown region, INVALID_ARG for an
 * offset or size out of the region) and holds the region for the request.
 * *data points into the mapped region (a view, no copy), or to an aligned
 * copy owned by *use when the address is not aligned for datatype. */
NEREID_EXPORT nereid_error_t *nereid_shm_use_input(nereid_shm_use_t **use,
                                                   nereid_shm_registry_t *reg, const char *region,
                                                   uint64_t offset, uint64_t byte_size,
                                                   nereid_datatype_t datatype, const void **data);
/* Resolves the shared memory target of requested output output_name (copied)
 * with the same checks, and holds the region for the request. */
NEREID_EXPORT nereid_error_t *nereid_shm_use_output(nereid_shm_use_t **use,
                                                    nereid_shm_registry_t *reg,
                                                    const char *output_name, const char *region,
                                                    uint64_t offset, uint64_t byte_size);
/* True when use has a shared memory target for output_name. */
NEREID_EXPORT bool nereid_shm_use_has_output(const nereid_shm_use_t *use, const char *output_name);
/* For a response allocator: when output_name goes to shared memory, sets
 * *buffer to where the backend writes byte_size bytes of datatype (the
 * region itself, or an aligned bounce buffer copied into it by
 * nereid_shm_use_finish) and returns true; a target smaller than byte_size
 * sets *err (INTERNAL, Triton's text). False (nothing set) for other
 * outputs. Distinct outputs may be allocated from different threads. */
NEREID_EXPORT bool nereid_shm_use_alloc(nereid_shm_use_t *use, const char *output_name,
                                        nereid_datatype_t datatype, size_t byte_size, void **buffer,
                                        nereid_error_t **err);
/* The request completed: copies bounce buffers into their regions and
 * releases the regions (so a region unregistered meanwhile goes now).
 * Further calls do nothing; NULL is fine. */
NEREID_EXPORT void nereid_shm_use_finish(nereid_shm_use_t *use);
/* Finishes use if needed (without copying outputs) and frees it; NULL is
 * fine. */
NEREID_EXPORT void nereid_shm_use_free(nereid_shm_use_t *use);

#ifdef __cplusplus
}
#endif
#endif
