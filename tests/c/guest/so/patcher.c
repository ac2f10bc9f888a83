/* A second code patcher in the process, as UCX's bistro, Open MPI's patcher or a profiler
 * would be: its constructor overwrites the entry of libc's munmap with its own jump
 * (movabs r11, hook; jmp r11 on x86-64; ldr x16, #8; br x16 on aarch64) to a hook that makes the system call itself. Whatever was at
 * libc's entry before (mrcache's jump) is gone. Built into $BIN/libpatcher.so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int patcher_munmap(void *addr, size_t len) {
    return (int)syscall(SYS_munmap, addr, len);
}

__attribute__((constructor)) static void patcher_install(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    unsigned char *f = libc ? dlsym(libc, "munmap") : NULL;
    if (!f) {
        fprintf(stderr, "patcher: libc's munmap not found\n");
        return;
    }
    uint64_t hook = (uint64_t)(uintptr_t)patcher_munmap;
#if defined(__aarch64__)
    /* ldr x16, #8; br x16; .quad hook (UCX's bistro jump, with x16) */
    unsigned char code[16] = {0x50, 0x00, 0x00, 0x58, 0x00, 0x02, 0x1f, 0xd6};
    memcpy(code + 8, &hook, 8);
#else
    unsigned char code[13] = {0x49, 0xbb};
    memcpy(code + 2, &hook, 8);
    code[10] = 0x41, code[11] = 0xff, code[12] = 0xe3;
#endif
    uintptr_t page = (uintptr_t)f & ~4095ul;
    size_t span = ((uintptr_t)f + sizeof code - page + 4095) & ~4095ul;
    if (syscall(SYS_mprotect, page, span, PROT_READ | PROT_WRITE | PROT_EXEC)) {
        perror("patcher: mprotect");
        return;
    }
    memcpy(f, code, sizeof code);
    __builtin___clear_cache((char *)f, (char *)f + sizeof code);
    syscall(SYS_mprotect, page, span, PROT_READ | PROT_EXEC);
    fprintf(stderr, "patcher: libc's munmap now jumps to the patcher's hook\n");
}
