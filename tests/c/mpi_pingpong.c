/* An MPI ping-pong between two ranks for the interop suite's MPI scenarios
 * (tests/interop_rxe.rs): for each SIZE:ITERS argument, rank 0 sends ITERS messages of SIZE
 * bytes to rank 1, which checks each one and answers with a message of its own that rank 0
 * checks. Every message has a pattern of its own (sender, size, iteration), and every
 * receive buffer is poisoned before the receive, so a message that did not arrive, arrived
 * short or arrived twice fails the check. Sizes above UCX's rendezvous threshold go by
 * rendezvous (zero copy), the small ones eagerly.
 *
 * Prints "mpi_pingpong: rank R of N on HOST" from each rank at the start, and from rank 0,
 * once the last answer of a size arrived (rank 1 checks a message before it answers),
 * "mpi_pingpong: ok SIZE B x ITERS, round trip avg U us"; any failure aborts with a reason.
 * Default sizes: 8:200 4096:100 262144:20. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POISON 0xa5

static void fail(const char *what, long size, long iter, long got, long want)
{
	fprintf(stderr, "mpi_pingpong: %s (size %ld, iteration %ld): got %ld, want %ld\n", what,
		size, iter, got, want);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Byte k of the message that rank `from` sends in iteration `iter` of size `size`. */
static unsigned char pattern(int from, long size, long iter, long k)
{
	return (unsigned char)(k * 7 + iter * 13 + from * 101 + size * 3 + 1);
}

static void fill(unsigned char *buf, int from, long size, long iter)
{
	for (long k = 0; k < size; k++)
		buf[k] = pattern(from, size, iter, k);
}

/* Receives the message of `from` (tag `tag`) into a poisoned `buf` and checks its length
 * and every byte. */
static void recv_check(unsigned char *buf, int from, int tag, long size, long iter)
{
	MPI_Status st;
	int count;
	memset(buf, POISON, size);
	MPI_Recv(buf, (int)size, MPI_BYTE, from, tag, MPI_COMM_WORLD, &st);
	MPI_Get_count(&st, MPI_BYTE, &count);
	if (count != size)
		fail("received length", size, iter, count, size);
	if (st.MPI_SOURCE != from)
		fail("source rank", size, iter, st.MPI_SOURCE, from);
	for (long k = 0; k < size; k++)
		if (buf[k] != pattern(from, size, iter, k))
			fail("byte", size, iter, buf[k], pattern(from, size, iter, k));
}

int main(int argc, char **argv)
{
	static char *defaults[] = {"8:200", "4096:100", "262144:20"};
	int rank, nranks;
	char host[256] = "";
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (nranks != 2)
		fail("ranks", 0, 0, nranks, 2);
	gethostname(host, sizeof(host) - 1);
	printf("mpi_pingpong: rank %d of %d on %s\n", rank, nranks, host);
	fflush(stdout);

	char **specs = argc > 1 ? argv + 1 : defaults;
	int nspecs = argc > 1 ? argc - 1 : 3;
	for (int s = 0; s < nspecs; s++) {
		long size, iters;
		if (sscanf(specs[s], "%ld:%ld", &size, &iters) != 2 || size < 1 || size > (1L << 30) ||
		    iters < 1) {
			fprintf(stderr, "mpi_pingpong: bad argument %s (want SIZE:ITERS)\n", specs[s]);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
		unsigned char *out = malloc(size), *in = malloc(size);
		if (!out || !in)
			fail("malloc", size, 0, 0, size);
		int tag = 100 + s;
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long i = 0; i < iters; i++) {
			fill(out, rank, size, i);
			if (rank == 0) {
				MPI_Send(out, (int)size, MPI_BYTE, 1, tag, MPI_COMM_WORLD);
				recv_check(in, 1, tag, size, i);
			} else {
				recv_check(in, 0, tag, size, i);
				MPI_Send(out, (int)size, MPI_BYTE, 0, tag, MPI_COMM_WORLD);
			}
		}
		double us = (MPI_Wtime() - t0) * 1e6 / (double)iters;
		if (rank == 0) {
			printf("mpi_pingpong: ok %ld B x %ld, round trip avg %.1f us\n", size, iters, us);
			fflush(stdout);
		}
		free(out);
		free(in);
	}
	MPI_Finalize();
	return 0;
}
