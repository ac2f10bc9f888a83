/* UCX's memory hooks in a test process (libucm): ucm_watch_install() asks UCM for
 * VM_UNMAPPED events, which installs its mmap hooks in the mode UCX_MEM_MMAP_HOOK_MODE
 * names (bistro: jumps written over libc's entry points; reloc: GOT entries). With
 * UCM_WATCH_EARLY=1 it does so from this library's constructor, which runs before
 * libmrcache.so's (a dependency of the program, loaded after the preload), so UCX's jumps
 * are in libc before mrcache patches it; otherwise the program calls it from main, after.
 * ucm_watch_inside, when set, runs once from inside the handler (at the first event for
 * the watched range): memory released there must reach UCX (ucm_watch_nested_events) and
 * mrcache as well. */
#include <stdio.h>
#include <stdlib.h>
#include <ucm/api/ucm.h>

char *ucm_watch_lo, *ucm_watch_hi;
int ucm_watch_events;
char *ucm_watch_nested_lo, *ucm_watch_nested_hi;
int ucm_watch_nested_events;
void (*ucm_watch_inside)(void);

static void on_unmap(ucm_event_type_t type, ucm_event_t *ev, void *arg) {
    (void)type, (void)arg;
    char *a = ev->vm_unmapped.address;
    char *end = a + ev->vm_unmapped.size;
    if (a < ucm_watch_nested_hi && end > ucm_watch_nested_lo)
        ucm_watch_nested_events++;
    if (a < ucm_watch_hi && end > ucm_watch_lo) {
        ucm_watch_events++;
        void (*inside)(void) = ucm_watch_inside;
        ucm_watch_inside = NULL;
        if (inside)
            inside();
    }
}

int ucm_watch_install(void) {
    return ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, on_unmap, NULL) == UCS_OK ? 0 : -1;
}

__attribute__((constructor)) static void early(void) {
    const char *e = getenv("UCM_WATCH_EARLY");
    if (e && *e == '1' && ucm_watch_install() != 0) {
        fprintf(stderr, "FAIL: UCM could not install its memory hooks (constructor)\n");
        exit(4);
    }
}
