/* A plugin linked with libibverbs and dlopen'd RTLD_LOCAL by a program that is not: its
 * RTLD_NEXT lookups search its own dependencies, libibverbs among them. */
#define _GNU_SOURCE
#include <dlfcn.h>

static void *volatile found;

void *local_next(const char *name) {
    found = dlsym(RTLD_NEXT, name);
    return found;
}
