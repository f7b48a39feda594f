/* rdma_cm across fork on softroce's librdmacm.so.1 (run through `softroce exec --ip A,B,C`
 * with A B C as argv[1..3]). The parent listens on A, then forks:
 *   1. the child cannot listen on the parent's port of A (EADDRINUSE: the kernel refuses
 *      the bind, softroce's shared device the listen, spec/deviations.toml); it used to
 *      succeed on the parent's copy of the state, whose driver thread did not fork;
 *   2. the child connects C to a listener of its own on B: CONNECT_REQUEST, accept,
 *      ESTABLISHED on both sides, through its own devices and driver threads;
 *   3. after the child exits, the parent's listener on A still takes a connection from C.
 * Prints one line per check and "cm_fork: end N" (N failed checks), exiting with N. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int failed;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		int ok_ = (cond);                                             \
		printf(ok_ ? "ok   " : "FAIL ");                              \
		failed += !ok_;                                               \
		printf(__VA_ARGS__);                                          \
		printf("\n");                                                 \
		fflush(stdout);                                               \
	} while (0)

static struct sockaddr_in in4(const char *ip, int port)
{
	struct sockaddr_in a;

	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* The type of the channel's next event within 5 s (acked, unless `keep` takes it); -1 if
 * none. */
static int next_event(struct rdma_event_channel *ch, struct rdma_cm_event **keep)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int type;

	if (poll(&p, 1, 5000) != 1 || rdma_get_cm_event(ch, &ev))
		return -1;
	type = ev->event;
	if (keep)
		*keep = ev;
	else
		rdma_ack_cm_event(ev);
	return type;
}

static struct ibv_qp_init_attr rc_attr(void)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof attr);
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	return attr;
}

static struct rdma_cm_id *listen_on(struct rdma_event_channel *ch, const char *ip, int port)
{
	struct sockaddr_in a = in4(ip, port);
	struct rdma_cm_id *id = NULL;
	int ok = !rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) &&
		 !rdma_bind_addr(id, (struct sockaddr *)&a) && !rdma_listen(id, 1);

	CHECK(ok, "listen on %s:%d: %s", ip, port,
	      ok ? "listening" : strerror(errno));
	return id;
}

/* Connects `cip` to the listener on `sip`:`port`, whose channel is `sch`, and accepts:
 * checks the events of both sides. */
static void connect_pair(struct rdma_event_channel *sch, const char *who, const char *cip,
			 const char *sip, int port)
{
	struct rdma_event_channel *cch = rdma_create_event_channel();
	struct sockaddr_in src = in4(cip, 0), dst = in4(sip, port);
	struct ibv_qp_init_attr attr = rc_attr();
	struct rdma_conn_param cp;
	struct rdma_cm_event *req = NULL;
	struct rdma_cm_id *c = NULL;

	memset(&cp, 0, sizeof cp);
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (!cch || rdma_create_id(cch, &c, NULL, RDMA_PS_TCP)) {
		CHECK(0, "%s: client id: %s", who, strerror(errno));
		return;
	}
	rdma_resolve_addr(c, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	CHECK(next_event(cch, NULL) == RDMA_CM_EVENT_ADDR_RESOLVED, "%s: ADDR_RESOLVED", who);
	rdma_resolve_route(c, 2000);
	CHECK(next_event(cch, NULL) == RDMA_CM_EVENT_ROUTE_RESOLVED, "%s: ROUTE_RESOLVED", who);
	if (rdma_create_qp(c, NULL, &attr) || rdma_connect(c, &cp)) {
		CHECK(0, "%s: rdma_connect: %s", who, strerror(errno));
		return;
	}
	CHECK(next_event(sch, &req) == RDMA_CM_EVENT_CONNECT_REQUEST, "%s: CONNECT_REQUEST", who);
	if (!req)
		return;
	attr = rc_attr();
	CHECK(!rdma_create_qp(req->id, NULL, &attr) && !rdma_accept(req->id, &cp),
	      "%s: rdma_accept", who);
	rdma_ack_cm_event(req);
	CHECK(next_event(cch, NULL) == RDMA_CM_EVENT_ESTABLISHED, "%s: ESTABLISHED (active)",
	      who);
	CHECK(next_event(sch, NULL) == RDMA_CM_EVENT_ESTABLISHED, "%s: ESTABLISHED (passive)",
	      who);
}

static int child(const char *a, const char *b, const char *c)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in sa = in4(a, 7171);
	struct rdma_cm_id *id = NULL;
	int r;

	CHECK(ch != NULL, "child: rdma_create_event_channel");
	if (!ch)
		return failed;
	/* 1. */
	CHECK(!rdma_create_id(ch, &id, NULL, RDMA_PS_TCP), "child: rdma_create_id");
	errno = 0;
	r = rdma_bind_addr(id, (struct sockaddr *)&sa);
	if (!r)
		r = rdma_listen(id, 1);
	CHECK(r == -1 && errno == EADDRINUSE,
	      "child: rdma_bind_addr + rdma_listen(%s:7171), the parent's port: %s (want EADDRINUSE)",
	      a, r ? strerror(errno) : "listening");
	rdma_destroy_id(id);
	/* 2. */
	listen_on(ch, b, 7172);
	connect_pair(ch, "child", c, b, 7172);
	return failed;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	int status = -1;
	pid_t pid;

	if (argc < 4) {
		fprintf(stderr, "usage: cm_fork A B C (through softroce exec --ip A,B,C)\n");
		return 100;
	}
	ch = rdma_create_event_channel();
	if (!ch || !listen_on(ch, argv[1], 7171))
		return 100;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		int n = child(argv[1], argv[2], argv[3]);

		fflush(stdout);
		_exit(n);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0,
	      "the child's checks passed (status %#x)", status);
	/* 3. */
	connect_pair(ch, "parent", argv[3], argv[1], 7171);
	printf("cm_fork: end %d\n", failed);
	return failed;
}
