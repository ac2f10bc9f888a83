/* dlclose: the loader unmaps a plugin's segments with its own munmap. A plugin's static
 * buffer registered, released (the cache keeps it), the plugin dlclose'd, and another plugin
 * loaded at the same address: a registration of the new plugin's buffer must reach its new
 * pages, never the old registration.
 *
 *   dlclose A.so B.so   (two copies of $BIN/libdlplugin.so under different names)
 */
#include "lib/loopback.h"

#include <dlfcn.h>
#include <string.h>

#define LEN (1u << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static char *load(const char *path, void **handle) {
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(*handle, "dlopen %s: %s", path, dlerror());
    char *buf = dlsym(*handle, "plugin_buffer");
    CHECK(buf, "dlsym plugin_buffer in %s", path);
    return buf;
}

int main(int argc, char **argv) {
    CHECK(argc == 3, "usage: dlclose A.so B.so (two copies of libdlplugin.so)");
    struct loopback lb;
    CHECK(lb_open(&lb, NULL) == 0, "cannot open the loopback pair");
    void *ha, *hb;
    char *a = load(argv[1], &ha);
    struct ibv_mr *m = ibv_reg_mr(lb.pd, a, LEN, ACCESS);
    CHECK(m, "reg of %s's buffer", argv[1]);
    CHECK(lb_prove_write(&lb, m, a, LEN, 1) == 0, "data into %s's buffer", argv[1]);
    CHECK(ibv_dereg_mr(m) == 0, "dereg"); /* idle in the cache */
    CHECK(dlclose(ha) == 0, "dlclose %s: %s", argv[1], dlerror());
    char *b = load(argv[2], &hb);
    CHECK(b == a, "%s's buffer is at %p, %s's was at %p: the loader did not reuse the address, so this run cannot test dlclose",
          argv[2], (void *)b, argv[1], (void *)a);
    m = ibv_reg_mr(lb.pd, b, LEN, ACCESS);
    CHECK(m, "reg of %s's buffer", argv[2]);
    CHECK(lb_prove_write(&lb, m, b, LEN, 2) == 0,
          "data did not reach %s's buffer at the address %s had: STALE registration after dlclose", argv[2], argv[1]);
    CHECK(ibv_dereg_mr(m) == 0, "dereg");
    CHECK(dlclose(hb) == 0, "dlclose %s", argv[2]);
    lb_close(&lb);
    printf("dlclose: ok (both plugins' buffers at %p)\n", (void *)a);
    return 0;
}
