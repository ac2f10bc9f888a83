/* dlsym/dlvsym lookups that do not name a verbs function answer exactly as without
 * libmrcache.so: RTLD_NEXT resolves relative to the object that calls it (not to the
 * preloaded library), RTLD_DEFAULT and handles as usual, and a miss sets dlerror().
 * Linked with -lnext_a -lnext_b (in that order). Exit 0: all as expected. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int mrc_probe(void);
int probe_next_from_a(void);
int probe_vnext_from_a(void);

static int failed;

/* libc's base symbol version: puts has no other. */
#if defined(__aarch64__)
#define LIBC_BASE "GLIBC_2.17"
#else
#define LIBC_BASE "GLIBC_2.2.5"
#endif

static void expect(const char *what, long got, long want) {
    if (got != want) {
        fprintf(stderr, "FAIL %s: got %ld (%c), want %ld (%c)\n", what, got, (int)got, want,
                (int)want);
        failed = 1;
    }
}

int main(void) {
    expect("RTLD_NEXT from next_a", probe_next_from_a(), 'B');
    expect("dlvsym RTLD_NEXT MRC_1 from next_a", probe_vnext_from_a(), 'B');
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "mrc_probe");
    expect("RTLD_NEXT from the program", f ? f() : 0, 'A');
    f = (int (*)(void))dlsym(RTLD_DEFAULT, "mrc_probe");
    expect("RTLD_DEFAULT", f ? f() : 0, 'A');
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    expect("libc handle", libc != NULL, 1);
    expect("RTLD_NEXT puts from the program is libc's",
           dlsym(RTLD_NEXT, "puts") == dlsym(libc, "puts"), 1);
    expect("dlvsym RTLD_DEFAULT puts@" LIBC_BASE " is libc's",
           dlvsym(RTLD_DEFAULT, "puts", LIBC_BASE) == dlsym(libc, "puts"), 1);
    dlerror();
    expect("miss returns NULL", dlsym(RTLD_DEFAULT, "mrc_no_such_symbol") == NULL, 1);
    expect("miss sets dlerror", dlerror() != NULL, 1);
    dlerror();
    expect("miss of a hooked verbs name in libc returns NULL",
           dlsym(libc, "ibv_reg_mr") == NULL, 1);
    expect("verbs miss sets dlerror", dlerror() != NULL, 1);
    if (!failed)
        printf("dlsym_next: ok\n");
    return failed;
}
