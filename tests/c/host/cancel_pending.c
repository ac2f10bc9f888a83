/* A thread with a cancel pending (pthread_cancel, deferred) makes a verbs registration
 * and then reaches a cancellation point of its own: the cancel must act there, as without
 * the preload, and never inside a hook, where it would unwind through the library's frames.
 *   cancel_pending cold   the thread's registration is the process's first
 *   cancel_pending warm   the process registered before (the cache is set up)
 * Prints "thread cancelled" (or "thread returned"). exit 0; 2: bad argument. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define LEN 65536ul
static struct ibv_pd pd;
static atomic_int go;

#include "fake_mr.h"

static void reg_dereg(void) {
    char *b = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) abort();
    struct ibv_mr *mr = ibv_reg_mr(&pd, b, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || ibv_dereg_mr(mr)) abort();
    munmap(b, LEN);
}

static void *body(void *arg) {
    (void)arg;
    while (!atomic_load(&go)) /* no cancellation point before the registration */;
    reg_dereg();
    pthread_testcancel();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "cold") && strcmp(argv[1], "warm"))) return 2;
    static struct ibv_context ctx;
    ctx.ops._compat_reg_mr = (void *(*)(void))fake_reg;
    ctx.ops._compat_dereg_mr = (void *(*)(void))fake_dereg;
    pd.context = &ctx;
    if (!strcmp(argv[1], "warm")) reg_dereg();
    pthread_t t;
    void *res;
    if (pthread_create(&t, NULL, body, NULL) || pthread_cancel(t)) abort();
    atomic_store(&go, 1);
    pthread_join(t, &res);
    printf("thread %s\n", res == PTHREAD_CANCELED ? "cancelled" : "returned");
    return 0;
}
