/*
 * This file contains unit tests of tracing's parsers: W3C traceparent
 * values (src/core/otlp.c) and Triton's --trace-config flags with their
 * error texts (nereid_tracer_new, src/core/trace.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/otlp.h"
#include "nereid/server.h"

static void test_traceparent(void)
{
    uint8_t t[16], s[8];
    CHECK(otel_parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", t, s));
    CHECK(t[0] == 0x0a && t[15] == 0x9c && s[0] == 0xb7 && s[7] == 0x31);
    CHECK(
        otel_parse_traceparent(" 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00 ", t, s));
    /* A later version may append fields. */
    CHECK(otel_parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-xyz", t,
                                 s));
    static const char *const bad[] = {
        NULL,
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",      /* no flags */
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",   /* zero trace id */
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",   /* zero span id */
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",   /* version ff */
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",   /* upper case */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x", /* v00 with more */
        "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!otel_parse_traceparent(bad[i], t, s), "%s", bad[i] ? bad[i] : "(null)");
}

static nereid_error_t *tracer(size_t n, const char *const *names, const char *const *values)
{
    nereid_tracer_t *t = NULL;
    nereid_error_t *err = nereid_tracer_new(names, values, n, &t);
    CHECK((err == NULL) == (t != NULL));
    nereid_tracer_free(t);
    return err;
}

#define ONE(name, value) tracer(1, (const char *[]){name}, (const char *[]){value})

static void test_config(void)
{
    CHECK(ONE("trace-config", "rate=5") == NULL);
    CHECK(ONE("trace-config", "triton,file=/tmp/x") == NULL);
    CHECK(ONE("trace-config", "TRITON,log-frequency=3") == NULL); /* mode case-insensitive */
    CHECK(ONE("trace-config", "level=max") == NULL);
    CHECK(ONE("trace-config", "level=Timestamps") == NULL);
    CHECK(ONE("trace-config", "unknown=1") == NULL);  /* Triton ignores unknown settings */
    CHECK(ONE("trace-config", "rate=12abc") == NULL); /* std::stoi takes the digits */
    CHECK(ONE("trace-level", "OFF") == NULL);
    CHECK_ERROR(ONE("trace-config", "rate=abc"), NEREID_ERROR_INVALID_ARG,
                "Bad option: \"--trace-config rate\".\nInvalid option value. Got abc");
    CHECK_ERROR(ONE("trace-config", "count=99999999999"), NEREID_ERROR_INVALID_ARG,
                "Provided option value is out of bound. Got 99999999999");
    CHECK_ERROR(ONE("trace-config", "mode=zipkin"), NEREID_ERROR_INVALID_ARG,
                "invalid value for trace mode option: zipkin");
    CHECK_ERROR(ONE("trace-config", "rate"), NEREID_ERROR_INVALID_ARG,
                "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate");
    CHECK_ERROR(ONE("trace-config", "rate="), NEREID_ERROR_INVALID_ARG, "Got rate=");
    CHECK_ERROR(ONE("trace-config", "triton,=1"), NEREID_ERROR_INVALID_ARG, "Got triton,=1");
    CHECK_ERROR(ONE("trace-config", ",rate=1"), NEREID_ERROR_INVALID_ARG,
                "No trace mode specified.");
    CHECK_ERROR(ONE("trace-level", "verbose"), NEREID_ERROR_INVALID_ARG,
                "Bad option: \"--trace-level\".\ninvalid value for trace level option: verbose");
    CHECK_ERROR(ONE("trace-count", "x"), NEREID_ERROR_INVALID_ARG,
                "Bad option: \"--trace-count\".");
    /* The mode's settings are checked only for the mode in use. */
    CHECK(ONE("trace-config", "opentelemetry,bsp_max_queue_size=x") == NULL);
    const char *names[2] = {"trace-config", "trace-config"};
    const char *otel[2] = {"mode=opentelemetry", "opentelemetry,bsp_max_queue_size=x"};
    CHECK_ERROR(tracer(2, names, otel), NEREID_ERROR_INVALID_ARG,
                "Bad option: \"--trace-config opentelemetry,bsp_max_queue_size\".");
    setenv("OTEL_BSP_SCHEDULE_DELAY", "later", 1);
    CHECK_ERROR(ONE("trace-config", "mode=opentelemetry"), NEREID_ERROR_INVALID_ARG,
                "Bad option: \"OTEL_BSP_SCHEDULE_DELAY\".\nInvalid option value. Got later");
    unsetenv("OTEL_BSP_SCHEDULE_DELAY");
    CHECK(ONE("trace-config", "mode=opentelemetry") == NULL);
}

int main(void)
{
    test_traceparent();
    test_config();
    return check_summary();
}
