/* Two live registrations of one buffer, released in both orders. Each must work on its
 * own (data lands through each one's rkey), each has its own pointer with the buffer's
 * addr/length, and whatever is released first leaves the other intact. */
#include "lib/loopback.h"

static void round_trip(struct loopback *lb, char *buf, size_t len, int release_first_first) {
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *a = ibv_reg_mr(lb->pd, buf, len, access);
    struct ibv_mr *b = ibv_reg_mr(lb->pd, buf, len, access);
    CHECK(a && b, "registration failed");
    CHECK(a != b, "two live registrations share one pointer");
    CHECK(a->addr == buf && b->addr == buf && a->length == len && b->length == len, "fields");
    CHECK(lb_prove_write(lb, a, buf, len, 1) == 0, "write through the first failed");
    CHECK(lb_prove_write(lb, b, buf, len, 2) == 0, "write through the second failed");
    struct ibv_mr *first = release_first_first ? a : b, *second = release_first_first ? b : a;
    CHECK(ibv_dereg_mr(first) == 0, "first dereg failed");
    CHECK(lb_prove_write(lb, second, buf, len, 3) == 0, "the survivor stopped working");
    CHECK(ibv_dereg_mr(second) == 0, "second dereg failed");
}

int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    size_t len = 1 << 20;
    char *buf = malloc(len);
    round_trip(&lb, buf, len, 1);
    round_trip(&lb, buf, len, 0);
    free(buf);
    lb_close(&lb);
    printf("two_live: ok\n");
    return 0;
}
