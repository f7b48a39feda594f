/*
 * Verbs that rdma-core's tools seldom use, as rxe (kernel 6.1, rdma-core 44) answers them,
 * on two softroce devices of one process (SOFTROCE_IP=A,B: softroce0 and softroce1, GID
 * index 1 = RoCE v2 GID of each address):
 *
 *   1. IBV_SEND_INLINE from memory no MR covers (a stack array, a malloc'd buffer), SEND
 *      and RDMA WRITE, through ibv_post_send and through ibv_wr_set_inline_data / _list
 *      on an ibv_qp_ex; the bytes are copied when posted (the buffer is overwritten at
 *      once); cap.max_inline_data as rxe sizes it; too long: EINVAL and *bad_wr from
 *      ibv_post_send, ENOSPC from ibv_wr_complete;
 *   2. UD: the receiver answers the sender with an AH made by ibv_create_ah_from_wc, and
 *      ibv_init_ah_from_wc's attributes are libibverbs': dgid = sender's GID, sgid_index =
 *      the receiving GID's index, hop_limit = the IPv4 TTL, traffic_class = the TOS;
 *      without IBV_WC_GRH no global route, which ibv_create_ah refuses on RoCE;
 *   3. ibv_reg_mr_iova / _iova2 with an IOVA other than the address: a peer's RDMA WRITE
 *      and READ and a local SGE address the memory by the IOVA; an IOVA at another offset
 *      in its page is EINVAL;
 *   4. ibv_rereg_mr fails as on rxe (no provider rereg: IBV_REREG_MR_ERR_CMD, EOPNOTSUPP;
 *      bad input: IBV_REREG_MR_ERR_INPUT, EINVAL);
 *   5. a zero-based type 2 memory window (IBV_ACCESS_ZERO_BASED in an IBV_WR_BIND_MW): a
 *      peer's WRITE and READ address it from 0, past its length is IBV_WC_REM_ACCESS_ERR;
 *      ibv_bind_mw of a zero-based type 1 window is EINVAL (rxe's provider);
 *   6. an extended CQ with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP is EOPNOTSUPP (rxe's
 *      provider), and ibv_query_rt_values_ex too;
 *   7. the sysfs helpers libibverbs exports and its headers no longer declare (Open MPI's
 *      openib BTL declares ibv_get_sysfs_path itself, and gives up on a host whose
 *      <sysfs>/class/infiniband is not a directory): ibv_get_sysfs_path is "/sys", the
 *      device's ibdev_path is under it, ibv_read_sysfs_file reads its files without the
 *      newline (-1 and ENOENT for a missing one).
 *
 * Prints "ok - ..." per check, "FAIL - ..." and exits 1 at the first failure. Compiled and
 * run by tests/capi_c.rs through `softroce exec`; every wait has a deadline.
 */
#include "rc_pair.h"
#include <sys/stat.h>

/* 1a: cap.max_inline_data as rxe sizes a WQE: max(16 * max_send_sge, max_inline_data). */
static void inline_caps(void)
{
	struct rc a, b;
	rc_make(&a, 0, 0, 0);
	rc_make(&b, 0, 100, 0);
	CHECK(a.cap.max_inline_data == 32 && a.cap.max_send_sge == 2,
	      "max_send_sge 2, max_inline_data 0: got %u / %u, want rxe's 32 / 2",
	      a.cap.max_inline_data, a.cap.max_send_sge);
	CHECK(b.cap.max_inline_data == 100 && b.cap.max_send_sge == 6,
	      "max_send_sge 2, max_inline_data 100: got %u / %u, want rxe's 100 / 6",
	      b.cap.max_inline_data, b.cap.max_send_sge);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(b.qp, &qa, IBV_QP_CAP, &qi) == 0 && qa.cap.max_inline_data == 100 &&
	      qi.cap.max_inline_data == 100, "ibv_query_qp cap.max_inline_data");
	rc_free(&a);
	rc_free(&b);
	struct ibv_cq *cq = ibv_create_cq(ctx[0], 4, NULL, NULL, 0);
	struct ibv_qp_init_attr big = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 513 } };
	errno = 0;
	CHECK(!ibv_create_qp(pd[0], &big) && errno == EINVAL,
	      "max_inline_data 513: errno %s, want EINVAL", strerror(errno));
	ibv_destroy_cq(cq);
	OK("cap.max_inline_data: 2 SGEs -> 32 bytes, 100 -> 100 (6 SGEs), 513 -> EINVAL");
}

/* 1b: ibv_post_send with IBV_SEND_INLINE from a stack array and a malloc'd buffer. */
static void inline_post_send(void)
{
	struct rc s, c;
	rc_make(&s, 0, 256, 0);
	rc_make(&c, 1, 256, 0);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	char stack[200];
	char *heap = malloc(56);
	CHECK(heap, "malloc");

	/* SEND of two SGEs: 200 stack bytes then 56 heap bytes (256, the limit). */
	fill(stack, 200, 1);
	fill(heap, 56, 1 + 200 * 7);
	post_recv(s.qp, s.mr, s.buf, 512);
	struct ibv_sge sg[2] = { { .addr = (uintptr_t)stack, .length = 200, .lkey = 0 },
				 { .addr = (uintptr_t)heap, .length = 56, .lkey = 0 } };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = sg, .num_sge = 2, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED }, *bad = NULL;
	CHECK(ibv_post_send(c.qp, &wr, &bad) == 0, "post inline SEND");
	/* Copied at post time: the buffers may change at once. */
	memset(stack, 0xee, sizeof stack);
	memset(heap, 0xee, 56);
	want_ok(c.cq, IBV_WC_SEND, "inline SEND");
	struct ibv_wc rwc = poll_one(s.cq, "inline SEND receive");
	CHECK(rwc.status == IBV_WC_SUCCESS && rwc.byte_len == 256 && same(s.buf, 256, 1),
	      "inline SEND: received %u bytes, status %s, data %s", rwc.byte_len,
	      ibv_wc_status_str(rwc.status), same(s.buf, 256, 1) ? "intact" : "wrong");
	OK("IBV_SEND_INLINE SEND of 256 bytes from a stack array and a malloc'd buffer, "
	   "overwritten right after ibv_post_send: received intact");

	/* RDMA WRITE from the heap buffer. */
	fill(heap, 56, 33);
	sg[0] = (struct ibv_sge){ .addr = (uintptr_t)heap, .length = 56 };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = sg, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)s.buf + 1000, .rkey = s.mr->rkey } };
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post inline RDMA WRITE");
	memset(heap, 0, 56);
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "inline RDMA WRITE");
	CHECK(same(s.buf + 1000, 56, 33), "inline RDMA WRITE: data wrong");
	OK("IBV_SEND_INLINE RDMA WRITE of 56 bytes from a malloc'd buffer: landed intact");

	/* Too long: 257 bytes. The first WR of the list is posted, the second is *bad_wr. */
	char big[257];
	fill(big, 257, 5);
	fill(stack, 8, 9);
	post_recv(s.qp, s.mr, s.buf, 512);
	struct ibv_sge ok_sge = { .addr = (uintptr_t)stack, .length = 8 };
	struct ibv_sge big_sge = { .addr = (uintptr_t)big, .length = 257 };
	struct ibv_send_wr second = { .wr_id = 4, .sg_list = &big_sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	struct ibv_send_wr first = { .wr_id = 3, .next = &second, .sg_list = &ok_sge,
		.num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED };
	bad = NULL;
	int r = ibv_post_send(c.qp, &first, &bad);
	CHECK(r == EINVAL && bad == &second, "257 inline bytes: returned %d (%s), bad_wr %s", r,
	      strerror(r), bad == &second ? "right" : "wrong");
	struct ibv_wc wc = poll_one(c.cq, "the WR before the too-long one");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 3, "first WR: %s, wr_id %llu",
	      ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id);
	rwc = poll_one(s.cq, "the WR before the too-long one, received");
	CHECK(rwc.byte_len == 8 && same(s.buf, 8, 9), "first WR received %u bytes", rwc.byte_len);
	OK("257 inline bytes over max_inline_data 256: EINVAL, *bad_wr at it, the WR before it sent");

	free(heap);
	rc_free(&s);
	rc_free(&c);
}

/* 1c: ibv_wr_set_inline_data / _list on an extended QP. */
static void inline_wr_api(void)
{
	struct rc s, c;
	rc_make(&s, 0, 128, 1);
	rc_make(&c, 1, 128, 1);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	char stack[100];
	char *heap = malloc(28);
	CHECK(heap, "malloc");
	fill(stack, 100, 11);
	fill(heap, 28, 11 + 100 * 7);
	post_recv(s.qp, s.mr, s.buf, 512);

	struct ibv_qp_ex *x = c.qpx;
	ibv_wr_start(x);
	x->wr_id = 10;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, stack, 100);
	/* The bytes were copied by ibv_wr_set_inline_data: change them before completing. */
	memset(stack, 0, sizeof stack);
	x->wr_id = 11;
	ibv_wr_rdma_write(x, s.mr->rkey, (uintptr_t)s.buf + 2048);
	fill(stack, 50, 77);
	struct ibv_data_buf list[2] = { { .addr = heap, .length = 28 },
					{ .addr = stack, .length = 50 } };
	ibv_wr_set_inline_data_list(x, 2, list);
	memset(heap, 0, 28);
	CHECK(ibv_wr_complete(x) == 0, "ibv_wr_complete");
	want_ok(c.cq, IBV_WC_SEND, "wr_send inline");
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "wr_rdma_write inline list");
	struct ibv_wc rwc = poll_one(s.cq, "wr_send inline, received");
	fill(stack, 100, 11);
	CHECK(rwc.byte_len == 100 && same(s.buf, 100, 11), "wr_set_inline_data: %u bytes, %s",
	      rwc.byte_len, same(s.buf, 100, 11) ? "intact" : "wrong");
	CHECK(same(s.buf + 2048, 28, 11 + 100 * 7) && same(s.buf + 2048 + 28, 50, 77),
	      "wr_set_inline_data_list: data wrong");
	OK("ibv_wr_set_inline_data (SEND, 100 stack bytes) and _list (RDMA WRITE, 28 heap + 50 "
	   "stack bytes), changed before ibv_wr_complete: received as they were when set");

	/* Over the limit: ENOSPC from ibv_wr_complete, nothing posted. */
	char big[129];
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, big, sizeof big);
	int r = ibv_wr_complete(x);
	CHECK(r == ENOSPC, "129 bytes over max_inline_data 128: ibv_wr_complete %d (%s)", r,
	      strerror(r));
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(c.cq, 1, &wc) == 0, "a completion after a refused ibv_wr_complete");
	OK("ibv_wr_set_inline_data over max_inline_data: ibv_wr_complete says %s", strerror(r));

	/* ibv_wr_set_sge after ibv_wr_set_inline_data: the SGE (in the MR) is what is sent. */
	post_recv(s.qp, s.mr, s.buf, 512);
	fill(c.buf, 40, 88);
	fill(stack, 10, 1);
	ibv_wr_start(x);
	x->wr_id = 12;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, stack, 10);
	ibv_wr_set_sge(x, c.mr->lkey, (uintptr_t)c.buf, 40);
	CHECK(ibv_wr_complete(x) == 0, "ibv_wr_complete of inline data replaced by an SGE");
	want_ok(c.cq, IBV_WC_SEND, "SGE after inline data");
	rwc = poll_one(s.cq, "SGE after inline data, received");
	CHECK(rwc.byte_len == 40 && same(s.buf, 40, 88), "SGE after inline data: %u bytes",
	      rwc.byte_len);
	/* More SGEs than max_send_sge: ENOSPC, as rxe's provider. */
	struct ibv_sge many[64];
	memset(many, 0, sizeof many);
	ibv_wr_start(x);
	ibv_wr_send(x);
	ibv_wr_set_sge_list(x, c.cap.max_send_sge + 1, many);
	r = ibv_wr_complete(x);
	CHECK(r == ENOSPC, "%u SGEs over max_send_sge %u: ibv_wr_complete %d (%s)",
	      c.cap.max_send_sge + 1, c.cap.max_send_sge, r, strerror(r));
	OK("ibv_wr_set_sge after ibv_wr_set_inline_data sends the SGE; %u SGEs: %s",
	   c.cap.max_send_sge + 1, strerror(ENOSPC));
	free(heap);
	rc_free(&s);
	rc_free(&c);
}

/* 2: UD, answered with an AH made from the completion. */
struct ud {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
};

#define QKEY 0x11111111

static void ud_make(struct ud *u, int dev)
{
	u->cq = ibv_create_cq(ctx[dev], 16, NULL, NULL, 0);
	struct ibv_qp_init_attr init = { .send_cq = u->cq, .recv_cq = u->cq,
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 } };
	u->qp = ibv_create_qp(pd[dev], &init);
	CHECK(u->qp, "UD ibv_create_qp: %s", strerror(errno));
	u->buf = calloc(1, 4096);
	u->mr = ibv_reg_mr(pd[dev], u->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_QKEY) == 0, "UD INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE) == 0, "UD RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
}

static void ud_send(struct ud *u, struct ibv_ah *ah, uint32_t qpn, const char *msg)
{
	size_t n = strlen(msg) + 1;
	memcpy(u->buf + 2048, msg, n);
	struct ibv_sge sge = { .addr = (uintptr_t)u->buf + 2048, .length = n,
			       .lkey = u->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = QKEY;
	CHECK(ibv_post_send(u->qp, &wr, &bad) == 0, "UD post_send");
	want_ok(u->cq, IBV_WC_SEND, "UD send");
}

static void ah_from_wc(void)
{
	struct ud srv, cli;
	ud_make(&srv, 0);
	ud_make(&cli, 1);
	post_recv(srv.qp, srv.mr, srv.buf, 1024);
	post_recv(cli.qp, cli.mr, cli.buf, 1024);

	struct ibv_ah_attr to_srv = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = gid[0], .sgid_index = 1, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd[1], &to_srv);
	CHECK(ah, "ibv_create_ah: %s", strerror(errno));
	ud_send(&cli, ah, srv.qp->qp_num, "question");

	struct ibv_wc wc = poll_one(srv.cq, "UD receive");
	CHECK(wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_GRH) &&
	      wc.src_qp == cli.qp->qp_num && !strcmp(srv.buf + 40, "question"),
	      "UD receive: status %s, flags %#x", ibv_wc_status_str(wc.status), wc.wc_flags);
	struct ibv_ah_attr a;
	memset(&a, 0xa5, sizeof a);
	CHECK(ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)srv.buf, &a) == 0,
	      "ibv_init_ah_from_wc: %s", strerror(errno));
	CHECK(a.is_global == 1 && a.port_num == 1 && !memcmp(&a.grh.dgid, &gid[1], 16) &&
	      a.grh.sgid_index == 1 && a.grh.hop_limit == 64 && a.grh.traffic_class == 0 &&
	      a.grh.flow_label == 0 && a.dlid == wc.slid && a.sl == wc.sl &&
	      a.src_path_bits == wc.dlid_path_bits && a.static_rate == 0,
	      "ibv_init_ah_from_wc: is_global %u, port %u, sgid_index %u, hop_limit %u, "
	      "traffic_class %u, flow_label %u", a.is_global, a.port_num, a.grh.sgid_index,
	      a.grh.hop_limit, a.grh.traffic_class, a.grh.flow_label);
	OK("ibv_init_ah_from_wc: dgid = the sender's GID, sgid_index 1, hop_limit 64 (the TTL), "
	   "traffic_class 0, flow_label 0");

	struct ibv_ah *reply = ibv_create_ah_from_wc(pd[0], &wc, (struct ibv_grh *)srv.buf, 1);
	CHECK(reply, "ibv_create_ah_from_wc: %s", strerror(errno));
	ud_send(&srv, reply, wc.src_qp, "answer");
	struct ibv_wc cwc = poll_one(cli.cq, "UD answer");
	CHECK(cwc.status == IBV_WC_SUCCESS && cwc.src_qp == srv.qp->qp_num &&
	      !strcmp(cli.buf + 40, "answer"), "UD answer: status %s",
	      ibv_wc_status_str(cwc.status));
	struct ibv_ah_attr back;
	CHECK(ibv_init_ah_from_wc(ctx[1], 1, &cwc, (struct ibv_grh *)cli.buf, &back) == 0 &&
	      !memcmp(&back.grh.dgid, &gid[0], 16) && back.grh.sgid_index == 1,
	      "the client's ibv_init_ah_from_wc of the answer");
	OK("the UD receiver answered the sender with ibv_create_ah_from_wc; the answer arrived");

	/* Without IBV_WC_GRH: no global route (0), which a RoCE port's ibv_create_ah refuses. */
	struct ibv_wc nogrh = wc;
	nogrh.wc_flags &= ~IBV_WC_GRH;
	CHECK(ibv_init_ah_from_wc(ctx[0], 1, &nogrh, (struct ibv_grh *)srv.buf, &a) == 0 &&
	      a.is_global == 0, "ibv_init_ah_from_wc without IBV_WC_GRH");
	errno = 0;
	CHECK(!ibv_create_ah_from_wc(pd[0], &nogrh, (struct ibv_grh *)srv.buf, 1) &&
	      errno == EINVAL, "ibv_create_ah_from_wc without IBV_WC_GRH: errno %s",
	      strerror(errno));
	/* A destination that is no GID of the port: EINVAL. */
	struct ibv_grh g;
	memcpy(&g, srv.buf, sizeof g);
	((unsigned char *)&g)[20 + 19] ^= 0x40; /* another IPv4 destination */
	errno = 0;
	CHECK(ibv_init_ah_from_wc(ctx[0], 1, &wc, &g, &a) == -1 && errno == EINVAL,
	      "a destination outside the GID table: errno %s", strerror(errno));
	OK("without IBV_WC_GRH: is_global 0 and ibv_create_ah_from_wc fails (EINVAL); an "
	   "unknown destination: -1, EINVAL");

	ibv_destroy_ah(reply);
	ibv_destroy_ah(ah);
	ibv_destroy_qp(srv.qp);
	ibv_destroy_qp(cli.qp);
	ibv_dereg_mr(srv.mr);
	ibv_dereg_mr(cli.mr);
	ibv_destroy_cq(srv.cq);
	ibv_destroy_cq(cli.cq);
	free(srv.buf);
	free(cli.buf);
}

/* 3: an MR registered at an IOVA other than its address. */
static void iova_mr(void)
{
	struct rc s, c;
	rc_make(&s, 0, 0, 0);
	rc_make(&c, 1, 0, 0);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	char *mem = aligned_alloc(4096, 4096);
	CHECK(mem, "aligned_alloc");
	memset(mem, 0, 4096);
	uint64_t iova = 0x7e5700000000ull;
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr_iova(pd[0], mem, 4096, iova, acc);
	CHECK(mr, "ibv_reg_mr_iova: %s", strerror(errno));
	CHECK(mr->addr == mem && mr->length == 4096, "ibv_mr addr/length after ibv_reg_mr_iova");

	/* WRITE to iova + 128. */
	fill(c.buf, 64, 21);
	struct ibv_sge sge = { .addr = (uintptr_t)c.buf, .length = 64, .lkey = c.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = iova + 128, .rkey = mr->rkey } }, *bad;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post WRITE to the IOVA");
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "WRITE to the IOVA");
	CHECK(same(mem + 128, 64, 21), "WRITE to iova + 128 did not land at address + 128");

	/* READ from iova + 1024. */
	fill(mem + 1024, 100, 45);
	sge = (struct ibv_sge){ .addr = (uintptr_t)c.buf + 512, .length = 100,
				.lkey = c.mr->lkey };
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = iova + 1024;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post READ from the IOVA");
	want_ok(c.cq, IBV_WC_RDMA_READ, "READ from the IOVA");
	CHECK(same(c.buf + 512, 100, 45), "READ from iova + 1024 returned other bytes");

	/* The address itself is outside the MR for a peer. */
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = (uintptr_t)mem;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post WRITE to the host address");
	struct ibv_wc wc = poll_one(c.cq, "WRITE to the host address");
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "WRITE to the host address: %s",
	      ibv_wc_status_str(wc.status));
	OK("ibv_reg_mr_iova at %#llx: a peer's WRITE and READ address it by the IOVA; its host "
	   "address is %s", (unsigned long long)iova, ibv_wc_status_str(wc.status));
	rc_free(&s);
	rc_free(&c);

	/* A local SGE by the IOVA (ibv_reg_mr_iova2), on a fresh pair. */
	rc_make(&s, 0, 0, 0);
	rc_make(&c, 1, 0, 0);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	struct ibv_mr *mr2 = ibv_reg_mr_iova2(pd[1], mem, 4096, iova + 0x10000, acc);
	CHECK(mr2, "ibv_reg_mr_iova2: %s", strerror(errno));
	fill(mem + 300, 40, 99);
	post_recv(s.qp, s.mr, s.buf, 512);
	sge = (struct ibv_sge){ .addr = iova + 0x10000 + 300, .length = 40, .lkey = mr2->lkey };
	struct ibv_send_wr snd = { .wr_id = 5, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	CHECK(ibv_post_send(c.qp, &snd, &bad) == 0, "post SEND from the IOVA");
	want_ok(c.cq, IBV_WC_SEND, "SEND gathered by the IOVA");
	struct ibv_wc rwc = poll_one(s.cq, "SEND gathered by the IOVA, received");
	CHECK(rwc.byte_len == 40 && same(s.buf, 40, 99), "SEND by the IOVA: data wrong");
	OK("ibv_reg_mr_iova2: a local SGE at the IOVA gathers the bytes at the address");

	errno = 0;
	CHECK(!ibv_reg_mr_iova(pd[0], mem, 4096, iova + 8, acc) && errno == EINVAL,
	      "an IOVA at another page offset: errno %s", strerror(errno));
	OK("an IOVA at another offset in its page than the address: %s", strerror(EINVAL));
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(mr2) == 0, "ibv_dereg_mr");
	rc_free(&s);
	rc_free(&c);
	free(mem);
}

/* 4: ibv_rereg_mr as on rxe. */
static void rereg(void)
{
	char *mem = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd[0], mem, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	errno = 0;
	int r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(r == IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP, "ibv_rereg_mr: %d, errno %s", r,
	      strerror(errno));
	errno = 0;
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0);
	CHECK(r == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr CHANGE_TRANSLATION without an address: %d, errno %s", r,
	      strerror(errno));
	errno = 0;
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd[0], NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(r == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr access without CHANGE_ACCESS: %d, errno %s", r, strerror(errno));
	CHECK(ibv_dereg_mr(mr) == 0, "the MR is still registered after the failed rereg");
	free(mem);
	OK("ibv_rereg_mr: IBV_REREG_MR_ERR_CMD with %s (no provider rereg, as rxe); bad input: "
	   "IBV_REREG_MR_ERR_INPUT with %s", strerror(EOPNOTSUPP), strerror(EINVAL));
}

/* 5: a zero-based type 2 window. */
static void zero_based_mw(void)
{
	struct rc s, c;
	rc_make(&s, 0, 0, 0);
	rc_make(&c, 1, 0, 0);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	struct ibv_mr *mr = ibv_reg_mr(pd[0], s.buf, BUF, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr with MW_BIND: %s", strerror(errno));

	struct ibv_mw *mw1 = ibv_alloc_mw(pd[0], IBV_MW_TYPE_1);
	CHECK(mw1, "ibv_alloc_mw type 1");
	struct ibv_mw_bind b1 = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = (uintptr_t)s.buf, .length = 64,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED } };
	errno = 0;
	int r = ibv_bind_mw(s.qp, mw1, &b1);
	CHECK(r == EINVAL, "ibv_bind_mw of a zero-based type 1 window: %d (%s)", r, strerror(r));
	CHECK(errno == EINVAL, "errno after the refused zero-based bind: %d", errno);
	/* rxe's provider leaves every error of ibv_bind_mw in errno: also one from posting. */
	struct rc z;
	rc_make(&z, 0, 0, 0); /* its QP stays in RESET */
	b1.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	errno = 0;
	r = ibv_bind_mw(z.qp, mw1, &b1);
	CHECK(r != 0 && errno == r, "ibv_bind_mw on a RESET QP: %d, errno %d", r, errno);
	rc_free(&z);
	b1.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED;

	struct ibv_mw *mw2 = ibv_alloc_mw(pd[0], IBV_MW_TYPE_2);
	CHECK(mw2, "ibv_alloc_mw type 2");
	uint32_t rkey = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr wr = { .wr_id = 2, .opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
		.addr = (uintptr_t)s.buf + 256, .length = 128,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_ZERO_BASED };
	CHECK(ibv_post_send(s.qp, &wr, &bad) == 0, "post a zero-based IBV_WR_BIND_MW");
	want_ok(s.cq, IBV_WC_BIND_MW, "zero-based bind");

	fill(c.buf, 32, 55);
	struct ibv_sge sge = { .addr = (uintptr_t)c.buf, .length = 32, .lkey = c.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = 16, .rkey = rkey } };
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post WRITE at 16 through the window");
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "WRITE through the zero-based window");
	CHECK(same(s.buf + 256 + 16, 32, 55), "WRITE at window offset 16 did not land at +272");
	fill(s.buf + 256 + 96, 32, 66);
	sge.addr = (uintptr_t)c.buf + 1024;
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = 96;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post READ at 96 through the window");
	want_ok(c.cq, IBV_WC_RDMA_READ, "READ through the zero-based window");
	CHECK(same(c.buf + 1024, 32, 66), "READ at window offset 96 returned other bytes");
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = 112; /* 112 + 32 > 128 */
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post WRITE past the window");
	struct ibv_wc wc = poll_one(c.cq, "WRITE past the zero-based window");
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "WRITE past the window: %s",
	      ibv_wc_status_str(wc.status));
	OK("zero-based type 2 window: WRITE at 16 and READ at 96 land at the bound address plus "
	   "them, past its 128 bytes %s; ibv_bind_mw of a zero-based type 1 window %s",
	   ibv_wc_status_str(wc.status), strerror(EINVAL));
	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	rc_free(&s);
	rc_free(&c);
}

/* 6: completion timestamps, as rxe's provider: not offered. */
static void timestamps(void)
{
	struct ibv_cq_init_attr_ex a = { .cqe = 4,
		.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx[0], &a) && errno == EOPNOTSUPP,
	      "ibv_create_cq_ex with completion timestamps: errno %s", strerror(errno));
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	int r = ibv_query_rt_values_ex(ctx[0], &v);
	CHECK(r == EOPNOTSUPP, "ibv_query_rt_values_ex: %d (%s)", r, strerror(r));
	a.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx[0], &a);
	CHECK(cq, "ibv_create_cq_ex with the standard flags: %s", strerror(errno));
	ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	OK("ibv_create_cq_ex with IBV_WC_EX_WITH_COMPLETION_TIMESTAMP and "
	   "ibv_query_rt_values_ex: %s, as rxe", strerror(EOPNOTSUPP));
}

/* 7: not in rdma-core 44's headers; declared as Open MPI declares them. */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static void sysfs_helpers(void)
{
	const char *root = ibv_get_sysfs_path();
	CHECK(root && strcmp(root, "/sys") == 0, "ibv_get_sysfs_path: %s", root ? root : "NULL");
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/class/infiniband", root);
	CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "%s is not a directory", path);
	struct ibv_device *dev = ctx[0]->device;
	snprintf(path, sizeof path, "%s/class/infiniband/%s", root, ibv_get_device_name(dev));
	CHECK(strcmp(dev->ibdev_path, path) == 0, "ibdev_path %s, want %s", dev->ibdev_path,
	      path);
	char buf[64];
	int n = ibv_read_sysfs_file(dev->ibdev_path, "node_type", buf, sizeof buf);
	CHECK(n == 5 && strcmp(buf, "1: CA") == 0, "node_type: %d \"%s\"", n, n > 0 ? buf : "");
	n = ibv_read_sysfs_file(dev->ibdev_path, "ports/1/link_layer", buf, sizeof buf);
	CHECK(n == 8 && strcmp(buf, "Ethernet") == 0, "ports/1/link_layer: %d \"%s\"", n,
	      n > 0 ? buf : "");
	/* "Ethernet\n" in a buffer of 9: the newline's byte becomes the NUL. */
	n = ibv_read_sysfs_file(dev->ibdev_path, "ports/1/link_layer", buf, 9);
	CHECK(n == 8 && strcmp(buf, "Ethernet") == 0, "link_layer in 9 bytes: %d", n);
	/* In 8 bytes the newline is not read and the contents cannot be terminated: -1. */
	CHECK(ibv_read_sysfs_file(dev->ibdev_path, "ports/1/link_layer", buf, 8) == -1,
	      "link_layer in 8 bytes");
	errno = 0;
	n = ibv_read_sysfs_file(dev->ibdev_path, "no_such_file", buf, sizeof buf);
	CHECK(n == -1 && errno == ENOENT, "a missing file: %d, %s", n, strerror(errno));
	OK("ibv_get_sysfs_path %s, %s/class/infiniband a directory, ibv_read_sysfs_file of "
	   "node_type \"1: CA\" and link_layer \"Ethernet\", a missing file %s", root, root,
	   strerror(ENOENT));
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	open_devices();

	inline_caps();
	inline_post_send();
	inline_wr_api();
	ah_from_wc();
	iova_mr();
	rereg();
	zero_based_mw();
	timestamps();
	sysfs_helpers();

	close_devices();
	printf("all passed\n");
	return 0;
}
