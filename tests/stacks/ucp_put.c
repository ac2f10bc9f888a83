// ucp_put: a UCP program that puts patterned data with ucp_put_nbx and verifies every byte at
// the target. One process, one context, two workers (an initiator and a target) connected to
// each other through their worker addresses; with UCX_TLS=rc_verbs,... the puts go over the
// verbs device. The target buffer is mapped once (ucp_mem_map) and its rkey unpacked on the
// initiator's endpoint. Each iteration mallocs a source buffer, fills it with a pattern that
// changes every iteration, clears the target to the pattern's complement, puts, flushes the
// endpoint, checks every byte at the target and frees the source. The source is not mapped
// with ucp_mem_map: UCX registers it per operation (with its own cache off, mrcache must hit).
// Sizes alternate between 64 KiB (a heap block: the same address comes back, a cache can hit)
// and 256 KiB, above glibc's initial mmap threshold: the first is mmapped and unmapped at free
// (a cache must not hand back the old pages); glibc then raises its threshold and serves the
// later ones from the heap.
//
//   ucp_put [ITERATIONS]      exit 0: every byte of every put arrived intact
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#define SMALL 65536
#define LARGE (256 * 1024)

static void check(ucs_status_t st, const char *what) {
  if (st != UCS_OK) {
    fprintf(stderr, "ucp_put: %s: %s\n", what, ucs_status_string(st));
    exit(1);
  }
}

static ucp_worker_h workers[2];

static void progress(void) {
  ucp_worker_progress(workers[0]);
  ucp_worker_progress(workers[1]);
}

// Wait for a request from a *_nbx call, progressing both workers (the target's worker must run
// for the wire-up to finish).
static void wait_req(ucs_status_ptr_t req, const char *what) {
  if (req == NULL) return;
  if (UCS_PTR_IS_ERR(req)) check(UCS_PTR_STATUS(req), what);
  ucs_status_t st;
  while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) progress();
  ucp_request_free(req);
  check(st, what);
}

static uint8_t pattern(int iter, size_t j) { return (uint8_t)(iter * 131 + 17 + j * 7 + (j >> 8)); }

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 40;
  if (iters <= 0) {
    fprintf(stderr, "ucp_put: ITERATIONS must be a positive integer, not '%s'\n", argv[1]);
    return 2;
  }
  ucp_config_t *config;
  check(ucp_config_read(NULL, NULL, &config), "ucp_config_read");
  ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
  ucp_context_h ctx;
  check(ucp_init(&params, config, &ctx), "ucp_init");
  ucp_config_release(config);

  ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                                 .thread_mode = UCS_THREAD_MODE_SINGLE};
  ucp_address_t *addr[2];
  size_t addrlen[2];
  for (int i = 0; i < 2; i++) {
    check(ucp_worker_create(ctx, &wparams, &workers[i]), "ucp_worker_create");
    check(ucp_worker_get_address(workers[i], &addr[i], &addrlen[i]), "ucp_worker_get_address");
  }
  ucp_ep_h ep[2];
  for (int i = 0; i < 2; i++) {
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = addr[1 - i]};
    check(ucp_ep_create(workers[i], &ep_params, &ep[i]), "ucp_ep_create");
  }

  // The target buffer: mapped (registered) once by UCX, as a put's destination must be.
  ucp_mem_map_params_t mparams = {
      .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_FLAGS,
      .address = NULL,
      .length = LARGE,
      .flags = UCP_MEM_MAP_ALLOCATE};
  ucp_mem_h memh;
  check(ucp_mem_map(ctx, &mparams, &memh), "ucp_mem_map");
  ucp_mem_attr_t mattr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
  check(ucp_mem_query(memh, &mattr), "ucp_mem_query");
  volatile uint8_t *target = mattr.address;
  void *rkey_buf;
  size_t rkey_len;
  check(ucp_rkey_pack(ctx, memh, &rkey_buf, &rkey_len), "ucp_rkey_pack");
  ucp_rkey_h rkey;
  check(ucp_ep_rkey_unpack(ep[0], rkey_buf, &rkey), "ucp_ep_rkey_unpack");
  ucp_rkey_buffer_release(rkey_buf);

  ucp_request_param_t rp = {.op_attr_mask = 0};
  for (int it = 0; it < iters; it++) {
    size_t n = it % 2 ? LARGE : SMALL;
    uint8_t *src = malloc(n);
    if (!src) {
      fprintf(stderr, "ucp_put: malloc(%zu) failed\n", n);
      return 1;
    }
    for (size_t j = 0; j < n; j++) src[j] = pattern(it, j);
    for (size_t j = 0; j < n; j++) target[j] = (uint8_t)~pattern(it, j);
    wait_req(ucp_put_nbx(ep[0], src, n, (uint64_t)(uintptr_t)target, rkey, &rp), "ucp_put_nbx");
    wait_req(ucp_ep_flush_nbx(ep[0], &rp), "ucp_ep_flush_nbx");
    for (size_t j = 0; j < n; j++) {
      if (target[j] != pattern(it, j)) {
        fprintf(stderr, "ucp_put: iteration %d (%zu bytes): byte %zu is 0x%02x, want 0x%02x\n", it,
                n, j, target[j], pattern(it, j));
        return 1;
      }
    }
    free(src);
  }

  ucp_rkey_destroy(rkey);
  check(ucp_mem_unmap(ctx, memh), "ucp_mem_unmap");
  for (int i = 0; i < 2; i++) {
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep[i], &cp);
    if (req && !UCS_PTR_IS_ERR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) progress();
      ucp_request_free(req);
    }
  }
  for (int i = 0; i < 2; i++) {
    ucp_worker_release_address(workers[i], addr[i]);
    ucp_worker_destroy(workers[i]);
  }
  ucp_cleanup(ctx);
  printf("ucp_put: %d puts verified (%d x %d + %d x %d bytes)\n", iters, (iters + 1) / 2, SMALL,
         iters / 2, LARGE);
  return 0;
}
