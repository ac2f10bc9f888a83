/* A registration passed through to libibverbs (here ZERO_BASED or ON_DEMAND, which the
 * cache never serves) whose MR object lands at the address of an MR the cache deregistered
 * earlier (a tombstone: a later ibv_dereg_mr of that address would be a double
 * deregistration) must deregister normally: 0, not EINVAL and a leaked MR. */
#include "lib/loopback.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#define LEN (64u << 10)
#define OLD 32 /* more freed MR objects than glibc's per-size tcache holds (7) */
#define TRIES 64 /* passthrough registrations held at once, per round */
#define ROUNDS 16 /* rounds at most, until one lands at a tombstoned address */

int main(void) {
    CHECK(mrcache_loaded(), "this test needs libmrcache.so preloaded");
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    /* A passthrough flag this device accepts. */
    unsigned flags[] = {IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND};
    const char *names[] = {"ZERO_BASED", "ON_DEMAND"};
    char *probe = malloc(LEN);
    int pick = -1;
    for (int i = 0; i < 2 && pick < 0; i++) {
        struct ibv_mr *m = ibv_reg_mr(lb.pd, probe, LEN, flags[i]);
        if (m) {
            CHECK(ibv_dereg_mr(m) == 0, "dereg of the probe");
            pick = i;
        }
    }
    CHECK(pick >= 0, "the device accepts neither ZERO_BASED nor ON_DEMAND registrations: no passthrough to test");

    /* Cached registrations, released (idle), then their memory unmapped; the next
     * ibv_dereg_mr applies the unmaps: the cache deregisters them all at once (the provider
     * frees their MR objects) and remembers their pointers as tombstones. */
    struct ibv_mr *keep = ibv_reg_mr(lb.pd, probe, LEN, IBV_ACCESS_LOCAL_WRITE);
    CHECK(keep, "reg of the probe");
    void *old[OLD];
    char *mem[OLD];
    struct ibv_mr *mrs[OLD];
    for (int i = 0; i < OLD; i++) {
        mem[i] = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(mem[i] != MAP_FAILED, "mmap");
        memset(mem[i], 1, LEN);
        mrs[i] = ibv_reg_mr(lb.pd, mem[i], LEN, IBV_ACCESS_LOCAL_WRITE);
        CHECK(mrs[i], "reg %d", i);
        old[i] = mrs[i];
    }
    for (int i = 0; i < OLD; i++)
        CHECK(ibv_dereg_mr(mrs[i]) == 0, "dereg %d", i);
    for (int i = 0; i < OLD; i++)
        CHECK(munmap(mem[i], LEN) == 0, "munmap");
    CHECK(ibv_dereg_mr(keep) == 0, "dereg of the probe");
    if (getenv("FOREIGN_DEBUG"))
        for (int i = 0; i < OLD; i++)
            printf("cached %d at %p\n", i, old[i]);

    /* Held all at once, so that they exhaust this thread's tcache and come from the arena's
     * bins, where the freed MR objects are whichever thread freed them (the cache
     * deregisters on this thread or on its drain thread: in the second case this thread's
     * tcache holds none of them, and one registration at a time would recycle one chunk). */
    int reused = 0, tries = 0;
    struct ibv_mr *held[TRIES];
    for (int r = 0; r < ROUNDS && !reused; r++) {
        int at_old[TRIES];
        for (int t = 0; t < TRIES; t++, tries++) {
            struct ibv_mr *m = ibv_reg_mr(lb.pd, probe, LEN, flags[pick]);
            CHECK(m, "%s registration %d: %s", names[pick], tries, strerror(errno));
            held[t] = m;
            at_old[t] = 0;
            for (int i = 0; i < OLD; i++)
                at_old[t] |= old[i] == (void *)m;
            reused += at_old[t];
            if (getenv("FOREIGN_DEBUG"))
                printf("passthrough %d at %p%s\n", tries, (void *)m, at_old[t] ? " (tombstoned)" : "");
        }
        for (int t = 0; t < TRIES; t++) {
            void *m = held[t];
            int rc = ibv_dereg_mr(held[t]);
            CHECK(rc == 0, "ibv_dereg_mr of a %s registration at %s address %p gave %d (%s): the MR leaked",
                  names[pick], at_old[t] ? "a reused (tombstoned)" : "a fresh", m, rc, strerror(rc));
        }
    }
    CHECK(reused > 0, "no passthrough MR object reused the address of a deregistered cached one in %d tries: the test proves nothing", tries);
    lb_close(&lb);
    printf("foreign_dereg: ok (%s passthrough, %d of %d MR objects at a tombstoned address)\n", names[pick], reused, tries);
    return 0;
}
