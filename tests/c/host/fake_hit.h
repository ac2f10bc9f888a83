/* The fake provider and helpers shared by fast_hit.c and rev_hit.c: ibv_context ops that
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
            live[i] = NULL;
            free(mr);
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

/* Our jump at libc's munmap entry (after an endbr64, if any): a `jmp rel32` to our hook or
 * to a trampoline leading there; *to: where it leads. NULL: munmap is not patched. */
__attribute__((unused)) static unsigned char *our_jump(uintptr_t *to) {
    unsigned char *f = dlsym(dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY), "munmap");
    for (int at = 0; f && at <= 4; at += 4)
        if (f[at] == 0xe9) {
            int32_t rel;
            memcpy(&rel, f + at + 1, 4);
            *to = (uintptr_t)(f + at + 5) + rel;
            return f + at;
        }
    return NULL;
}

__attribute__((unused)) static void *page_of(void *p) { return (void *)((uintptr_t)p & ~(uintptr_t)4095); }

/* Another patcher's jump of another form to the same place (movabs rax, to; jmp rax), so a
 * munmap call on any thread still works; the page must be writable. */
__attribute__((unused)) static void overwrite(unsigned char *jump, uintptr_t to) {
    unsigned char other[12] = {0x48, 0xb8};
    memcpy(other + 2, &to, 8);
    other[10] = 0xff, other[11] = 0xe0;
    memcpy(jump, other, sizeof other);
    __builtin___clear_cache((char *)jump, (char *)jump + sizeof other);
}

#endif
