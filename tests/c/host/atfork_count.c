/* Preloaded first: counts the process's __register_atfork calls (pthread_atfork's body in
 * glibc 2.28+, linked into each caller from libc_nonshared.a), for untouched_libc.c. */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef int (*register_fn)(void (*)(void), void (*)(void), void (*)(void), void *);
static int calls;

int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso) {
    register_fn real = (register_fn)dlsym(RTLD_NEXT, "__register_atfork");
    calls++;
    return real ? real(prepare, parent, child, dso) : -1;
}

int atfork_registrations(void) {
    return calls;
}
