/*
 * This file contains the HTTP frontend's close watcher: libmicrohttpd does
 * not look at a suspended connection's socket, so a client that closes its
 * connection while its inference runs would go unnoticed. The watcher polls
 * the sockets of suspended inference connections (epoll, EPOLLRDHUP) on one
 * thread and cancels the inference's cancel token when the peer closes.
 */
#ifndef NEREID_CLOSE_WATCH_H
#define NEREID_CLOSE_WATCH_H

#include <stdint.h>

#include "nereid/server.h"

typedef struct close_watch close_watch_t;

/* Starts the watcher thread; NULL when epoll or the thread is unavailable
 * (then closes are not detected; the functions below accept NULL). */
close_watch_t *close_watch_start(void);
/* Stops the thread and frees the watcher (every watch removed first). */
void close_watch_stop(close_watch_t *w);
/* Watches fd until close_watch_remove; when the peer closes it (or the
 * socket fails), token is cancelled; the caller keeps token alive until
 * close_watch_remove. Returns the watch's id, 0 when not watched. */
uint64_t close_watch_add(close_watch_t *w, int fd, nereid_cancel_token_t *token);
/* Ends watch id (0: no-op), before the connection's fd can be closed. */
void close_watch_remove(close_watch_t *w, uint64_t id);

#endif
