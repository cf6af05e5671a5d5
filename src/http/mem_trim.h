/*
 * This file contains the HTTP frontend's memory trimmer. The frontend keeps
 * large request and reply buffers in the heap (a raised glibc trim
 * threshold, see http_server_start), so after a burst of large tensors the
 * freed pages would stay with the process. The trimmer hands them back to
 * the system (malloc_trim) once no request has ended for a quiet period: a
 * steady stream never pays for it, a burst's memory returns about a second
 * after its last request, and an idle server's trimmer thread sleeps without
 * waking until the next request.
 */
#ifndef NEREID_MEM_TRIM_H
#define NEREID_MEM_TRIM_H

#include <stdint.h>

typedef struct mem_trim mem_trim_t;

/* Starts the trimmer thread; quiet_ns is the time without mem_trim_note
 * after which it trims. NULL when the thread cannot start (the functions
 * below accept NULL). */
mem_trim_t *mem_trim_start(uint64_t quiet_ns);
/* Records that a request ended (any thread; a load of a flag the trimmer
 * clears once a quiet period, a store and a signal when it sleeps). */
void mem_trim_note(mem_trim_t *t);
/* How many times the trimmer has trimmed (tests and logs). */
uint64_t mem_trim_count(mem_trim_t *t);
/* Stops the thread and frees the trimmer. */
void mem_trim_stop(mem_trim_t *t);
/* The process's one shared trimmer, for the frontends (HTTP and gRPC): the
 * first call starts it with quiet_ns, later ones take another reference.
 * NULL when it cannot start. Any thread. */
mem_trim_t *mem_trim_acquire(uint64_t quiet_ns);
/* Drops a reference from mem_trim_acquire; the last one stops the trimmer.
 * NULL is ignored. */
void mem_trim_release(mem_trim_t *t);

#endif
