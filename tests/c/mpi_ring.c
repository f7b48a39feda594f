/* A small MPI program for tests/middleware.rs: a token passed around the ring of ranks
 * (each adds its rank), a 1 MiB buffer sent from rank 0 to the last rank (a rendezvous
 * transfer, checked byte by byte), and an MPI_Allreduce of the ranks. Prints
 * "mpi_ring: ok N" from rank 0 when every check passed; any failure aborts with a reason. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define BIG (1 << 20)

static void fail(const char *what, long got, long want)
{
	fprintf(stderr, "mpi_ring: %s: got %ld, want %ld\n", what, got, want);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2)
		fail("ranks", size, 2);

	long token = 0;
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	if (rank == 0) {
		token = 1000;
		MPI_Send(&token, 1, MPI_LONG, next, 7, MPI_COMM_WORLD);
		MPI_Recv(&token, 1, MPI_LONG, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		long want = 1000 + (long)size * (size - 1) / 2;
		if (token != want)
			fail("ring token", token, want);
	} else {
		MPI_Recv(&token, 1, MPI_LONG, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		token += rank;
		MPI_Send(&token, 1, MPI_LONG, next, 7, MPI_COMM_WORLD);
	}

	unsigned char *buf = malloc(BIG);
	if (!buf)
		fail("malloc", 0, BIG);
	if (rank == 0) {
		for (int i = 0; i < BIG; i++)
			buf[i] = (unsigned char)(i * 7 + 3);
		MPI_Send(buf, BIG, MPI_BYTE, size - 1, 8, MPI_COMM_WORLD);
	} else if (rank == size - 1) {
		MPI_Recv(buf, BIG, MPI_BYTE, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		for (int i = 0; i < BIG; i++)
			if (buf[i] != (unsigned char)(i * 7 + 3))
				fail("big buffer byte", buf[i], (unsigned char)(i * 7 + 3));
	}
	free(buf);

	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	long want = (long)size * (size + 1) / 2;
	if (sum != want)
		fail("allreduce", sum, want);

	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_ring: ok %d\n", size);
	MPI_Finalize();
	return 0;
}
