/* two threads ibv_dereg_mr the same remote handle at once (an app bug the
 * cache claims to catch: the second gets EINVAL). While the first is inside revoke (lock
 * dropped, key not yet in released_grants), the second finds the handle nowhere and passes
 * the shadow to libibverbs, whose dereg uses the shadow's handle = the cached MR's. */
#include "lib/loopback.h"
#include <pthread.h>
#include <string.h>
#include <errno.h>
#define LEN (16u << 10)
static struct ibv_mr *shared_mr;
static pthread_barrier_t bar;
static int rc2;
static void *second(void *arg) {
    (void)arg;
    pthread_barrier_wait(&bar);
    rc2 = ibv_dereg_mr(shared_mr);
    return NULL;
}
int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    unsigned char *b = malloc(LEN);
    int bad = 0;
    for (int i = 0; i < 400 && bad < 3; i++) {
        shared_mr = ibv_reg_mr(lb.pd, b, LEN, access);
        CHECK(shared_mr, "reg at iteration %d (errno %d)", i, errno);
        CHECK(lb_prove_write(&lb, shared_mr, b, LEN, i) == 0, "write at iteration %d", i);
        pthread_barrier_init(&bar, NULL, 2);
        pthread_t t;
        pthread_create(&t, NULL, second, NULL);
        pthread_barrier_wait(&bar);
        int rc1 = ibv_dereg_mr(shared_mr);
        pthread_join(t, NULL);
        pthread_barrier_destroy(&bar);
        if (!((rc1 == 0 && rc2 == EINVAL) || (rc1 == EINVAL && rc2 == 0))) {
            printf("race_dereg: iteration %d: ibv_dereg_mr returned %d and %d\n", i, rc1, rc2);
            bad++;
        }
    }
    CHECK(bad == 0, "not exactly one success and one EINVAL");
    printf("race_dereg: ok\n");
    return 0;
}
