/* rdma_migrate_id of a synchronous id (rdma_create_ep with no channel), as libfabric's verbs
 * provider does for its EQ: the id becomes asynchronous, so rdma_resolve_route returns at
 * once and its ROUTE_RESOLVED comes on the new channel (softroce's id stayed synchronous:
 * the call took its own event and the channel stayed empty, so fi_pingpong -e msg never
 * connected). Then the connection is made through that channel to a listener on
 * argv[1]:7479, the client bound to argv[2]; and migrating back to NULL makes the id
 * synchronous again (a channel of its own). Prints one line per check and "cm_migrate: end N" (N failed checks),
 * exiting with N. Two devices in one process: `softroce exec --ip SERVER,CLIENT`. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int failed;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		int ok_ = (cond);                                             \
		printf(ok_ ? "ok   " : "FAIL ");                              \
		failed += !ok_;                                               \
		printf(__VA_ARGS__);                                          \
		printf("\n");                                                 \
	} while (0)

/* The channel's next event within `ms`; NULL if none. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, ms) != 1 || rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* Waits for an event of type `want` on `ch` (5 s); 1 when it came. */
static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		  struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev = next_event(ch, 5000);
	int ok = ev && ev->event == want;

	if (ev && id)
		*id = ev->id;
	if (ev && !ok)
		printf("     got %s (status %d)\n", rdma_event_str(ev->event), ev->status);
	if (ev)
		rdma_ack_cm_event(ev);
	return ok;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: cm_migrate SERVER_IP CLIENT_IP\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(7479) };
	inet_pton(AF_INET, argv[1], &sa.sin_addr);
	CHECK(sch && cch && rdma_create_id(sch, &lid, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_bind_addr(lid, (struct sockaddr *)&sa) == 0 && rdma_listen(lid, 4) == 0,
	      "listener on %s:7479", argv[1]);

	/* A synchronous id, its address and route resolved by rdma_create_ep. */
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct rdma_addrinfo src_hints = { .ai_port_space = RDMA_PS_TCP,
					   .ai_flags = RAI_PASSIVE }, *src;
	CHECK(rdma_getaddrinfo(argv[2], NULL, &src_hints, &src) == 0, "rdma_getaddrinfo %s",
	      argv[2]);
	hints.ai_src_addr = src->ai_src_addr;
	hints.ai_src_len = src->ai_src_len;
	CHECK(rdma_getaddrinfo(argv[1], "7479", &hints, &res) == 0, "rdma_getaddrinfo %s",
	      argv[1]);
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	CHECK(rdma_create_ep(&id, res, NULL, &qa) == 0, "rdma_create_ep (synchronous, with a QP)");
	CHECK(rdma_migrate_id(id, cch) == 0 && id->channel == cch,
	      "rdma_migrate_id to a channel");

	/* Asynchronous now: the route's event is the channel's. */
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route returns");
	CHECK(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL),
	      "ROUTE_RESOLVED on the new channel (not taken by the call)");

	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect returns");
	struct rdma_cm_id *sid = NULL;
	CHECK(expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &sid) && sid,
	      "the server gets CONNECT_REQUEST");
	int accepted = sid && rdma_create_qp(sid, NULL, &qa) == 0 && rdma_accept(sid, &cp) == 0;
	CHECK(accepted, "rdma_accept");
	CHECK(expect(cch, RDMA_CM_EVENT_ESTABLISHED, NULL), "ESTABLISHED on the new channel");
	CHECK(expect(sch, RDMA_CM_EVENT_ESTABLISHED, NULL), "the server's ESTABLISHED");

	/* Back to synchronous: a channel of its own again. */
	CHECK(rdma_migrate_id(id, NULL) == 0 && id->channel && id->channel != cch,
	      "rdma_migrate_id to NULL: a channel of its own");

	rdma_destroy_qp(sid);
	rdma_destroy_id(sid);
	rdma_destroy_ep(id);
	rdma_destroy_id(lid);
	rdma_freeaddrinfo(res);
	rdma_freeaddrinfo(src);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	printf("cm_migrate: end %d\n", failed);
	return failed;
}
