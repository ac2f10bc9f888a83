/* does a key handed out before a later hit ever come back?
 * Register buffer A with REMOTE_WRITE, keep its rkey k0, dereg. Then 300 times register and
 * deregister another buffer B. If any registration of B carries rkey k0, a peer that kept
 * A's key writes into B with it: proven with a real RDMA WRITE. */
#include "lib/loopback.h"
#include <string.h>
#define LEN (16u << 10)
int main(void) {
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "open");
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    unsigned char *a = malloc(LEN), *b = malloc(LEN);
    struct ibv_mr *mr = ibv_reg_mr(lb.pd, a, LEN, access);
    CHECK(mr, "reg a");
    uint32_t k0 = mr->rkey;
    CHECK(ibv_dereg_mr(mr) == 0, "dereg a");
    for (int i = 1; i <= 300; i++) {
        struct ibv_mr *m = ibv_reg_mr(lb.pd, b, LEN, access);
        CHECK(m, "reg b");
        if (m->rkey == k0) {
            memset(b, 0x5a, LEN);
            struct loopback peer;
            CHECK(lb_open_shared(&peer, &lb) == 0, "peer");
            lb_fill(peer.stage, LEN, 7);
            int rc = lb_write(&peer, peer.stage, LEN, peer.stage_mr->lkey, (uintptr_t)b, k0);
            int landed = lb_check(b, LEN, 7) < 0;
            lb_close(&peer);
            printf("rkey_wrap: registration %d of B has A's old rkey %#x; RDMA WRITE with it: status %d, %s\n",
                   i, k0, rc, landed ? "all bytes of B overwritten" : "not landed");
            CHECK(0, "a key from a deregistered registration came back");
        }
        CHECK(ibv_dereg_mr(m) == 0, "dereg b");
    }
    printf("rkey_wrap: ok, A's rkey %#x never came back in 300 registrations\n", k0);
    lb_close(&lb);
    return 0;
}
