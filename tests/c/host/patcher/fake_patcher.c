/* A third code patcher in the manner of libfabric 1.17's memhooks: start() writes
 * `movabs r11, hook; jmp r11` (x86-64) or `movz x15; movk x15 (3 times); br x15` (aarch64)
 * over the entry of libc's munmap (found with dlsym(RTLD_NEXT),
 * past libmrcache.so), keeping the bytes it replaced; its hook counts unmaps of the watched
 * range and issues the system call; stop() writes the kept bytes back. A program may then
 * dlclose this library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

char *patcher_lo, *patcher_hi;
int patcher_events;

static unsigned char *entry;
#if defined(__aarch64__)
#define CODE_LEN 20
#else
#define CODE_LEN 13
#endif
static unsigned char kept[CODE_LEN];

static int hook_munmap(void *addr, size_t len) {
    char *a = addr;
    if (a < patcher_hi && a + len > patcher_lo)
        patcher_events++;
    return (int)syscall(SYS_munmap, addr, len);
}

static int write_code(const unsigned char *code) {
    uintptr_t mask = (uintptr_t)sysconf(_SC_PAGESIZE) - 1;
    uintptr_t page = (uintptr_t)entry & ~mask;
    size_t span = ((uintptr_t)entry + CODE_LEN - page + mask) & ~mask;
    if (mprotect((void *)page, span, PROT_READ | PROT_WRITE | PROT_EXEC))
        return -1;
    memcpy(entry, code, CODE_LEN);
    __builtin___clear_cache((char *)entry, (char *)entry + CODE_LEN);
    return mprotect((void *)page, span, PROT_READ | PROT_EXEC);
}

int patcher_start(void) {
    entry = dlsym(RTLD_NEXT, "munmap");
    if (!entry)
        return -1;
    memcpy(kept, entry, sizeof kept);
    uint64_t hook = (uintptr_t)hook_munmap;
#if defined(__aarch64__)
    /* libfabric's aarch64 memhooks: movz x15, #h0; movk x15, #h1, lsl #16; ..; br x15 */
    uint32_t words[5];
    for (uint32_t hw = 0; hw < 4; hw++)
        words[hw] = (hw ? 0xf2800000u : 0xd2800000u) | hw << 21 | (uint32_t)(hook >> (hw * 16) & 0xffff) << 5 | 15;
    words[4] = 0xd61f01e0u;
    unsigned char code[CODE_LEN];
    memcpy(code, words, sizeof words);
#else
    unsigned char code[CODE_LEN] = {0x49, 0xbb};
    memcpy(code + 2, &hook, 8);
    code[10] = 0x41, code[11] = 0xff, code[12] = 0xe3;
#endif
    return write_code(code);
}

int patcher_stop(void) { return write_code(kept); }
