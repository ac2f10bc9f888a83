/* Libraries for next_definition.c, one per -D:
 *   SYSV_PLAIN      nothing of interest, linked --hash-style=sysv (no GNU hash table)
 *   IFUNC_MUNMAP    a munmap interposer whose munmap is an IFUNC (as GCC's target_clones or a
 *                   CPU-dispatching library makes it): it counts calls and forwards them
 *   COMPAT_MUNMAP   a munmap kept only as a hidden version (munmap@COMPAT_1), which no
 *                   unversioned lookup may bind: it fails every call with EPERM
 *   PRIVATE_MUNMAP  a plugin's own munmap, for its own callers (loaded RTLD_LOCAL): it fails
 *                   every call with EPERM
 * The counter prints "ifunc munmap: N calls" at exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>

#ifdef SYSV_PLAIN
int next_definition_sysv_marker(void) { return 42; }
#endif

#ifdef IFUNC_MUNMAP
static int (*next_munmap)(void *, size_t);
static long calls;

static int counting_munmap(void *a, size_t n) {
    if (!next_munmap) next_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    return next_munmap(a, n);
}

typedef int (*munmap_fn)(void *, size_t);
static munmap_fn resolve_munmap(void) { return counting_munmap; }
int munmap(void *a, size_t n) __attribute__((ifunc("resolve_munmap")));

__attribute__((destructor)) static void report(void) { fprintf(stderr, "ifunc munmap: %ld calls\n", calls); }
#endif

#ifdef PRIVATE_MUNMAP
int munmap(void *a, size_t n) {
    (void)a, (void)n;
    errno = EPERM;
    return -1;
}
#endif

#ifdef COMPAT_MUNMAP
int compat_munmap(void *a, size_t n) {
    (void)a, (void)n;
    errno = EPERM;
    return -1;
}
__asm__(".symver compat_munmap, munmap@COMPAT_1");
#endif
