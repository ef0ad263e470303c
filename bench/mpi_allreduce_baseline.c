/* OpenMPI's allreduce as a peer for bench/shm_bench and collectives_bench (measurement only: the
 * library never depends on MPI). float32 sum, MPI_IN_PLACE, per size the median over rounds of
 * the mean op time in a round (the same scheme as shm_bench), with nccl-tests' busbw.
 *
 *   mpirun -np 2 ./mpi_allreduce_baseline [rounds] [size ...]
 *
 * With ADAPTCOMM_MPI_PER_OP=<iters> in the environment it times ops as `adaptcomm bench` does
 * instead (bench/protect_cost.sh compares the two): per iteration the input is refilled, the ranks
 * meet in a barrier, one allreduce is timed, and the slowest rank's time counts; it prints the
 * median over iterations (`rounds` is then ignored).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int Iterations(size_t bytes) {
  return bytes <= (256u << 10) ? 200 : bytes <= (4u << 20) ? 20 : 4;
}

static int Compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* `adaptcomm bench`'s scheme (tools/bench_cmd.cc): refill, barrier, one op, the slowest rank. */
static double PerOpMedian(float* data, size_t n, int iters) {
  double* t = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < n; ++j) data[j] = 1.0f;
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t[i] = (MPI_Wtime() - start) * 1e6;
  }
  MPI_Allreduce(MPI_IN_PLACE, t, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  qsort(t, iters, sizeof(double), Compare);
  const double median = t[iters / 2];
  free(t);
  return median;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rounds = argc > 1 ? atoi(argv[1]) : 6;
  if (rounds < 1) rounds = 1;
  size_t defaults[] = {4096, 262144, 4u << 20, 64u << 20};
  int nsizes = argc > 2 ? argc - 2 : 4;
  for (int s = 0; s < nsizes; ++s) {
    const size_t bytes = argc > 2 ? (size_t)strtoull(argv[s + 2], NULL, 10) : defaults[s];
    const size_t n = bytes / sizeof(float);
    float* data = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) data[i] = 1.0f;
    const int iters = Iterations(bytes);
    const char* per_op = getenv("ADAPTCOMM_MPI_PER_OP");
    if (per_op != NULL && atoi(per_op) > 0) {
      for (int w = 0; w < 5; ++w) {
        MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      const double us = PerOpMedian(data, n, atoi(per_op));
      if (rank == 0) {
        printf("%d ranks %10zu B  mpi %10.1f us (per op)\n", world, bytes, us);
        fflush(stdout);
      }
      free(data);
      continue;
    }
    double* t = malloc(sizeof(double) * rounds);
    for (int w = 0; w < 2; ++w) {
      MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    for (int r = 0; r < rounds; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double start = MPI_Wtime();
      for (int i = 0; i < iters; ++i) {
        MPI_Allreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
      t[r] = (MPI_Wtime() - start) / iters * 1e6;
    }
    qsort(t, rounds, sizeof(double), Compare);
    if (rank == 0) {
      const double us = t[rounds / 2];
      const double f = 2.0 * (world - 1) / world;
      printf("%d ranks %10zu B  mpi %10.1f us %7.3f GB/s busbw\n", world, bytes, us,
             bytes / us / 1e3 * f);
      fflush(stdout);
    }
    free(t);
    free(data);
  }
  MPI_Finalize();
  return 0;
}
