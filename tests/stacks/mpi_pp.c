// mpi_pp: a ping-pong between ranks 0 and 1 and an allreduce over all ranks, on buffers
// malloc'd, used and freed in every iteration, every value checked. Sizes cycle from eager
// to rendezvous and above the mmap threshold, so a registration cache sees the same heap
// address again (it can hit) and memory unmapped and mapped again (it must not hit stale).
//
//   mpi_pp [ITERATIONS]     exit 0 on every rank: every byte and every sum verified
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(int iter, int who, size_t i) {
  return (unsigned char)((iter * 37 + who * 101 + i * 13 + (i >> 12)) ^ 0xa5);
}

static void fail(int rank, const char *what, int iter, size_t at, long got, long want) {
  fprintf(stderr, "mpi_pp: rank %d: %s, iteration %d, element %zu: got %ld, want %ld\n", rank,
          what, iter, at, got, want);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
  int iterations = argc > 1 ? atoi(argv[1]) : 40;
  static const size_t sizes[] = {4 << 10, 64 << 10, 256 << 10, 1 << 20, 96 << 10};
  int rank, nranks;
  // A fixed trim threshold: freeing a buffer at the top of the heap does not give the pages
  // back (whether it would depends on what else the MPI allocated, so hits would vary from
  // run to run), and it stops glibc raising its mmap threshold, so the 256 KiB and 1 MiB
  // buffers stay mmapped: unmapped at every free and mapped again.
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  if (nranks < 2) {
    fprintf(stderr, "mpi_pp: needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  unsigned long long bytes = 0;
  for (int it = 0; it < iterations; it++) {
    size_t len = sizes[it % (sizeof sizes / sizeof sizes[0])];

    // Ping-pong: rank 0 sends its pattern, rank 1 checks it and answers with its own.
    if (rank < 2) {
      unsigned char *buf = malloc(len);
      if (!buf) MPI_Abort(MPI_COMM_WORLD, 3);
      if (rank == 0) {
        for (size_t i = 0; i < len; i++) buf[i] = pattern(it, 0, i);
        MPI_Send(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD);
        memset(buf, 0, len);
        MPI_Recv(buf, (int)len, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < len; i++)
          if (buf[i] != pattern(it, 1, i)) fail(rank, "pong", it, i, buf[i], pattern(it, 1, i));
      } else {
        memset(buf, 0, len);
        MPI_Recv(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < len; i++)
          if (buf[i] != pattern(it, 0, i)) fail(rank, "ping", it, i, buf[i], pattern(it, 0, i));
        for (size_t i = 0; i < len; i++) buf[i] = pattern(it, 1, i);
        MPI_Send(buf, (int)len, MPI_BYTE, 0, it, MPI_COMM_WORLD);
      }
      bytes += 2 * len;
      free(buf);
    }

    // Allreduce: element k of rank r is r * k + it; the sum is known in closed form.
    size_t n = len / sizeof(long);
    long *in = malloc(n * sizeof(long)), *out = malloc(n * sizeof(long));
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 3);
    for (size_t k = 0; k < n; k++) in[k] = (long)rank * (long)k + it, out[k] = -1;
    MPI_Allreduce(in, out, (int)n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long ranks = nranks;
    for (size_t k = 0; k < n; k++) {
      long want = (long)k * ranks * (ranks - 1) / 2 + (long)it * ranks;
      if (out[k] != want) fail(rank, "allreduce", it, k, out[k], want);
    }
    bytes += n * sizeof(long);
    free(in);
    free(out);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  printf("mpi_pp: rank %d of %d: %d iterations, %llu bytes, all verified\n", rank, nranks,
         iterations, bytes);
  fflush(stdout); // a crash inside MPI_Finalize must not take the line with it
  MPI_Finalize();
  return 0;
}
