/* A memory interposer, as a profiler or a leak checker is one: it defines mmap, mmap64,
 * munmap, madvise, mremap, brk, sbrk, shmat, shmdt, mprotect, pkey_mprotect, posix_madvise,
 * process_madvise and remap_file_pages, counts every call it gets, and forwards it to the
 * next definition (dlsym RTLD_NEXT). At exit it prints its counts on standard error, tagged
 * with CHAIN_TAG (default "interposer"):
 *   interposer: mmap=N mmap64=N munmap=N madvise=N mremap=N brk=N sbrk=N shmat=N shmdt=N
 *               mprotect=N pkey_mprotect=N posix_madvise=N process_madvise=N
 *               remap_file_pages=N   (one line)
 * Two copies (built from this file with different tags) can be preloaded together. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef CHAIN_TAG
#define CHAIN_TAG "interposer"
#endif

enum {
    MMAP, MMAP64, MUNMAP, MADVISE, MREMAP, BRK, SBRK, SHMAT, SHMDT,
    MPROTECT, PKEY_MPROTECT, POSIX_MADVISE, PROCESS_MADVISE, REMAP_FILE_PAGES, N
};
static const char *names[N] = {"mmap", "mmap64", "munmap", "madvise", "mremap", "brk", "sbrk", "shmat", "shmdt",
                               "mprotect", "pkey_mprotect", "posix_madvise", "process_madvise", "remap_file_pages"};
static unsigned long counts[N];
static void *next[N];

/* The next definition of call i, looked up on first use (the constructor looks them all
 * up first; a call made before it, from another library's constructor, looks up here). */
static void *real(int i) {
    void *f = __atomic_load_n(&next[i], __ATOMIC_ACQUIRE);
    if (!f) {
        f = dlsym(RTLD_NEXT, names[i]);
        __atomic_store_n(&next[i], f, __ATOMIC_RELEASE);
    }
    return f;
}

static void count(int i) { __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED); }

__attribute__((constructor)) static void resolve(void) {
    for (int i = 0; i < N; i++) real(i);
}

__attribute__((destructor)) static void report(void) {
    char line[1024];
    int n = snprintf(line, sizeof line, "%s:", CHAIN_TAG);
    for (int i = 0; i < N; i++)
        n += snprintf(line + n, sizeof line - n, " %s=%lu", names[i], __atomic_load_n(&counts[i], __ATOMIC_RELAXED));
    n += snprintf(line + n, sizeof line - n, "\n");
    if (write(2, line, n) < 0) _exit(99);
}

void *mmap(void *a, size_t l, int p, int f, int fd, off_t o) {
    count(MMAP);
    return ((void *(*)(void *, size_t, int, int, int, off_t))real(MMAP))(a, l, p, f, fd, o);
}
void *mmap64(void *a, size_t l, int p, int f, int fd, off_t o) {
    count(MMAP64);
    return ((void *(*)(void *, size_t, int, int, int, off_t))real(MMAP64))(a, l, p, f, fd, o);
}
int munmap(void *a, size_t l) {
    count(MUNMAP);
    return ((int (*)(void *, size_t))real(MUNMAP))(a, l);
}
int madvise(void *a, size_t l, int adv) {
    count(MADVISE);
    return ((int (*)(void *, size_t, int))real(MADVISE))(a, l, adv);
}
void *mremap(void *old, size_t ol, size_t nl, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    void *na = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : NULL;
    va_end(ap);
    count(MREMAP);
    return ((void *(*)(void *, size_t, size_t, int, void *))real(MREMAP))(old, ol, nl, flags, na);
}
int brk(void *a) {
    count(BRK);
    return ((int (*)(void *))real(BRK))(a);
}
void *sbrk(intptr_t inc) {
    count(SBRK);
    return ((void *(*)(intptr_t))real(SBRK))(inc);
}
void *shmat(int id, const void *a, int f) {
    count(SHMAT);
    return ((void *(*)(int, const void *, int))real(SHMAT))(id, a, f);
}
int shmdt(const void *a) {
    count(SHMDT);
    return ((int (*)(const void *))real(SHMDT))(a);
}
int mprotect(void *a, size_t l, int p) {
    count(MPROTECT);
    return ((int (*)(void *, size_t, int))real(MPROTECT))(a, l, p);
}
int pkey_mprotect(void *a, size_t l, int p, int k) {
    count(PKEY_MPROTECT);
    return ((int (*)(void *, size_t, int, int))real(PKEY_MPROTECT))(a, l, p, k);
}
int posix_madvise(void *a, size_t l, int adv) {
    count(POSIX_MADVISE);
    return ((int (*)(void *, size_t, int))real(POSIX_MADVISE))(a, l, adv);
}
ssize_t process_madvise(int pidfd, const struct iovec *v, size_t n, int adv, unsigned int flags) {
    count(PROCESS_MADVISE);
    return ((ssize_t(*)(int, const struct iovec *, size_t, int, unsigned int))real(PROCESS_MADVISE))(pidfd, v, n, adv, flags);
}
int remap_file_pages(void *a, size_t size, int prot, size_t pgoff, int flags) {
    count(REMAP_FILE_PAGES);
    return ((int (*)(void *, size_t, int, size_t, int))real(REMAP_FILE_PAGES))(a, size, prot, pgoff, flags);
}
