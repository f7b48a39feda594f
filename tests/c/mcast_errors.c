/* rdma_join_multicast / rdma_join_multicast_ex / rdma_leave_multicast on softroce: what a
 * program sees, as with librdmacm over kernel rxe (see crates/softroce-rdmacm/src/cma/mcast.rs
 * for the sources). Run through `softroce exec --ip LOCAL` with LOCAL as argv[1] (an address
 * of 127.0.160.0/24); prints one line per check and "mcast_errors: end N" (N failed checks),
 * exiting with N. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int failed;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		if (cond) {                                                   \
			printf("ok   ");                                      \
		} else {                                                      \
			printf("FAIL ");                                      \
			failed++;                                             \
		}                                                             \
		printf(__VA_ARGS__);                                          \
		printf("\n");                                                 \
	} while (0)

/* -1 with errno `e` */
#define FAILS_WITH(ret, e) ((ret) == -1 && errno == (e))

static struct sockaddr_in in4(const char *ip)
{
	struct sockaddr_in a;

	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* The channel's next event within 5 s; NULL if none. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, 5000) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* A UDP id bound to `ip`, with a UD QP when `qp` is set. */
static struct rdma_cm_id *bound_ud(struct rdma_event_channel *ch, const char *ip, int qp)
{
	struct sockaddr_in a = in4(ip);
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) ||
	    rdma_bind_addr(id, (struct sockaddr *)&a)) {
		perror("create/bind");
		exit(100);
	}
	if (qp) {
		memset(&attr, 0, sizeof attr);
		attr.qp_type = IBV_QPT_UD;
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		if (rdma_create_qp(id, NULL, &attr)) {
			perror("rdma_create_qp");
			exit(100);
		}
	}
	return id;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct sockaddr_in group = in4("239.160.0.7"), any = in4("0.0.0.0"),
			   zeronet = in4("0.1.2.3"), lo = in4("127.0.160.99"),
			   other = in4("239.160.0.8");
	struct sockaddr_in6 g6;
	struct rdma_cm_join_mc_attr_ex ex;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id, *tcp, *unbound, *wild;
	union ibv_gid mgid;
	char buf[64];
	int ctx_tag, ret;
	const char *local;

	if (argc < 2 || !ch) {
		fprintf(stderr, "usage: mcast_errors LOCAL_IP (through softroce exec)\n");
		return 100;
	}
	local = argv[1];

	/* An id without a device: not bound, or bound to the wildcard address. */
	rdma_create_id(ch, &unbound, NULL, RDMA_PS_UDP);
	ret = rdma_join_multicast(unbound, (struct sockaddr *)&group, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join on an unbound id: EINVAL (ret %d errno %d)", ret, errno);
	rdma_create_id(ch, &wild, NULL, RDMA_PS_UDP);
	rdma_bind_addr(wild, (struct sockaddr *)&any);
	ret = rdma_join_multicast(wild, (struct sockaddr *)&group, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join on a wildcard-bound id: EINVAL (ret %d errno %d)", ret, errno);

	/* RDMA_PS_TCP: an RC id cannot join. */
	rdma_create_id(ch, &tcp, NULL, RDMA_PS_TCP);
	{
		struct sockaddr_in a = in4(local);
		rdma_bind_addr(tcp, (struct sockaddr *)&a);
	}
	ret = rdma_join_multicast(tcp, (struct sockaddr *)&group, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join on an RDMA_PS_TCP id: EINVAL (ret %d errno %d)", ret, errno);

	id = bound_ud(ch, local, 1);

	/* Addresses. */
	ret = rdma_join_multicast(id, NULL, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join NULL address: EINVAL (errno %d)", errno);
	ret = rdma_join_multicast(id, (struct sockaddr *)&any, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join 0.0.0.0: EINVAL (errno %d)", errno);
	ret = rdma_join_multicast(id, (struct sockaddr *)&zeronet, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join 0.1.2.3: EINVAL (errno %d)", errno);
	memset(&g6, 0, sizeof g6);
	g6.sin6_family = AF_INET6;
	inet_pton(AF_INET6, "ff0e::160:1", &g6.sin6_addr);
	ret = rdma_join_multicast(id, (struct sockaddr *)&g6, NULL);
	CHECK(FAILS_WITH(ret, 524), "join IPv6 group on RoCE v2: errno 524 (errno %d)", errno);

	/* rdma_join_multicast_ex's own checks. */
	ex.addr = (struct sockaddr *)&group;
	ex.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	ret = rdma_join_multicast_ex(id, &ex, NULL);
	CHECK(FAILS_WITH(ret, ENOTSUP), "join_ex comp_mask RESERVED: ENOTSUP (errno %d)", errno);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
	ret = rdma_join_multicast_ex(id, &ex, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join_ex without JOIN_FLAGS: EINVAL (errno %d)", errno);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ret = rdma_join_multicast_ex(id, &ex, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join_ex without ADDRESS: EINVAL (errno %d)", errno);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ex.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
	ret = rdma_join_multicast_ex(id, &ex, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "join_ex flags RESERVED: EINVAL (errno %d)", errno);

	/* Leave what was never joined. */
	ret = rdma_leave_multicast(id, (struct sockaddr *)&group);
	CHECK(FAILS_WITH(ret, EADDRNOTAVAIL), "leave not joined: EADDRNOTAVAIL (errno %d)", errno);
	ret = rdma_leave_multicast(id, NULL);
	CHECK(FAILS_WITH(ret, EINVAL), "leave NULL: EINVAL (errno %d)", errno);

	/* A full join: MULTICAST_JOIN with the group's AH, DestQP 0xFFFFFF, rdma_cm's Q_Key and
	 * the context; the QP is attached once the event is taken. */
	ret = rdma_join_multicast(id, (struct sockaddr *)&group, &ctx_tag);
	CHECK(ret == 0, "join 239.160.0.7: 0 (ret %d errno %d)", ret, errno);
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0 && ev->id == id,
	      "event %s status %d", ev ? rdma_event_str(ev->event) : "none", ev ? ev->status : 0);
	if (!ev)
		return 100;
	inet_ntop(AF_INET6, ev->param.ud.ah_attr.grh.dgid.raw, buf, sizeof buf);
	CHECK(!strcmp(buf, "::ffff:239.160.0.7"), "dgid %s", buf);
	CHECK(ev->param.ud.private_data == &ctx_tag && ev->param.ud.private_data_len == 0,
	      "private_data is the context");
	CHECK(ev->param.ud.qp_num == 0xffffff && ev->param.ud.qkey == 0x01234567,
	      "qp_num 0x%x qkey 0x%x", ev->param.ud.qp_num, ev->param.ud.qkey);
	CHECK(ev->param.ud.ah_attr.is_global == 1 && ev->param.ud.ah_attr.grh.hop_limit == 64 &&
	      ev->param.ud.ah_attr.dlid == 0 && ev->param.ud.ah_attr.sl == 0 &&
	      ev->param.ud.ah_attr.port_num == 1,
	      "ah_attr is_global %d hop_limit %d dlid %d sl %d port %d",
	      ev->param.ud.ah_attr.is_global, ev->param.ud.ah_attr.grh.hop_limit,
	      ev->param.ud.ah_attr.dlid, ev->param.ud.ah_attr.sl, ev->param.ud.ah_attr.port_num);
	mgid = ev->param.ud.ah_attr.grh.dgid;
	rdma_ack_cm_event(ev);
	/* Attached: a second attach is a no-op, a detach succeeds; attach again for the leave. */
	ret = ibv_detach_mcast(id->qp, &mgid, 0);
	CHECK(ret == 0, "QP attached after the event (detach: %d)", ret);
	ibv_attach_mcast(id->qp, &mgid, 0);
	ret = rdma_leave_multicast(id, (struct sockaddr *)&group);
	CHECK(ret == 0, "leave: 0 (errno %d)", errno);
	ret = ibv_detach_mcast(id->qp, &mgid, 0);
	CHECK(ret == EINVAL, "QP detached by the leave (detach: %d)", ret);
	ret = rdma_leave_multicast(id, (struct sockaddr *)&group);
	CHECK(FAILS_WITH(ret, EADDRNOTAVAIL), "leave twice: EADDRNOTAVAIL (errno %d)", errno);

	/* Send-only: the QP is not attached. */
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	ex.addr = (struct sockaddr *)&group;
	ret = rdma_join_multicast_ex(id, &ex, NULL);
	ev = next_event(ch);
	CHECK(ret == 0 && ev && ev->event == RDMA_CM_EVENT_MULTICAST_JOIN,
	      "send-only join: MULTICAST_JOIN");
	if (ev)
		rdma_ack_cm_event(ev);
	ret = ibv_detach_mcast(id->qp, &mgid, 0);
	CHECK(ret == EINVAL, "send-only: QP not attached (detach: %d)", ret);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0, "send-only leave: 0");

	/* A loopback "group": MGID 0, which the QP cannot attach: MULTICAST_ERROR, status -1. */
	ret = rdma_join_multicast(id, (struct sockaddr *)&lo, NULL);
	ev = next_event(ch);
	CHECK(ret == 0 && ev && ev->event == RDMA_CM_EVENT_MULTICAST_ERROR && ev->status == -1,
	      "join 127.0.160.99: %s status %d", ev ? rdma_event_str(ev->event) : "none",
	      ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_leave_multicast(id, (struct sockaddr *)&lo);

	/* A join left before its event is taken: the event goes with it. */
	rdma_join_multicast(id, (struct sockaddr *)&other, NULL);
	ret = rdma_leave_multicast(id, (struct sockaddr *)&other);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	ret = rdma_get_cm_event(ch, &ev);
	CHECK(FAILS_WITH(ret, EAGAIN), "no event after an early leave (ret %d errno %d)", ret, errno);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);

	/* Joined before the QP exists: librdmacm attaches the QP made before the event is taken. */
	id = bound_ud(ch, local, 0);
	rdma_join_multicast(id, (struct sockaddr *)&group, NULL);
	{
		struct ibv_qp_init_attr attr;

		memset(&attr, 0, sizeof attr);
		attr.qp_type = IBV_QPT_UD;
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		rdma_create_qp(id, NULL, &attr);
	}
	ev = next_event(ch);
	if (ev)
		rdma_ack_cm_event(ev);
	ret = ibv_detach_mcast(id->qp, &mgid, 0);
	CHECK(ret == 0, "QP made between join and event is attached (detach: %d)", ret);
	rdma_leave_multicast(id, (struct sockaddr *)&group);

	/* Past ADDR_RESOLVED: a resolved route refuses the join. */
	{
		struct sockaddr_in src = in4(local);
		struct rdma_cm_id *r;

		rdma_create_id(ch, &r, NULL, RDMA_PS_UDP);
		rdma_resolve_addr(r, (struct sockaddr *)&src, (struct sockaddr *)&group, 2000);
		ev = next_event(ch);
		if (ev)
			rdma_ack_cm_event(ev);
		rdma_resolve_route(r, 2000);
		ev = next_event(ch);
		if (ev)
			rdma_ack_cm_event(ev);
		ret = rdma_join_multicast(r, (struct sockaddr *)&group, NULL);
		CHECK(FAILS_WITH(ret, EINVAL), "join after rdma_resolve_route: EINVAL (errno %d)", errno);
		rdma_destroy_id(r);
	}

	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(tcp);
	rdma_destroy_id(wild);
	rdma_destroy_id(unbound);
	rdma_destroy_event_channel(ch);
	printf("mcast_errors: end %d\n", failed);
	return failed;
}
