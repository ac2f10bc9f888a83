// fi_regmsg: a libfabric program that registers every message's buffers itself and verifies
// the data. Two RDM endpoints (verbs;ofi_rxm by default) in one process send to each other;
// each iteration mallocs a send and a receive buffer, registers both with fi_mr_reg, sends,
// checks every byte received, closes the registrations and frees the buffers. Sizes alternate
// between a heap block (the same address comes back: a registration cache can hit) and one
// above the mmap threshold (unmapped at free, mapped again: a cache must not hand back the old
// pages). Rendezvous sizes make rxm move the data with RDMA reads through the registrations.
//
//   fi_regmsg [ITERATIONS] [PROVIDER]      exit 0: every message arrived intact
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    int r_ = (int)(call);                                                                \
    if (r_) {                                                                            \
      fprintf(stderr, "fi_regmsg: %s: %s (%d)\n", #call, fi_strerror(-r_), r_);          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

struct side {
  struct fid_ep *ep;
  struct fid_cq *cq;
  struct fid_av *av;
  fi_addr_t peer;
  char name[256];
  size_t namelen;
};

static struct fid_domain *domain;

static void open_side(struct fi_info *info, struct side *s) {
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 64};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 4};
  CHECK(fi_endpoint(domain, info, &s->ep, NULL));
  CHECK(fi_cq_open(domain, &cq_attr, &s->cq, NULL));
  CHECK(fi_av_open(domain, &av_attr, &s->av, NULL));
  CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
  CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
  CHECK(fi_enable(s->ep));
  s->namelen = sizeof s->name;
  CHECK(fi_getname(&s->ep->fid, s->name, &s->namelen));
}

static void connect_to(struct side *s, const struct side *peer) {
  if (fi_av_insert(s->av, peer->name, 1, &s->peer, 0, NULL) != 1) {
    fprintf(stderr, "fi_regmsg: fi_av_insert failed\n");
    exit(1);
  }
}

// Poll both completion queues (rxm makes progress, including its connection set-up, only
// when they are read) until `*done` reaches `want`.
static int tx_done, rx_done;
static void progress(struct side *a, struct side *b) {
  struct side *sides[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    struct fi_cq_entry e;
    ssize_t n = fi_cq_read(sides[k]->cq, &e, 1);
    if (n == 1) {
      if (e.op_context == &tx_done) tx_done++;
      else if (e.op_context == &rx_done) rx_done++;
    } else if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      fi_cq_readerr(sides[k]->cq, &err, 0);
      fprintf(stderr, "fi_regmsg: completion error: %s (prov %d)\n", fi_strerror(err.err),
              err.prov_errno);
      exit(1);
    } else if (n != -FI_EAGAIN) {
      fprintf(stderr, "fi_regmsg: fi_cq_read: %s\n", fi_strerror((int)-n));
      exit(1);
    }
  }
}

static unsigned char pattern(unsigned iter, size_t i) {
  return (unsigned char)((iter * 131u + i * 7u + (i >> 12)) ^ 0x5a);
}

int main(int argc, char **argv) {
  unsigned iterations = argc > 1 ? (unsigned)atoi(argv[1]) : 100;
  const char *prov = argc > 2 ? argv[2] : "verbs;ofi_rxm";
  static const size_t sizes[] = {64 << 10, 512 << 10, 96 << 10, 300 << 10};

  struct fi_info *hints = fi_allocinfo(), *info;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov);
  CHECK(fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info));
  struct fid_fabric *fabric;
  CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
  CHECK(fi_domain(fabric, info, &domain, NULL));
  printf("fi_regmsg: provider %s, domain %s, mr_mode 0x%x\n", info->fabric_attr->prov_name,
         info->domain_attr->name, (unsigned)info->domain_attr->mr_mode);

  struct side a = {0}, b = {0};
  open_side(info, &a);
  open_side(info, &b);
  connect_to(&a, &b);
  connect_to(&b, &a);

  unsigned long long bytes = 0;
  for (unsigned it = 0; it < iterations; it++) {
    size_t len = sizes[it % (sizeof sizes / sizeof sizes[0])];
    unsigned char *sbuf = malloc(len), *rbuf = malloc(len);
    if (!sbuf || !rbuf) { fprintf(stderr, "fi_regmsg: malloc failed\n"); return 1; }
    for (size_t i = 0; i < len; i++) sbuf[i] = pattern(it, i);
    memset(rbuf, 0, len);
    struct fid_mr *smr, *rmr;
    CHECK(fi_mr_reg(domain, sbuf, len, FI_SEND, 0, 0, 0, &smr, NULL));
    CHECK(fi_mr_reg(domain, rbuf, len, FI_RECV, 0, 0, 0, &rmr, NULL));
    tx_done = rx_done = 0;
    ssize_t r;
    while ((r = fi_recv(b.ep, rbuf, len, fi_mr_desc(rmr), b.peer, &rx_done)) == -FI_EAGAIN)
      progress(&a, &b);
    CHECK(r);
    while ((r = fi_send(a.ep, sbuf, len, fi_mr_desc(smr), a.peer, &tx_done)) == -FI_EAGAIN)
      progress(&a, &b);
    CHECK(r);
    while (tx_done < 1 || rx_done < 1) progress(&a, &b);
    for (size_t i = 0; i < len; i++) {
      if (rbuf[i] != pattern(it, i)) {
        fprintf(stderr, "fi_regmsg: iteration %u (%zu bytes): byte %zu is 0x%02x, want 0x%02x\n",
                it, len, i, rbuf[i], pattern(it, i));
        return 1;
      }
    }
    bytes += len;
    CHECK(fi_close(&smr->fid));
    CHECK(fi_close(&rmr->fid));
    free(sbuf);
    free(rbuf);
  }
  printf("fi_regmsg: %u messages, %llu bytes, every byte verified\n", iterations, bytes);
  fi_close(&a.ep->fid);
  fi_close(&b.ep->fid);
  fi_close(&a.cq->fid);
  fi_close(&b.cq->fid);
  fi_close(&a.av->fid);
  fi_close(&b.av->fid);
  fi_close(&domain->fid);
  fi_close(&fabric->fid);
  fi_freeinfo(info);
  fi_freeinfo(hints);
  return 0;
}
