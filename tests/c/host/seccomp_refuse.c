/* Run a program under a seccomp filter that fails one call with EPERM and lets every other
 * one through, then exec (the filter stays, PR_SET_NO_NEW_PRIVS):
 *
 *   seccomp_refuse sync-core PROGRAM [ARGS...]
 *       membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE) only: QUERY and REGISTER
 *       succeed, so the kernel looks as if it had the barrier
 *   seccomp_refuse restore-rx PROGRAM [ARGS...]
 *       mprotect with prot == PROT_READ|PROT_EXEC only: making code writable succeeds,
 *       making it read+execute again does not
 */
#include <errno.h>
#include <linux/filter.h>
#include <linux/membarrier.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "sync-core") && strcmp(argv[1], "restore-rx"))) {
        fprintf(stderr, "usage: seccomp_refuse sync-core|restore-rx PROGRAM [ARGS...]\n");
        return 2;
    }
    int sync = !strcmp(argv[1], "sync-core");
    unsigned nr = sync ? SYS_membarrier : SYS_mprotect;
    unsigned arg = sync ? 0 : 2;
    unsigned value = sync ? MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE : PROT_READ | PROT_EXEC;
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]) + 8 * arg),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, value, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        fprintf(stderr, "seccomp_refuse: seccomp: %s\n", strerror(errno));
        return 2;
    }
    execvp(argv[2], argv + 2);
    fprintf(stderr, "seccomp_refuse: %s: %s\n", argv[2], strerror(errno));
    return 127;
}
