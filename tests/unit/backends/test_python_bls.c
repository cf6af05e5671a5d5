/*
 * This file contains unit tests of the python backend's BLS
 * (backends/python/python_bls.c, included here with the wire file it
 * uses): where bls_alloc places a call's outputs in the reply region
 * ("BLS results in place") and when it declines them.
 */
#include "../../../backends/python/python_api.c"
#include "../../../backends/python/python_bls.c"
#include "../../../backends/python/python_wire.c"

#include "check.h"

/* BLS results in place: where bls_alloc puts a call's outputs, and when
 * it declines them (the core's own memory; never released here). */
static void test_bls_alloc(void)
{
    int fds[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds) == 0);
    chan_t *c = chan_new(fds[0]);
    bls_call_t call = {.chan = c, .reply_slot = 3, .in_place = true};
    void *buf[4], *bu[4];
    /* small: declined, no region yet */
    CHECK(!bls_alloc(&call, "A", NEREID_TYPE_FP32, NULL, 0, 1024, &buf[0], &bu[0]));
    CHECK(!buf[0] && bu[0] == NEREID_ALLOC_DECLINED && !call.dst);
    /* large: a new region of the call's own, not yet the slot's */
    CHECK(!bls_alloc(&call, "B", NEREID_TYPE_FP32, NULL, 0, 256 << 10, &buf[1], &bu[1]));
    region_t *r = call.dst;
    CHECK(r && bu[1] == r && buf[1] == r->map && call.dst_new && !c->bls_tx[3]);
    CHECK(r->size >= 2 * (256u << 10) + BLS_DESC_ROOM && c->bls_new_bytes == r->size);
    CHECK(atomic_load(&r->refs) == 2); /* the call's and the buffer's */
    /* the next one after it, aligned; BYTES never in the region */
    CHECK(!bls_alloc(&call, "C", NEREID_TYPE_FP32, NULL, 0, 100001, &buf[2], &bu[2]));
    CHECK(buf[2] == r->map + (256 << 10) && bu[2] == r);
    CHECK(!bls_alloc(&call, "D", NEREID_TYPE_BYTES, NULL, 0, 100000, &buf[3], &bu[3]));
    CHECK(!buf[3] && bu[3] == NEREID_ALLOC_DECLINED);
    /* no room left: declined */
    CHECK(!bls_alloc(&call, "E", NEREID_TYPE_FP32, NULL, 0, r->size, &buf[3], &bu[3]));
    CHECK(!buf[3] && bu[3] == NEREID_ALLOC_DECLINED);
    /* after the first response: declined */
    call.dst_closed = true;
    CHECK(!bls_alloc(&call, "F", NEREID_TYPE_FP32, NULL, 0, 1 << 16, &buf[3], &bu[3]));
    CHECK(!buf[3] && bu[3] == NEREID_ALLOC_DECLINED);
    for (int i = 1; i < 3; i++)
        bls_release(NULL, buf[i], bu[i], 0);
    CHECK(atomic_load(&r->refs) == 1);
    /* The slot's region, free and large enough, is used as it is. */
    c->bls_tx[3] = r;
    c->bls_tx_bytes = r->size;
    c->bls_new_bytes = 0;
    bls_call_t again = {.chan = c, .reply_slot = 3, .in_place = true};
    CHECK(!bls_alloc(&again, "B", NEREID_TYPE_FP32, NULL, 0, 300000, &buf[0], &bu[0]));
    CHECK(again.dst == r && !again.dst_new && buf[0] == r->map && atomic_load(&r->refs) == 3);
    /* ... but not while a response holds it: a new one */
    bls_call_t held = {.chan = c, .reply_slot = 3, .in_place = true};
    CHECK(!bls_alloc(&held, "B", NEREID_TYPE_FP32, NULL, 0, 300000, &buf[1], &bu[1]));
    CHECK(held.dst && held.dst != r && held.dst_new);
    bls_release(NULL, buf[1], bu[1], 0);
    region_unref(held.dst);
    c->bls_new_bytes = 0;
    /* past the budget: declined */
    c->bls_tx_bytes = BLS_BUDGET;
    bls_call_t over = {.chan = c, .reply_slot = 5, .in_place = true};
    CHECK(!bls_alloc(&over, "B", NEREID_TYPE_FP32, NULL, 0, 300000, &buf[1], &bu[1]));
    CHECK(!buf[1] && bu[1] == NEREID_ALLOC_DECLINED && !over.dst && c->bls_new_bytes == 0);
    c->bls_tx_bytes = r->size;
    bls_release(NULL, buf[0], bu[0], 0);
    region_unref(again.dst);
    chan_unref(c);
    close(fds[1]);
}

int main(void)
{
    test_bls_alloc();
    return check_summary();
}
