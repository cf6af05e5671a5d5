/*
 * This file contains the tests of nereid_request_sequence_headers, the
 * sequence id and flags taken from request headers (README "Running at
 * scale"): numeric and string ids, the agreement rules with the body's
 * parameters, flag values and the echoed id. Which flags reached the
 * sequence batcher is covered by tests/integration/test_scale_headers.py.
 */
#include <string.h>

#include "check.h"
#include "test_util.h"

static const char *const names[3] = {"Nereid-Sequence-Id", "Nereid-Sequence-Start",
                                     "Nereid-Sequence-End"};
static nereid_server_t *server;

static nereid_request_t *req(void)
{
    nereid_request_t *r = NULL;
    nereid_error_t *err = nereid_request_new(server, "any", -1, &r);
    CHECK(err == NULL);
    return r;
}

/* Applies the headers to a fresh request and returns the echo ("ERR" on error). */
static const char *apply(const char *body_id, const char *id, const char *start, const char *end,
                         nereid_error_t **err_out)
{
    static char echo[132];
    nereid_request_t *r = req();
    if (body_id && body_id[0] >= '0' && body_id[0] <= '9')
        nereid_request_set_correlation_id(r, strtoull(body_id, NULL, 10));
    else if (body_id)
        nereid_request_set_correlation_id_string(r, body_id);
    nereid_error_t *err =
        nereid_request_sequence_headers(r, names, id, start, end, echo, sizeof echo);
    nereid_request_free(r);
    if (err_out)
        *err_out = err;
    else
        nereid_error_free(err);
    return err ? "ERR" : echo;
}

int main(void)
{
    make_repo_dir("seqhdr");
    nereid_error_t *err = NULL;
    server = start_server(NEREID_MODEL_CONTROL_NONE, NULL, 0, 0, true, &err);
    CHECK(server != NULL && err == NULL);

    /* header only: digits are numeric, anything else a string id */
    CHECK_STR(apply(NULL, "42", NULL, NULL, NULL), "42");
    CHECK_STR(apply(NULL, "user-7", NULL, NULL, NULL), "user-7");
    CHECK_STR(apply(NULL, "18446744073709551616", NULL, NULL, NULL), "18446744073709551616");
    CHECK_STR(apply(NULL, "0", NULL, NULL, NULL), ""); /* 0 = no sequence, as in Triton */
    CHECK_STR(apply(NULL, NULL, NULL, NULL, NULL), "");
    apply(NULL, "", NULL, NULL, &err);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG, "header 'Nereid-Sequence-Id' is empty");
    char long_id[140];
    memset(long_id, 'x', 129);
    long_id[129] = '\0';
    apply(NULL, long_id, NULL, NULL, &err);
    CHECK_ERROR(err, NEREID_ERROR_UNSUPPORTED, "cannot be longer than 128 characters");

    /* body only: echoed */
    CHECK_STR(apply("9", NULL, NULL, NULL, NULL), "9");
    CHECK_STR(apply("s9", NULL, NULL, NULL, NULL), "s9");

    /* both: the same text */
    CHECK_STR(apply("5", "5", NULL, NULL, NULL), "5");
    CHECK_STR(apply("s1", "s1", NULL, NULL, NULL), "s1");
    apply("5", "05", NULL, NULL, &err);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG,
                "header 'Nereid-Sequence-Id' ('05') does not agree with the 'sequence_id' "
                "parameter ('5')");
    apply("s1", "s2", NULL, NULL, &err);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG, "('s2') does not agree");

    /* flags */
    CHECK_STR(apply(NULL, "3", "TRUE", "0", NULL), "3");
    apply(NULL, "3", "yes", NULL, &err);
    CHECK_ERROR(err, NEREID_ERROR_INVALID_ARG,
                "invalid value 'yes' for header 'Nereid-Sequence-Start', expected 'true' or "
                "'false'");
    nereid_request_t *r = req();
    nereid_request_set_correlation_id(r, 3);
    nereid_request_set_sequence_flags(r, false, true);
    CHECK_ERROR(nereid_request_sequence_headers(r, names, NULL, "true", "false", NULL, 0),
                NEREID_ERROR_INVALID_ARG,
                "header 'Nereid-Sequence-End' (false) does not agree with the 'sequence_end' "
                "parameter (true)");
    CHECK(nereid_request_sequence_headers(r, names, NULL, "1", "true", NULL, 0) == NULL);
    nereid_request_free(r);

    nereid_server_free(server);
    remove_repo();
    return check_summary();
}
