/* What the user sees, checked from the outside: this program runs itself as a child with
 * MRCACHE_LOG=trace and MRCACHE_STATS=json, then reads what the child's library wrote.
 *
 *   trace_stats sequence   a known call sequence: every trace line present, in order, with
 *                          exact fields; the JSON statistics parse and count those calls
 *   trace_stats overflow   a tiny trace ring and a burst of calls: records are dropped and
 *                          counted, and the program runs to completion unaffected
 * (Needs libmrcache.so preloaded: LD_PRELOAD is inherited by the child.)
 */
#include "lib/loopback.h"

#include <errno.h>
#include <regex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define LEN (1u << 20)

/* The child: the call sequence; prints the addresses the parent needs. */
static int child_sequence(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(buf, 1, LEN);
    struct ibv_mr *m1 = ibv_reg_mr(lb.pd, buf, LEN, ACCESS); /* miss */
    CHECK(ibv_dereg_mr(m1) == 0, "dereg");                   /* kept */
    struct ibv_mr *m2 = ibv_reg_mr(lb.pd, buf, LEN, ACCESS); /* hit: the same pointer */
    struct ibv_mr *m3 = ibv_reg_mr(lb.pd, buf, LEN, ACCESS); /* hit: a shadow */
    CHECK(m2 == m1 && m3 && m3 != m1, "hits");
    CHECK(ibv_dereg_mr(m3) == 0 && ibv_dereg_mr(m2) == 0, "dereg"); /* kept, kept */
    CHECK(munmap(buf, LEN) == 0, "munmap");                          /* invalidate */
    CHECK(ibv_dereg_mr(m2) == EINVAL, "double dereg");               /* double-dereg */
    printf("%lx %lx %lx %lx\n", (unsigned long)buf, (unsigned long)m1, (unsigned long)m3, (unsigned long)lb.pd);
    fflush(stdout);
    /* An idle entry whose memory stays mapped, so that ibv_dealloc_pd has one to flush
     * whenever the background drain runs (the staging buffer's entry goes with free()). */
    static char keep[8192];
    struct ibv_mr *mk = ibv_reg_mr(lb.pd, keep, sizeof keep, ACCESS);
    CHECK(mk && ibv_dereg_mr(mk) == 0, "idle entry");
    lb_close(&lb); /* ibv_dealloc_pd: flush */
    return 0;
}

static int child_overflow(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    char *buf = malloc(LEN);
    for (int i = 0; i < 20000; i++) {
        struct ibv_mr *m = ibv_reg_mr(lb.pd, buf, LEN, ACCESS);
        CHECK(m && ibv_dereg_mr(m) == 0, "reg/dereg %d", i);
    }
    struct ibv_mr *m = ibv_reg_mr(lb.pd, buf, LEN, ACCESS);
    CHECK(m && lb_prove_write(&lb, m, buf, LEN, 3) == 0, "the app is unaffected");
    CHECK(ibv_dereg_mr(m) == 0, "dereg");
    lb_close(&lb);
    return 0;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    CHECK(f, "open %s: %s", path, strerror(errno));
    static char data[1 << 22];
    size_t n = fread(data, 1, sizeof data - 1, f);
    data[n] = 0;
    fclose(f);
    return data;
}

/* Run ourselves with MODE under the given tracing environment; returns the child's stdout. */
static char *run_child(const char *self, const char *mode, const char *ring) {
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        setenv("MRCACHE_LOG", "trace", 1);
        setenv("MRCACHE_LOG_FILE", "trace.%p.log", 1);
        setenv("MRCACHE_STATS", "json", 1);
        setenv("MRCACHE_STATS_FILE", "stats.json", 1);
        if (ring)
            setenv("MRCACHE_TRACE_BUFFER", ring, 1);
        /* The exact pointers below (a hit returns the provider's own pointer, then a shadow)
         * are MRCACHE_REMOTE=keep's; under revoke every remote handle is a window's handle
         * (tests/c/guest/remote_revoke.c). */
        setenv("MRCACHE_REMOTE", "keep", 1);
        execl(self, self, mode, "child", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    static char out[4096];
    ssize_t n = read(fds[0], out, sizeof out - 1);
    out[n > 0 ? n : 0] = 0;
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed");
    static char name[64];
    snprintf(name, sizeof name, "trace.%d.log", pid);
    rename(name, "trace.log");
    return out;
}

/* Find each pattern in order, each on a later line than the previous. */
static void expect_lines(const char *text, const char **patterns, int n) {
    const char *at = text;
    for (int i = 0; i < n; i++) {
        regex_t re;
        CHECK(regcomp(&re, patterns[i], REG_EXTENDED | REG_NEWLINE) == 0, "regex %s", patterns[i]);
        regmatch_t m;
        if (regexec(&re, at, 1, &m, 0) != 0) {
            fprintf(stderr, "trace lacks (after the previous match): %s\n--- trace ---\n%s\n", patterns[i], text);
            exit(1);
        }
        at += m.rm_eo;
        regfree(&re);
    }
}

static void expect_json(const char *json, const char *field) {
    CHECK(strstr(json, field), "statistics lack %s: %s", field, json);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2, "usage: trace_stats sequence|overflow");
    if (argc == 3)
        return !strcmp(argv[1], "sequence") ? child_sequence() : child_overflow();
    CHECK(mrcache_loaded(), "needs libmrcache.so preloaded");
    unlink("stats.json");
    if (!strcmp(argv[1], "sequence")) {
        unsigned long buf, m1, m3, pd;
        char *out = run_child("/proc/self/exe", "sequence", NULL);
        CHECK(sscanf(out, "%lx %lx %lx %lx", &buf, &m1, &m3, &pd) == 4, "child output: %s", out);
        char p[9][256];
        const char *pre = "^mrcache\\[[0-9]+\\]: \\+[0-9]+\\.[0-9]{6}ms \\[[0-9]+\\] ";
        snprintf(p[0], 256, "%sibv_reg_mr\\(pd=0x%lx, addr=0x%lx, len=1048576, access=0x3\\) = 0x%lx miss [0-9]+ns$", pre, pd, buf, m1);
        snprintf(p[1], 256, "%sibv_dereg_mr\\(mr=0x%lx\\) = 0 kept [0-9]+ns$", pre, m1);
        snprintf(p[2], 256, "%sibv_reg_mr\\(pd=0x%lx, addr=0x%lx, len=1048576, access=0x3\\) = 0x%lx hit [0-9]+ns$", pre, pd, buf, m1);
        snprintf(p[3], 256, "%sibv_reg_mr\\(pd=0x%lx, addr=0x%lx, len=1048576, access=0x3\\) = 0x%lx hit [0-9]+ns$", pre, pd, buf, m3);
        snprintf(p[4], 256, "%sibv_dereg_mr\\(mr=0x%lx\\) = 0 kept [0-9]+ns$", pre, m3);
        snprintf(p[5], 256, "%sibv_dereg_mr\\(mr=0x%lx\\) = 0 kept [0-9]+ns$", pre, m1);
        snprintf(p[6], 256, "%smunmap\\(addr=0x%lx, len=1048576\\) = 0 invalidate [0-9]+ns$", pre, buf);
        snprintf(p[7], 256, "%sibv_dereg_mr\\(mr=0x%lx\\) = 22 double-dereg [0-9]+ns$", pre, m1);
        snprintf(p[8], 256, "%sibv_dealloc_pd\\(pd=0x%lx\\) = 0 flush [0-9]+ns$", pre, pd);
        const char *pats[9];
        for (int i = 0; i < 9; i++)
            pats[i] = p[i];
        expect_lines(slurp("trace.log"), pats, 9);
        char *json = slurp("stats.json");
        /* lb_open registers its staging buffer (a miss); then the sequence above, and the
         * idle entry kept for ibv_dealloc_pd (a third miss). */
        expect_json(json, "\"hits\":2,");
        expect_json(json, "\"misses\":3,");
        expect_json(json, "\"double_deregs\":1,");
        /* The munmap above; the staging buffer's free() in lb_close counts too when the
         * background drain gets to it before exit. */
        CHECK(strstr(json, "\"invalidated_entries\":1,") || strstr(json, "\"invalidated_entries\":2,"),
              "statistics: invalidated_entries is not 1 or 2: %s", json);
        /* Followed by another field or the end of the object, whichever the layout puts
         * after it. */
        CHECK(strstr(json, "\"trace_records_dropped\":0,") || strstr(json, "\"trace_records_dropped\":0}"),
              "statistics: trace_records_dropped is not 0: %s", json);
        expect_json(json, "\"munmap\":");
        printf("trace_stats sequence: 9 trace lines and the statistics match\n");
    } else {
        run_child("/proc/self/exe", "overflow", "16");
        char *log = slurp("trace.log");
        CHECK(strstr(log, "trace ring overflow: "), "no overflow reported");
        char *json = slurp("stats.json");
        CHECK(strstr(json, "\"trace_records_dropped\":") &&
                  !strstr(json, "\"trace_records_dropped\":0,") &&
                  !strstr(json, "\"trace_records_dropped\":0}"),
              "drops not counted: %s", json);
        printf("trace_stats overflow: %s", strstr(log, "trace ring overflow"));
    }
    return 0;
}
