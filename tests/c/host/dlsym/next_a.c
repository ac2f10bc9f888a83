/* Loaded before next_b: defines mrc_probe (version MRC_1, next_a.map) and looks up the next definition
 * from here, as an interposing library does. */
#define _GNU_SOURCE
#include <dlfcn.h>

int mrc_probe(void) { return 'A'; }

int probe_next_from_a(void) {
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "mrc_probe");
    return f ? f() : 0;
}

int probe_vnext_from_a(void) {
    int (*f)(void) = (int (*)(void))dlvsym(RTLD_NEXT, "mrc_probe", "MRC_1");
    return f ? f() : 0;
}
