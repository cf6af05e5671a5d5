/*
 * This file contains the python backend's shared state: the backend's
 * settings, the model's and each instance's state, and the functions the
 * backend's files call across each other. The wire format both sides
 * agree on is python_wire.h. Which file owns which part of instance_t is
 * written at its field groups (body_state_t and spin_state_t are theirs): the worker and its
 * channel (python_worker.c), the reading of its socket (python_reader.c), spin-wait
 * (python_spin.c), request bodies (python_body.c), BLS calls (python_bls.c), readiness
 * (python_services.c) and the execute in flight (python_execute.c).
 */
#ifndef NEREID_PYTHON_INTERNAL_H
#define NEREID_PYTHON_INTERNAL_H

#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

#include "nereid/backend.h"
#include "python_api.h"
#include "python_wire.h"

#define FINALIZE_WAIT_S 30
#define INLINE_MAX_US 1000     /* longest average execute run on the caller's thread */
#define VIEW_MIN (32 * 1024)   /* smallest output handed to the response as a region view */
#define BLS_BUDGET (64u << 20) /* the server's BLS_RESULT regions of one worker, at most */
#define BLS_IN_PLACE 1         /* called models write large BLS outputs into the reply region */
#define SPIN_WAIT_US_DEFAULT 0 /* opt-in: docs/python_backend.md */
#define SPIN_RECENT 8          /* the spin budget follows the median of this many executes */
#define SPIN_WAIT_US_MAX 10000
#define BODY_MIN (16 * 1024) /* a smaller body stays in the frontend's memory */
#define BODY_REGION_MIN (64 * 1024)
#define BODY_BUDGET (64u << 20) /* one model's body regions together, at most */

/* ---- Backend settings (python.c) ---- */

/* restart-worker: when a dead worker is replaced. Triton 25.x+ never
 * replaces one (the model stays not ready until it is loaded again);
 * Nereid by default does at once (eager), or when a request comes. A
 * worker the progress watchdog ended is always replaced at once. */
enum { RESTART_ON_REQUEST, RESTART_NEVER, RESTART_EAGER };

typedef struct backend_state {
    char *python; /* interpreter */
    char *stub;   /* nereid_python_stub.py */
    long finalize_wait_s;
    uint64_t spin_max_ns; /* spin-wait-us: longest spin for a worker's answer; 0: never */
    int restart;          /* restart-worker: RESTART_* (python_worker.c, "Restarts") */

    /* The zygote: a pre-started python3 (numpy and pb_utils imported) that
     * forks the workers of models using the backend's interpreter. */
    pthread_mutex_t zy_mu; /* guards what follows; held for one fork */
    bool zy_off;           /* disabled, or it failed before its first fork */
    bool zy_served;        /* the current zygote forked a worker */
    int zy_fd;             /* control socket, -1: not running */
    pid_t zy_pid;
} backend_state_t;

extern backend_state_t *g_backend; /* one python backend per process */

/* Logs a line through the server's log with the calling file's name and
 * line; level 'I', 'W', 'E' or 'V'. */
void plog_line(char level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define plog(level, ...) plog_line(level, __FILE__, __LINE__, __VA_ARGS__)

/* ---- Instances and their workers ---- */

typedef struct sender_slot {
    uint64_t id;
    nereid_response_sender_t *sender;
    struct sender_slot *next;
} sender_slot_t;

/* An instance's request bodies (python_body.c, "Request bodies"; execute's
 * thread only). */
typedef struct body_state {
    region_t *exec[BODY_SLOTS];  /* body regions the execute in flight references
                                    (a reference each), else NULL; written under the
                                    instance's mu (a BLS call of the execute may name them) */
    region_t *held[BODY_SLOTS];  /* body regions the worker says its arrays still
                                    view (a reference each), else NULL */
    uint64_t mapped[BODY_SLOTS]; /* id of the body region the current worker has
                                    mapped in each slot; 0: none */
    uint64_t inputs;             /* inputs sent by reference to a body region */
} body_state_t;

/* An instance's spin-wait (python_spin.c; execute's thread only, but the
 * word: the worker writes it). */
typedef struct spin_state {
    void *map;                       /* the page shared with the worker, or NULL */
    const _Atomic uint64_t *word;    /* in it: messages the worker has sent */
    _Atomic uint64_t *hint;          /* and: how long (µs) the worker may spin after
                                        the execute just sent (written before EXECUTE) */
    uint64_t hints;                  /* executes that let the worker spin after them */
    uint64_t recent_ns[SPIN_RECENT]; /* EXECUTE -> DONE of the last executes that spun */
    uint64_t n;                      /* executes that spun (so far) */
    uint64_t hits;                   /* ... and saw the answer while spinning */
    uint32_t misses_in_row;
    uint32_t contended_in_row; /* spins in a row that another thread interrupted */
    uint32_t skip;             /* executes left that do not spin (back-off) */
} spin_state_t;

typedef struct instance {
    char *name;
    nereid_model_t *model;
    nereid_server_t *server;
    bool decoupled;
    char *init_json; /* the INIT message, kept for restarts */

    /* The current worker (python_worker.c); replaced by the instance thread only. */
    pid_t pid;
    int pidfd; /* a worker forked by the zygote: signalled and watched here; -1 when
                  spawned (our child: kill and waitpid) */
    chan_t *chan;
    int epfd;   /* the reader thread waits here: the socket (EPOLLONESHOT, see
                   "Arming the reader") and kickfd */
    int kickfd; /* eventfd: wakes the reader to look at `armed` again */
    pthread_t reader;
    bool reader_running;
    const char *python;            /* interpreter (borrowed from the model or backend) */
    region_t *tx;                  /* EXECUTE inputs (instance thread only) */
    region_t *tx_spare[TX_SPARES]; /* earlier EXECUTE regions, or NULL (instance thread only) */
    rx_regions_t rx;               /* the worker's DONE and BLS_CALL regions (whichever
                                      thread reads) */
    uint8_t *rbuf;                 /* receive buffer (RECV_MAX) of whichever thread reads */
    uint64_t msgs_in;              /* messages received from the worker (whichever thread reads) */
    uint64_t tx_made;     /* EXECUTE regions made (their memfd sent), instance thread only */
    body_state_t body;    /* request bodies (python_body.c; execute's thread only) */
    uint64_t tx_switches; /* executes whose region a reply still held (another one taken) */

    spin_state_t spin; /* spin-wait (python_spin.c; execute's thread only) */

    pthread_mutex_t life_mu; /* an execute, a restart or fini at a time: the worker is
                                replaced under it (python_worker.c, "Restarts") */
    pthread_mutex_t mu;      /* guards what follows */
    pthread_cond_t cv;
    /* The worker's state and the socket's reading (python_worker.c,
     * python_reader.c) */
    bool dead;            /* the worker is gone (reader thread ended) */
    char *death;          /* why, when it sent something invalid */
    char *pump_fail;      /* a readiness check reading the socket found it broken (why) */
    msg_t *early_done;    /* ... and received execute's DONE, kept for execute */
    msg_t *reply;         /* READY / DONE / FINALIZED for the instance thread */
    uint32_t expect;      /* the reply type the instance thread waits for; 0: none */
    bool exec_reading;    /* execute reads the socket itself (the reader is parked) */
    bool armed;           /* the socket's one-shot registration is armed */
    bool eager_arm;       /* the reader read a message since the last execute: re-arm at
                             the end of the next one */
    uint64_t exec_end_ns; /* when the last execute gave the socket back */
    unsigned lazy_checks; /* the reader's looks since it last armed (lazy_arm_wait_ms) */
    bool bg_in_recv;      /* the reader thread is receiving */
    bool reaped;          /* the worker was killed and waited for */
    bool aborted; /* ended by the core's progress watchdog (nereid_backend_instance_abort) */
    /* Restarts (python_worker.c, "Restarts"): a worker that dies is replaced
     * at once, on a thread of its own, under life_mu */
    bool restartable;    /* the instance is initialized: a death is restarted */
    bool restart_queued; /* a restart thread exists (fini waits for it) */
    bool restarting;     /* a restart runs: not ready */
    bool restart_failed; /* the last restart failed: not ready until one succeeds */
    bool closing;        /* fini began: no restart */
    /* The execute in flight and decoupled senders (python_execute.c) */
    sender_slot_t *senders;
    uint64_t next_sender;
    nereid_batch_t *batch; /* during execute, for cancellation checks */
    region_t *exec_rx;     /* the EXECUTE region of the execute in flight (a reference), or
                              NULL: what a BLS input by reference (where 1) may name */
    /* BLS calls (python_bls.c) and model control jobs (python_services.c) */
    size_t bls_inflight;
    struct bls_call *bls_calls; /* in flight, for M_BLS_CANCEL */
    /* BLS result outputs (any thread; logged at fini): written in place by
     * the called model ("BLS results in place"), or copied into the reply */
    _Atomic uint64_t bls_placed_n, bls_placed_bytes, bls_copied_n, bls_copied_bytes;
    _Atomic uint64_t bls_regions_made; /* BLS_RESULT regions sent to the worker */
    /* The model's is_ready() (python_services.c; Triton's user-defined readiness): one check
     * in flight at a time, later checks wait for its answer. */
    bool has_is_ready;
    bool rq_inflight;
    uint64_t rq_answers; /* answers received (a waiter sees its own arrive) */
    bool rq_ready;
    char *rq_error;              /* is_ready() raised or returned a non-bool */
    python_api_t *api;           /* the worker's metrics (python_api.c) */
    atomic_int *model_instances; /* how many the model has (model_state_t) */
} instance_t;

/* ---- Model (python.c) ---- */

typedef struct model_state {
    char *file;   /* <model dir>/<version>/model.py */
    char *python; /* EXECUTION_ENV_PATH's interpreter, or NULL: the backend's */
    /* The worker that ran auto_complete_config, kept for the first instance
     * (named after it) so a model starts one interpreter, not two. */
    pthread_mutex_t mu;
    instance_t *spare;
    atomic_int instances; /* initialized and not finalized */
    /* Request body regions ("Request bodies"): frontends take them, execute
     * finds its inputs in them. A slot's region is replaced only while
     * nobody but the pool holds it (refs == 1). */
    pthread_mutex_t body_mu;    /* guards what follows */
    region_t *body[BODY_SLOTS]; /* a reference each, or NULL */
    size_t body_bytes;          /* their sizes together (<= BODY_BUDGET) */
    atomic_bool body_any;       /* some region was made (else execute does not look) */
    uint64_t body_made;         /* regions made */
    uint64_t body_taken;        /* bodies received into a region */
    uint64_t body_missed;       /* bodies offered none (no free slot or room) */
} model_state_t;

/* The thread reading an instance's socket (python_reader.c). */
extern _Thread_local instance_t *tls_reading;
extern _Thread_local int tls_pump_depth;
extern _Thread_local bool tls_exec_reading;

extern atomic_int g_executing; /* python executes in flight in the process (python_spin.c) */

/* Starting, initializing and ending a worker process, and the zygote (python_worker.c). */
nereid_error_t *unhealthy(instance_t *in);
void worker_died(instance_t *in, const char *why);
void expect_reply(instance_t *in, uint32_t type);
msg_t *wait_reply(instance_t *in, uint32_t want, long timeout_s);
void worker_stop(instance_t *in);
void zygote_end(backend_state_t *st);
nereid_error_t *worker_start(instance_t *in, const char *init_json, msg_t **ready);
nereid_error_t *worker_init(instance_t *in, const char *init_json, msg_t **ready);
nereid_error_t *worker_restart(instance_t *in);
void worker_closing(instance_t *in);

/* Reading the worker's socket: the reader thread, execute's own reading, readiness checks that read
 * (python_reader.c). */
bool ready_pump(instance_t *in, uint64_t seen, const struct timespec *dl);
void reader_arm_locked(instance_t *in);
void reader_arm(instance_t *in);
void *reader_main(void *arg);
void exec_reading_begin(instance_t *in);
void exec_reading_end(instance_t *in);
msg_t *execute_read_done(instance_t *in, uint64_t spin_until_ns, bool *spun, bool *hit,
                         bool *contended);

/* The reader thread arms the socket's registration once no execute has run
 * for LAZY_ARM_NS (python_reader.c, "Arming the reader"). */
#define LAZY_ARM_NS (2 * 1000 * 1000)

/* While executes keep coming, the reader's look at the registration finds
 * the last one under LAZY_ARM_NS ago and sleeps again: at ~10k requests/s
 * every few dozen requests cost a thread wake-up (~10-17 µs of CPU on a
 * virtual machine). Each look that does not arm doubles the wait before the
 * next, up to LAZY_ARM_NS << LAZY_ARM_SHIFT_MAX (16 ms); arming starts
 * again from LAZY_ARM_NS. What a message sent between executes waits for
 * is unchanged while they keep coming (the next execute reads it) and at
 * most that longest wait after they stop. */
#define LAZY_ARM_SHIFT_MAX 3

/* How long (ms, ≥ 1) the reader sleeps before its next look, LAZY_ARM_NS
 * doubled per look since it last armed (*checks, counted here), less the
 * time since the last execute ended (idle_ns; 0 while one reads). */
static inline int lazy_arm_wait_ms(uint64_t idle_ns, unsigned *checks)
{
    unsigned shift = *checks < LAZY_ARM_SHIFT_MAX ? *checks : LAZY_ARM_SHIFT_MAX;
    uint64_t period = (uint64_t)LAZY_ARM_NS << shift;
    if (*checks < LAZY_ARM_SHIFT_MAX) (*checks)++;
    uint64_t left = period > idle_ns ? period - idle_ns : 0;
    int ms = (int)((left + 999999) / 1000000);
    return ms < 1 ? 1 : ms;
}

/* spin-wait: waiting for the worker's answer without sleeping (python_spin.c). */
uint64_t spin_budget_ns(instance_t *in, uint64_t now_ns, bool alone);
void spin_hint_set(instance_t *in, bool alone);
void spin_record(instance_t *in, uint64_t took_ns, bool hit, bool contended);
int spin_wait(const instance_t *in, uint64_t until_ns);
void spin_page_send(instance_t *in);
void spin_page_drop(instance_t *in);

/* pb_utils calls besides inference: logging, cancellation checks, model control, metrics,
 * is_ready() (python_services.c). */
void on_log(instance_t *in, msg_t *m);
void on_cancel_query(instance_t *in, msg_t *m);
void api_call(instance_t *in, msg_t **m);
bool on_ready_answer(instance_t *in, msg_t *m, char *why, size_t why_cap);

/* BLS: a worker's request into any model of the server (python_bls.c). */
bool bls_start(instance_t *in, msg_t *m, char *why, size_t why_cap);
bool bls_cancel(instance_t *in, msg_t *m, char *why, size_t why_cap);

/* Request bodies received into shared memory the workers map (python_body.c). */
region_t *body_ref(instance_t *in, model_state_t *ms, const tview_t *v);
void body_settle(instance_t *in, uint32_t held);
void body_forget(instance_t *in);

/* Execute: EXECUTE out, DONE and decoupled responses back (python_execute.c). */
bool on_response(instance_t *in, msg_t *m, char *why, size_t why_cap);

#endif
