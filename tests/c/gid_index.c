/*
 * GID index 0 on softroce (issue 25 item 2), as tutorials pass it: ibv_modify_qp to RTR with
 * an address vector whose sgid_index is 0 (the link-local GID, which softroce does not send
 * from) fails with EINVAL and errno EINVAL, as on rxe for a GID that cannot be used, twice
 * (the library's hint on stderr comes once; tests/capi_c.rs checks it); the same QP then
 * connects with index 1 and a SEND goes through.
 */
#include "rc_pair.h"

static int rtr(struct rc *s, struct rc *peer, uint8_t sgid_index)
{
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qp->qp_num, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = gid[peer->dev], .sgid_index = sgid_index,
				      .hop_limit = 64 } } };
	return ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	open_devices();
	struct rc s, c;
	rc_make(&s, 0, 0, 0);
	rc_make(&c, 1, 0, 0);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "modify to INIT");
	for (int i = 0; i < 2; i++) {
		errno = 0;
		int r = rtr(&s, &c, 0);
		CHECK(r == EINVAL && errno == EINVAL, "RTR with GID index 0: %d, errno %d", r, errno);
	}
	OK("RTR with GID index 0 fails twice with EINVAL, errno EINVAL");
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(s.qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_INIT,
	      "the QP stays in INIT");
	/* rc_connect moves it INIT -> INIT -> RTR -> RTS with GID index 1. */
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	fill(s.buf, 64, 9);
	post_recv(c.qp, c.mr, c.buf, 64);
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 64, .lkey = s.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(ibv_post_send(s.qp, &wr, &bad) == 0, "post SEND");
	want_ok(s.cq, IBV_WC_SEND, "SEND");
	want_ok(c.cq, IBV_WC_RECV, "RECV");
	CHECK(same(c.buf, 64, 9), "the SEND's data");
	OK("with GID index 1 the same QP connects and a SEND goes through");
	rc_free(&s);
	rc_free(&c);
	close_devices();
	printf("all passed\n");
	return 0;
}
