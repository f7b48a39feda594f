/* A forked child and its parent's devices on softroce's libibverbs.so.1 (run through
 * `softroce exec --ip A,B`): rdma-core requires a child to open the devices it uses itself,
 * and a softroce device is shared by every process of the host, as rxe0 is
 * (softroce::net::share), so
 *   1. while the parent holds softroce0, the child opens it too, and it answers
 *      ibv_query_port (it used to hand the child the parent's device, whose driver thread
 *      did not fork; before devices were shared, the open failed with EADDRINUSE);
 *   2. once the parent closes it, the parent can open it again while the child lives (the
 *      child's copy of the parent's socket used to keep the port bound: EADDRINUSE);
 *   3. after the parent closed it again, the child opens softroce0 itself, and the device
 *      answers ibv_query_port.
 * The child also opens softroce1 (which the parent never opened) and queries it. Prints one
 * line per check and "all passed" when every check passed, exiting 0. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int failed;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		int ok_ = (cond);                                             \
		printf(ok_ ? "ok   " : "FAIL ");                              \
		printf(__VA_ARGS__);                                          \
		printf("\n");                                                 \
		fflush(stdout);                                               \
		if (!ok_)                                                     \
			failed++;                                             \
	} while (0)

/* Opens `dev` and checks that its port 1 is active; closes it unless `keep`. */
static struct ibv_context *open_and_query(struct ibv_device *dev, const char *who, int keep)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_port_attr pa;

	CHECK(ctx != NULL, "%s: ibv_open_device(%s): %s", who, ibv_get_device_name(dev),
	      ctx ? "opened" : strerror(errno));
	if (!ctx)
		return NULL;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE,
	      "%s: ibv_query_port(%s): active", who, ibv_get_device_name(dev));
	if (!keep) {
		CHECK(ibv_close_device(ctx) == 0, "%s: ibv_close_device(%s)", who,
		      ibv_get_device_name(dev));
		return NULL;
	}
	return ctx;
}

static void step(int fd)
{
	char c = 1;

	if (write(fd, &c, 1) != 1)
		failed++;
}

static void await_step(int fd)
{
	char c;

	if (read(fd, &c, 1) != 1)
		failed++;
}

static int child(struct ibv_device *dev0, struct ibv_device *dev1, int in, int out)
{

	/* 1. the parent holds softroce0 */
	open_and_query(dev0, "child (the parent holding it)", 0);
	open_and_query(dev1, "child", 0);
	step(out);
	/* 2. happens in the parent; 3. */
	await_step(in);
	open_and_query(dev0, "child", 0);
	return failed;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	int n, to_child[2], to_parent[2], status;
	pid_t pid;

	list = ibv_get_device_list(&n);
	if (!list || n < 2) {
		printf("FAIL want two devices (softroce exec --ip A,B)\n");
		return 1;
	}
	ctx = open_and_query(list[0], "parent", 1);
	if (!ctx || pipe(to_child) || pipe(to_parent)) {
		printf("FAIL setup\n");
		return 1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		printf("FAIL fork: %s\n", strerror(errno));
		return 1;
	}
	if (pid == 0)
		_exit(child(list[0], list[1], to_child[0], to_parent[1]));
	await_step(to_parent[0]);
	/* 2. */
	CHECK(ibv_close_device(ctx) == 0, "parent: ibv_close_device(softroce0)");
	open_and_query(list[0], "parent (the child alive)", 0);
	step(to_child[1]);
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child's checks passed (status %#x)", status);
	/* The child closed softroce0 and exited: the parent opens it once more. */
	open_and_query(list[0], "parent (after the child)", 0);
	ibv_free_device_list(list);
	if (failed)
		printf("%d failed\n", failed);
	else
		printf("all passed\n");
	return failed != 0;
}
