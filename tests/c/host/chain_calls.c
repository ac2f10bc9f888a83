/* Makes each memory call an interposer may define a known number of times (ROUNDS; mprotect
 * twice a round; process_madvise and remap_file_pages are counted whether or not this
 * kernel accepts them), plus
 * calls libc makes inside itself (free of an mmapped chunk, malloc_trim), which never go to
 * an interposer. Prints "chain_calls: done" and exits 0; any failing call exits 1. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define ROUNDS 5
#define FAIL(what) do { fprintf(stderr, "chain_calls: %s failed\n", what); return 1; } while (0)

extern void *mmap64(void *, size_t, int, int, int, off_t);

int main(void) {
    const size_t page = 4096;
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    for (int i = 0; i < ROUNDS; i++) {
        char *p = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) FAIL("mmap");
        memset(p, 1, 2 * page);
        if (madvise(p, page, MADV_DONTNEED)) FAIL("madvise");
        /* Protection changes: one taking access away, one giving it back. */
        if (mprotect(p, page, PROT_READ) || mprotect(p, page, PROT_READ | PROT_WRITE)) FAIL("mprotect");
        if (pkey_mprotect(p, page, PROT_READ | PROT_WRITE, -1)) FAIL("pkey_mprotect");
        if (posix_madvise(p, page, POSIX_MADV_DONTNEED)) FAIL("posix_madvise");
        struct iovec v = {p, page};
        (void)process_madvise(pidfd, &v, 1, MADV_COLD, 0);
        char *shared = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (shared == MAP_FAILED) FAIL("mmap shared");
        (void)remap_file_pages(shared, page, 0, 0, 0);
        if (munmap(shared, page)) FAIL("munmap shared");
        char *q = mremap(p, 2 * page, 4 * page, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) FAIL("mremap");
        if (munmap(q, 4 * page)) FAIL("munmap");
        char *r = mmap64(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r == MAP_FAILED || munmap(r, page)) FAIL("mmap64");

        void *cur = sbrk(0);
        if (cur == (void *)-1 || brk(cur)) FAIL("brk");

        int id = shmget(IPC_PRIVATE, page, IPC_CREAT | 0600);
        if (id < 0) FAIL("shmget");
        void *s = shmat(id, NULL, 0);
        shmctl(id, IPC_RMID, NULL);
        if (s == (void *)-1 || shmdt(s)) FAIL("shmat/shmdt");

        /* libc's own: an mmapped chunk freed, the heap trimmed. */
        char *big = malloc(1 << 20);
        if (!big) FAIL("malloc");
        memset(big, 2, 1 << 20);
        free(big);
        malloc_trim(0);
    }
    printf("chain_calls: done\n");
    return 0;
}
