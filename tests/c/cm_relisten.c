/* A listener replaced between two connections, as perftest -R does (it destroys its control
 * connection's listener, then listens on the same port for the data connection): a REQ that
 * comes in between waits for the new listener instead of being refused; once nobody has
 * listened for softroce's linger (3 s) a REQ gets REJ 8 (invalid service ID), the kernel's
 * answer when nobody listens. Two devices in one process: argv[1] (server), argv[2]
 * (client), through `softroce exec --ip SERVER,CLIENT`. Prints one line per check and
 * "cm_relisten: end N" (N failed checks), exiting with N. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static int failed;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		printf((cond) ? "ok   " : "FAIL ");                           \
		failed += !(cond);                                            \
		printf(__VA_ARGS__);                                          \
		printf("\n");                                                 \
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

/* The channel's next event within `ms`; NULL if none. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

static struct rdma_cm_id *listener(struct rdma_event_channel *ch, const char *ip, int port)
{
	struct sockaddr_in a = in4(ip, port);
	struct rdma_cm_id *id;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_bind_addr(id, (struct sockaddr *)&a) ||
	    rdma_listen(id, 1)) {
		perror("listener");
		exit(100);
	}
	return id;
}

/* A client id from `cip` to `sip`:`port` with an RC QP, connected (REQ sent). */
static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, const char *cip,
				     const char *sip, int port)
{
	struct sockaddr_in src = in4(cip, 0), dst = in4(sip, port);
	struct ibv_qp_init_attr attr;
	struct rdma_conn_param cp;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	rdma_create_id(ch, &id, NULL, RDMA_PS_TCP);
	rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000);
	if ((ev = next_event(ch, 5000)))
		rdma_ack_cm_event(ev);
	rdma_resolve_route(id, 2000);
	if ((ev = next_event(ch, 5000)))
		rdma_ack_cm_event(ev);
	memset(&attr, 0, sizeof attr);
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, NULL, &attr)) {
		perror("rdma_create_qp");
		exit(100);
	}
	memset(&cp, 0, sizeof cp);
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(id, &cp)) {
		perror("rdma_connect");
		exit(100);
	}
	return id;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *sch = rdma_create_event_channel(),
				  *cch = rdma_create_event_channel();
	struct rdma_cm_id *l1, *l2, *c1, *c2;
	struct rdma_cm_event *ev;
	const char *sip, *cip;
	int port = 7161;

	if (argc < 3 || !sch || !cch) {
		fprintf(stderr, "usage: cm_relisten SERVER_IP CLIENT_IP (through softroce exec)\n");
		return 100;
	}
	sip = argv[1];
	cip = argv[2];

	/* The first listener goes away; a REQ comes before the second one listens. */
	l1 = listener(sch, sip, port);
	rdma_destroy_id(l1);
	c1 = connect_to(cch, cip, sip, port);
	ev = next_event(cch, 300);
	CHECK(!ev, "REQ between two listeners: no answer yet (%s)",
	      ev ? rdma_event_str(ev->event) : "none");
	if (ev)
		rdma_ack_cm_event(ev);
	l2 = listener(sch, sip, port);
	ev = next_event(sch, 5000);
	CHECK(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id == l2,
	      "the new listener gets it: %s", ev ? rdma_event_str(ev->event) : "none");
	if (ev) {
		struct rdma_cm_id *conn = ev->id;

		rdma_ack_cm_event(ev);
		rdma_reject(conn, NULL, 0);
		rdma_destroy_id(conn);
	}
	ev = next_event(cch, 5000);
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->status == 28,
	      "client: %s status %d (the server's rdma_reject)",
	      ev ? rdma_event_str(ev->event) : "none", ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_qp(c1);
	rdma_destroy_id(c1);

	/* Nobody listens for longer than the linger: the kernel's REJ 8. */
	rdma_destroy_id(l2);
	sleep(4);
	c2 = connect_to(cch, cip, sip, port);
	ev = next_event(cch, 5000);
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->status == 8,
	      "after the linger: %s status %d", ev ? rdma_event_str(ev->event) : "none",
	      ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_qp(c2);
	rdma_destroy_id(c2);

	/* A channel destroyed twice, then used: EBADF, nothing read from freed memory. */
	rdma_destroy_event_channel(cch);
	errno = 0;
	rdma_destroy_event_channel(cch);
	CHECK(errno == EBADF, "channel destroyed twice: errno %d", errno);
	CHECK(rdma_get_cm_event(cch, &ev) == -1 && errno == EBADF,
	      "event from a destroyed channel: EBADF (errno %d)", errno);

	rdma_destroy_event_channel(sch);
	printf("cm_relisten: end %d\n", failed);
	return failed;
}
