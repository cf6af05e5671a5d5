/* ---- Instances and their workers ---- */

typedef struct sender_slot {
    uint64_t id;
    nereid_response_sender_t *sender;
    struct sender_slot *next;
} sender_slot_t;

typedef struct instance {
    char *name;
    nereid_model_t *model;
    nereid_server_t *server;
    bool decoupled;
    char *init_json; /* the INIT message, kept for restarts */

    /* The current worker; replaced by the instance thread only. */
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
    uint64_t tx_made; /* EXECUTE regions made (their memfd sent), instance thread only */
    /* Request bodies (see "Request bodies"; execute's thread only) */
    region_t *exec_body[BODY_SLOTS];  /* body regions the execute in flight references
                                         (a reference each), else NULL; written under mu
                                         (a BLS call of the execute may name them) */
    region_t *body_held[BODY_SLOTS];  /* body regions the worker says its arrays still
                                         view (a reference each), else NULL */
    uint64_t body_mapped[BODY_SLOTS]; /* id of the body region the current worker has
                                         mapped in each slot; 0: none */
    uint64_t body_inputs;             /* inputs sent by reference to a body region */
    uint64_t tx_switches; /* executes whose region a reply still held (another one taken) */

    /* spin-wait (execute's thread only, but the word: the worker writes it) */
    void *spin_map;                       /* the page shared with the worker, or NULL */
    const _Atomic uint64_t *spin_word;    /* in it: messages the worker has sent */
    _Atomic uint64_t *spin_hint;          /* and: how long (µs) the worker may spin after
                                             the execute just sent (written before EXECUTE) */
    uint64_t spin_hints;                  /* executes that let the worker spin after them */
    uint64_t spin_recent_ns[SPIN_RECENT]; /* EXECUTE -> DONE of the last executes that spun */
    uint64_t spin_n;                      /* executes that spun (so far) */
    uint64_t spin_hits;                   /* ... and saw the answer while spinning */
    uint32_t spin_misses_in_row;
    uint32_t spin_contended_in_row; /* spins in a row that another thread interrupted */
    uint32_t spin_skip;             /* executes left that do not spin (back-off) */

    pthread_mutex_t mu; /* guards what follows */
    pthread_cond_t cv;
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
    bool bg_in_recv;      /* the reader thread is receiving */
    bool reaped;          /* the worker was killed and waited for */
    sender_slot_t *senders;
    uint64_t next_sender;
    nereid_batch_t *batch; /* during execute, for cancellation checks */
    region_t *exec_rx;     /* the EXECUTE region of the execute in flight (a reference), or
                              NULL: what a BLS input by reference (where 1) may name */
    size_t bls_inflight;
    struct bls_call *bls_calls; /* in flight, for M_BLS_CANCEL */
    /* BLS result outputs (any thread; logged at fini): written in place by
     * the called model ("BLS results in place"), or copied into the reply */
    _Atomic uint64_t bls_placed_n, bls_placed_bytes, bls_copied_n, bls_copied_bytes;
    _Atomic uint64_t bls_regions_made; /* BLS_RESULT regions sent to the worker */
    /* The model's is_ready() (Triton's user-defined readiness): one check
     * in flight at a time, later checks wait for its answer. */
    bool has_is_ready;
    bool rq_inflight;
    uint64_t rq_answers; /* answers received (a waiter sees its own arrive) */
    bool rq_ready;
    char *rq_error;              /* is_ready() raised or returned a non-bool */
    python_api_t *api;           /* the worker's metrics (python_api.c) */
    atomic_int *model_instances; /* how many the model has (model_state_t) */
} instance_t;
