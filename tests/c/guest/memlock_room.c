/* Under RLIMIT_MEMLOCK 3 MiB without CAP_IPC_LOCK (the case runs it under `ulimit -l 3072`
 * and `setpriv --bounding-set=-ipc_lock`): a 2 MiB buffer A registered and deregistered four
 * times, 4 KiB inside A registered and kept, then a 2 MiB buffer B. libibverbs pins 4 KiB +
 * 2 MiB and succeeds; so must the preload. A third 2 MiB registration then fails with ENOMEM
 * both ways: the limit is in force. */
#include "lib/loopback.h"

#include <errno.h>
#include <linux/capability.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static char *map(size_t len) {
    char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(b != MAP_FAILED, "mmap failed");
    memset(b, 1, len);
    return b;
}

int main(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    CHECK(syscall(SYS_capget, &h, d) == 0, "capget failed");
    CHECK(!(d[0].effective & (1u << CAP_IPC_LOCK)), "CAP_IPC_LOCK is effective: run under setpriv");
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_MEMLOCK, &r) == 0 && r.rlim_cur == 3u << 20, "RLIMIT_MEMLOCK is not 3 MiB");

    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0], "no RDMA device");
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx, "ibv_open_device failed");
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd, "ibv_alloc_pd failed");

    const size_t two = 2 << 20;
    char *a = map(two), *b = map(two), *c = map(two);
    for (int i = 0; i < 4; i++) {
        struct ibv_mr *m = ibv_reg_mr(pd, a, two, IBV_ACCESS_LOCAL_WRITE);
        CHECK(m, "registration %d of A failed: %s", i, strerror(errno));
        CHECK(ibv_dereg_mr(m) == 0, "dereg of A failed");
    }
    struct ibv_mr *small = ibv_reg_mr(pd, a + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
    CHECK(small, "4 KiB inside A failed: %s", strerror(errno));
    struct ibv_mr *big = ibv_reg_mr(pd, b, two, IBV_ACCESS_LOCAL_WRITE);
    CHECK(big, "2 MiB B beside 4 KiB under a 3 MiB limit failed: %s", strerror(errno));
    errno = 0;
    struct ibv_mr *third = ibv_reg_mr(pd, c, two, IBV_ACCESS_LOCAL_WRITE);
    CHECK(!third && errno == ENOMEM, "a third 2 MiB registration: %p errno %d (the limit is not in force)",
          (void *)third, errno);
    CHECK(ibv_dereg_mr(big) == 0 && ibv_dereg_mr(small) == 0, "dereg failed");
    CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd failed");
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    printf("memlock_room: ok\n");
    return 0;
}
