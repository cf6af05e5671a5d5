/*
 * This file contains what the benchmarks that start build/nereid as a child
 * process share: a free loopback port for it, and its CPU time from /proc.
 * Header-only (each bench is one executable).
 */
#ifndef NEREID_BENCH_PROC_H
#define NEREID_BENCH_PROC_H

#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

/* A loopback TCP port free right now, -1 when none could be had. */
static inline int bench_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, n) &&
        !getsockname(fd, (struct sockaddr *)&a, &n))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* CPU seconds (utime + stime) of pid (0: this process); 0 when unknown. */
static inline double bench_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid ? (int)pid : (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#endif
