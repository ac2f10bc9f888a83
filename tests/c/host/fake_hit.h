/* The fake provider and helpers shared by fast_hit.c and hit_after_jump_changed.c: ibv_context ops that
 * track the MR objects they hand out (a miss on nest_in registers nest_on from inside, as a
 * provider registering a buffer of its own), a reg+dereg cycle, our jump at libc's munmap
 * entry and another patcher's jump over it. Include after the system headers. */
#ifndef MRCACHE_FAKE_HIT_H
#define MRCACHE_FAKE_HIT_H

#define LEN 4096ul
#define LIVE 64
static struct ibv_mr *live[LIVE];
static int registrations;
static char *nest_in, *nest_on; /* a miss on nest_in registers nest_on from inside */
static struct ibv_mr *nested_mr;
static struct ibv_pd pd;

__attribute__((unused)) static int is_live(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (mr && live[i] == mr) return 1;
    return 0;
}

__attribute__((unused)) static struct ibv_mr *fake_reg(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, int access) {
    (void)p, (void)len, (void)iova;
    struct ibv_mr *mr = calloc(1, sizeof(struct ibv_mr) + 64);
    for (int i = 0; i < LIVE; i++)
        if (!live[i]) {
            live[i] = mr;
            break;
        }
    registrations++;
    if (nest_in && addr == nest_in) {
        /* As a provider that registers a buffer of its own through the public API. */
        nested_mr = ibv_reg_mr(&pd, nest_on, LEN, access);
        if (nested_mr && ibv_dereg_mr(nested_mr)) nested_mr = NULL;
    }
    return mr;
}

__attribute__((unused)) static int fake_dereg(struct ibv_mr *mr) {
    for (int i = 0; i < LIVE; i++)
        if (live[i] == mr) {
            /* Never freed: a later registration's MR never takes a dead one's address, so
             * `mr == cached` after a flush is a hit, not malloc reusing the flushed MR (seen on
             * aarch64: caching turned off, the idle entry deregistered, the uncached
             * registration's calloc returned the same address: "served blind"). */
            live[i] = NULL;
            return 0;
        }
    fprintf(stderr, "fast_hit: the provider was asked to deregister %p, not one of its own\n", (void *)mr);
    exit(1);
}

/* reg+dereg of buf: the MR handed out. */
__attribute__((unused)) static struct ibv_mr *cycle(char *buf) {
    struct ibv_mr *mr = ibv_reg_mr(&pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || ibv_dereg_mr(mr)) {
        fprintf(stderr, "fast_hit: reg/dereg failed\n");
        exit(3);
    }
    return mr;
}

/* Whether p starts with our jump: a `jmp rel32`, or a `jmp rel8` to one in the padding
 * before the function (x86-64), or a `B` (aarch64). */
__attribute__((unused)) static int is_our_jump(const unsigned char *p) {
#if defined(__aarch64__)
    uint32_t insn;
    memcpy(&insn, p, 4);
    return (insn & 0xfc000000u) == 0x14000000u;
#else
    return p[0] == 0xe9 || p[0] == 0xeb;
#endif
}

/* Our jump in libc's munmap: on x86-64 over the `syscall` after `mov eax, 11` (kept), a
 * `jmp rel8` to a `jmp rel32` in the padding before the function (or, where no padding is
 * known, a `jmp rel32` over the first instruction; after an endbr64, if any), on aarch64 a
 * `B` over the first instruction, to our hook or to a trampoline leading there; *to: where
 * it leads. NULL: munmap is not patched. */
__attribute__((unused)) static unsigned char *our_jump(uintptr_t *to) {
    unsigned char *f = dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "munmap");
#if defined(__aarch64__)
    if (!f || !is_our_jump(f)) return NULL;
    uint32_t insn;
    memcpy(&insn, f, 4);
    int32_t words = (int32_t)(insn << 6) >> 6; /* imm26, sign-extended */
    *to = (uintptr_t)f + (intptr_t)words * 4;
    return f;
#else
    static const int sites[] = {0, 4, 5, 9};
    for (unsigned k = 0; f && k < sizeof sites / sizeof *sites; k++) {
        unsigned char *at = f + sites[k], *rel32 = at;
        if (!is_our_jump(at)) continue;
        if (at[0] == 0xeb) rel32 = at + 2 + (signed char)at[1];
        if (rel32[0] != 0xe9) continue;
        int32_t rel;
        memcpy(&rel, rel32 + 1, 4);
        *to = (uintptr_t)(rel32 + 5) + rel;
        return at;
    }
    return NULL;
#endif
}

/* The kernel's page size (4 KiB on x86-64; 4, 16 or 64 KiB on aarch64). */
__attribute__((unused)) static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

__attribute__((unused)) static void *page_of(void *p) { return (void *)((uintptr_t)p & ~(uintptr_t)(page_size() - 1)); }

/* Another patcher's jump of another form to `to` (x86-64: movabs rax, to; jmp rax;
 * aarch64: ldr x16, #8; br x16; .quad to), in code[]: its length. */
__attribute__((unused)) static size_t other_jump(unsigned char code[16], uintptr_t to) {
    uint64_t at = to;
#if defined(__aarch64__)
    static const unsigned char ldr_br[8] = {0x50, 0x00, 0x00, 0x58, 0x00, 0x02, 0x1f, 0xd6};
    memcpy(code, ldr_br, 8);
    memcpy(code + 8, &at, 8);
    return 16;
#else
    code[0] = 0x48, code[1] = 0xb8;
    memcpy(code + 2, &at, 8);
    code[10] = 0xff, code[11] = 0xe0;
    return 12;
#endif
}

/* A bare munmap system call stub in code[] (x86-64: mov eax, 11; syscall; ret; aarch64:
 * mov x8, #215; svc #0; ret): its length. */
__attribute__((unused)) static size_t munmap_stub(unsigned char code[12]) {
#if defined(__aarch64__)
    static const unsigned char stub[12] = {0xe8, 0x1a, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0xc0, 0x03, 0x5f, 0xd6};
#else
    static const unsigned char stub[8] = {0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0xc3};
#endif
    memcpy(code, stub, sizeof stub);
    return sizeof stub;
}

/* Another patcher's jump over ours to the same place (other_jump), so a munmap call on any
 * thread still works; the page must be writable. */
__attribute__((unused)) static void overwrite(unsigned char *jump, uintptr_t to) {
    unsigned char other[16];
    size_t n = other_jump(other, to);
    memcpy(jump, other, n);
    __builtin___clear_cache((char *)jump, (char *)jump + n);
}

#endif
