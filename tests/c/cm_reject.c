/* cm_reject.c: an rdma_cm client that connects to SERVER_IP PORT (TCP port space) with an RC QP
 * attached and reports the event it gets, then tears down as perftest does after a failed
 * connect (rdma_destroy_id with the QP still attached) and reports each step's return value.
 * The interop suite (tests/interop_rxe.rs, "rdma_cm REQ to a port nobody listens on") runs it
 * on softroce's librdmacm and on rdma-core's against kernel rxe, and compares what it prints.
 * Exit status: the REJECTED event's status (the REJ reason), 100 + the event type of any other
 * event, 2 on a failed call.
 * Usage: cm_reject SERVER_IP PORT [SOURCE_IP] */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev)) {
		perror("rdma_get_cm_event");
		exit(2);
	}
	printf("event: %s status %d\n", rdma_event_str(ev->event), ev->status);
	return ev;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *dst, *src = NULL;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct ibv_qp_init_attr qa = { 0 };
	struct rdma_conn_param cp = { 0 };
	enum rdma_cm_event_type got;
	int status, rc;

	if (argc < 3) {
		fprintf(stderr, "usage: %s SERVER_IP PORT [SOURCE_IP]\n", argv[0]);
		return 2;
	}
	if (rdma_getaddrinfo(argv[1], argv[2], &hints, &dst)) {
		perror("rdma_getaddrinfo");
		return 2;
	}
	if (argc > 3) {
		hints.ai_flags = RAI_PASSIVE;
		if (rdma_getaddrinfo(argv[3], NULL, &hints, &src)) {
			perror("rdma_getaddrinfo (source)");
			return 2;
		}
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		perror("rdma_create_id");
		return 2;
	}
	if (rdma_resolve_addr(id, src ? src->ai_src_addr : NULL, dst->ai_dst_addr, 2000)) {
		perror("rdma_resolve_addr");
		return 2;
	}
	ev = next_event(ch);
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 2000)) {
		perror("rdma_resolve_route");
		return 2;
	}
	ev = next_event(ch);
	rdma_ack_cm_event(ev);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, NULL, &qa)) {
		perror("rdma_create_qp");
		return 2;
	}
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(id, &cp)) {
		perror("rdma_connect");
		return 2;
	}
	ev = next_event(ch);
	got = ev->event;
	status = ev->status;
	rdma_ack_cm_event(ev);
	rc = rdma_destroy_id(id);
	printf("rdma_destroy_id: %d\n", rc ? -errno : 0);
	rdma_destroy_event_channel(ch);
	printf("done\n");
	return got == RDMA_CM_EVENT_REJECTED ? status : 100 + got;
}
