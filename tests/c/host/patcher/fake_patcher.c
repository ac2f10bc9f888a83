/* A third code patcher in the manner of libfabric 1.17's memhooks: start() writes
 * `movabs r11, hook; jmp r11` over the entry of libc's munmap (found with dlsym(RTLD_NEXT),
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
static unsigned char kept[13];

static int hook_munmap(void *addr, size_t len) {
    char *a = addr;
    if (a < patcher_hi && a + len > patcher_lo)
        patcher_events++;
    return (int)syscall(SYS_munmap, addr, len);
}

static int write_code(const unsigned char *code) {
    uintptr_t page = (uintptr_t)entry & ~(uintptr_t)4095;
    size_t span = ((uintptr_t)entry + 13 - page + 4095) & ~(size_t)4095;
    if (mprotect((void *)page, span, PROT_READ | PROT_WRITE | PROT_EXEC))
        return -1;
    memcpy(entry, code, 13);
    return mprotect((void *)page, span, PROT_READ | PROT_EXEC);
}

int patcher_start(void) {
    entry = dlsym(RTLD_NEXT, "munmap");
    if (!entry)
        return -1;
    memcpy(kept, entry, sizeof kept);
    unsigned char code[13] = {0x49, 0xbb};
    uint64_t hook = (uintptr_t)hook_munmap;
    memcpy(code + 2, &hook, 8);
    code[10] = 0x41, code[11] = 0xff, code[12] = 0xe3;
    return write_code(code);
}

int patcher_stop(void) { return write_code(kept); }
