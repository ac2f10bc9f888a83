/* What a process that never touches verbs pays for the preload at start-up: PROGRAM (default
 * /bin/true) started PAIRS times (default 300) without and with LD_PRELOAD=LIB, the two in
 * turn (the order swapped every pair, so a drift of the machine's speed falls on both), each
 * run timed from posix_spawn to its reaping (wall) and by the kernel's accounting of the
 * child (user + system CPU time, wait4). Prints the CPU model and the load average after the
 * runs, each side's medians and the medians of the pairs' differences, in microseconds.
 *   cc -O2 -o startup bench/startup.c && ./startup LIB [PAIRS] [PROGRAM ARGS...]
 * or bench/startup.sh [PAIRS] (builds it, and uses target/release/libmrcache.so). */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* environ without LD_PRELOAD, plus `preload` when given. */
static char **env_with(const char *preload) {
    size_t n = 0;
    while (environ[n]) n++;
    char **e = calloc(n + 2, sizeof *e);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11)) e[k++] = environ[i];
    if (preload) {
        char *v = malloc(strlen(preload) + 12);
        sprintf(v, "LD_PRELOAD=%s", preload);
        e[k++] = v;
    }
    e[k] = NULL;
    return e;
}

/* One run's wall time; its CPU time in *cpu. */
static double start_once(char **argv, char **env, double *cpu) {
    double t0 = now_us();
    pid_t pid;
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, env)) {
        perror(argv[0]);
        exit(2);
    }
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st)) {
        fprintf(stderr, "%s did not exit normally\n", argv[0]);
        exit(2);
    }
    double wall = now_us() - t0;
    *cpu = ru.ru_utime.tv_sec * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1e6 +
           ru.ru_stime.tv_usec;
    return wall;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void cpu_model(char *out, size_t len) {
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (colon && (!strncmp(line, "model name", 10) || !strncmp(line, "CPU part", 8))) {
            snprintf(out, len, "%s", colon + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIB [PAIRS] [PROGRAM ARGS...]\n", argv[0]);
        return 2;
    }
    const char *lib = argv[1];
    int pairs = argc > 2 ? atoi(argv[2]) : 300;
    char *dflt[] = {"/bin/true", NULL};
    char **prog = argc > 3 ? argv + 3 : dflt;
    if (pairs < 1) pairs = 300;
    char **plain = env_with(NULL), **pre = env_with(lib);
    /* a, b: wall times without and with; ca, cb: CPU times; d, cd: the pairs' differences */
    double *a = malloc(pairs * sizeof *a), *b = malloc(pairs * sizeof *b);
    double *ca = malloc(pairs * sizeof *ca), *cb = malloc(pairs * sizeof *cb);
    double *d = malloc(pairs * sizeof *d), *cd = malloc(pairs * sizeof *cd);
    double ignored;
    for (int i = 0; i < 10; i++) start_once(prog, i % 2 ? pre : plain, &ignored); /* warm-up */
    for (int i = 0; i < pairs; i++) {
        if (i % 2) {
            b[i] = start_once(prog, pre, &cb[i]);
            a[i] = start_once(prog, plain, &ca[i]);
        } else {
            a[i] = start_once(prog, plain, &ca[i]);
            b[i] = start_once(prog, pre, &cb[i]);
        }
        d[i] = b[i] - a[i];
        cd[i] = cb[i] - ca[i];
    }
    char model[200];
    cpu_model(model, sizeof model);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    double ma = median(a, pairs), mb = median(b, pairs), md = median(d, pairs);
    double mca = median(ca, pairs), mcb = median(cb, pairs), mcd = median(cd, pairs);
    char load[64] = "?";
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        double l1, l5, l15;
        if (fscanf(la, "%lf %lf %lf", &l1, &l5, &l15) == 3)
            snprintf(load, sizeof load, "%.1f %.1f %.1f", l1, l5, l15);
        fclose(la);
    }
    printf("cpu: %s (%ld online), load average %s\n", model, cpus, load);
    printf("%s, %d interleaved pairs; %s\n", prog[0], pairs, lib);
    printf("wall: without %.0f us, with %.0f us, pair difference %+.0f us (%+.1f%%)\n", ma, mb,
           md, 100 * md / ma);
    printf("cpu time: without %.0f us, with %.0f us, pair difference %+.0f us (%+.1f%%)\n", mca,
           mcb, mcd, 100 * mcd / mca);
    return 0;
}
