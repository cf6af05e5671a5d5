/*
 * This file contains the HTTP frontend's lingering close, as nginx's
 * lingering_close: a connection refused while its client is still sending
 * a body (over --http-max-input-size, bad framing) gets its error reply,
 * its write side shut (FIN after the reply), and then what the client still
 * sends is read and thrown away for a bounded time and byte count before
 * the socket is closed. Closing at once with unread bytes would reset the
 * connection, and a client that sends its whole body before it reads (the
 * Python clients, curl without Expect) would see a broken pipe instead of
 * the reply. The discarded bytes are never copied (recv with MSG_TRUNC);
 * one thread serves every lingering socket.
 */
#ifndef NEREID_LINGER_H
#define NEREID_LINGER_H

/* Bounds of one lingering socket: closed once the peer closes, or
 * LINGER_MAX_BYTES are discarded, or nothing arrives for LINGER_IDLE_MS,
 * or LINGER_TOTAL_MS have passed; at most LINGER_MAX_CONNS at once (one
 * more is closed at once). */
#define LINGER_MAX_BYTES (4ull << 30)
#define LINGER_IDLE_MS 2000
#define LINGER_TOTAL_MS 30000
#define LINGER_MAX_CONNS 64

typedef struct lingerer lingerer_t;

/* Starts the thread; NULL when epoll or the thread is unavailable (then
 * linger_add closes at once). */
lingerer_t *linger_start(void);
/* Stops the thread and closes every socket still lingering. */
void linger_stop(lingerer_t *l);
/* Takes fd (a connected socket whose reply is written and whose write side
 * is shut down) and closes it within the bounds above. Always takes it. */
void linger_add(lingerer_t *l, int fd);

#endif
