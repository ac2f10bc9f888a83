/* For engine_attach.c: a library whose constructor (run inside dlopen, under the loader's
 * lock) registers a buffer twice, 300 ms after it starts, as a plugin that registers at
 * load. `big`: an initial-exec TLS block for engine_attach.c's tls mode (built with
 * -DBIG_TLS). */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdatomic.h>
#include <stddef.h>
#include <unistd.h>

#ifdef BIG_TLS
__thread char big[BIG_TLS] __attribute__((tls_model("initial-exec")));
char *big_tls(void) { return big; }
#else
extern struct ibv_pd *attach_pd;
extern atomic_int attach_in_ctor;
extern const char *attach_pair(struct ibv_pd *p, char *b);
static const char *result = "not run";
const char *attach_ctor_result(void) { return result; }

__attribute__((constructor)) static void ctor(void) {
    static char buf[4096] __attribute__((aligned(4096)));
    attach_in_ctor = 1;
    usleep(300000); /* the main thread is now in its first registration */
    result = attach_pair(attach_pd, buf);
}
#endif
