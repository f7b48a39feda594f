/*
 * The two-device RC harness shared by tests/c/verbs_gaps.c and tests/c/verbs_hostile.c: the
 * ok/FAIL/CHECK reporting, two devices (softroce0 and softroce1, from SOFTROCE_IP=A,B) with a
 * PD each and their GID index 1, RC QPs connected between them (`struct rc`), and polling with
 * a 5 s deadline. `open_devices` / `close_devices` bracket a program's checks.
 */
#ifndef SOFTROCE_TESTS_RC_PAIR_H
#define SOFTROCE_TESTS_RC_PAIR_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { printf("FAIL - " __VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define OK(...) do { printf("ok - " __VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define CHECK(cond, ...) do { if (!(cond)) FAIL(__VA_ARGS__); } while (0)

#define BUF 8192

static struct ibv_context *ctx[2];
static struct ibv_pd *pd[2];
static union ibv_gid gid[2];

static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static inline struct ibv_wc poll_one(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 5;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "%s: ibv_poll_cq failed", what);
		if (n == 1)
			return wc;
		CHECK(now() < end, "%s: no completion within 5 s", what);
	}
}

static inline void want_ok(struct ibv_cq *cq, enum ibv_wc_opcode op, const char *what)
{
	struct ibv_wc wc = poll_one(cq, what);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == op, "%s: status %s, opcode %d", what,
	      ibv_wc_status_str(wc.status), wc.opcode);
}

/* An RC QP with max_inline_data `inl` (or an extended one with send ops). */
struct rc {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	char *buf;
	int dev;
	struct ibv_qp_cap cap;
};

static inline void rc_make(struct rc *s, int dev, uint32_t inl, int ex)
{
	s->dev = dev;
	s->cq = ibv_create_cq(ctx[dev], 64, NULL, NULL, 0);
	CHECK(s->cq, "ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr_ex init = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2,
			 .max_recv_sge = 1, .max_inline_data = inl },
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd[dev],
	};
	if (ex) {
		init.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		init.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	}
	s->qp = ibv_create_qp_ex(ctx[dev], &init);
	CHECK(s->qp, "ibv_create_qp_ex: %s", strerror(errno));
	s->cap = init.cap;
	s->qpx = ex ? ibv_qp_to_qp_ex(s->qp) : NULL;
	CHECK(!ex || s->qpx, "ibv_qp_to_qp_ex");
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(pd[dev], s->buf, BUF, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr, "ibv_reg_mr: %s", strerror(errno));
}

static inline void rc_connect(struct rc *s, struct rc *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS) == 0, "modify to INIT");
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qp->qp_num, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = gid[peer->dev], .sgid_index = 1, .hop_limit = 64 } } };
	CHECK(ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER) == 0, "modify to RTR: %s", strerror(errno));
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
		.rnr_retry = 7, .max_rd_atomic = 1 };
	CHECK(ibv_modify_qp(s->qp, &t, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "modify to RTS: %s", strerror(errno));
}

static inline void rc_free(struct rc *s)
{
	ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	free(s->buf);
}

static inline void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *at, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)at, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
}

static inline void fill(char *p, int n, int seed)
{
	for (int i = 0; i < n; i++)
		p[i] = (char)(seed + i * 7);
}

static inline int same(const char *p, int n, int seed)
{
	for (int i = 0; i < n; i++)
		if (p[i] != (char)(seed + i * 7))
			return 0;
	return 1;
}

/* Opens the first two devices, a PD on each, and reads their GID index 1. */
static inline void open_devices(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 2, "need two devices (SOFTROCE_IP=A,B), have %d", list ? num : 0);
	for (int i = 0; i < 2; i++) {
		ctx[i] = ibv_open_device(list[i]);
		CHECK(ctx[i], "ibv_open_device: %s", strerror(errno));
		pd[i] = ibv_alloc_pd(ctx[i]);
		CHECK(pd[i], "ibv_alloc_pd");
		CHECK(ibv_query_gid(ctx[i], 1, 1, &gid[i]) == 0, "ibv_query_gid");
	}
	ibv_free_device_list(list);
}

static inline void close_devices(void)
{
	for (int i = 0; i < 2; i++) {
		ibv_dealloc_pd(pd[i]);
		ibv_close_device(ctx[i]);
	}
}

#endif
