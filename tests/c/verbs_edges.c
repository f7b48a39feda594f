/*
 * What rdma-core's tools do not exercise, as a learner's C program meets it, on two
 * softroce devices of one process (SOFTROCE_IP=A,B: softroce0 and softroce1, RC QPs between
 * them, GID index 1 = RoCE v2 GID of each address):
 *
 *   1. a server that spins on a flag byte in its registered buffer until the client's RDMA
 *      WRITE sets it (no completion on the server side: the memory is the signal);
 *   2. two threads posting and polling on separate QPs of the same two contexts;
 *   3. ibv_fork_init, then a fork, then RDMA still landing in the parent's memory;
 *   4. the error paths: wrong lkey (IBV_WC_LOC_PROT_ERR), wrong rkey (IBV_WC_REM_ACCESS_ERR),
 *      a QP in the wrong state (ibv_post_send and ibv_modify_qp fail with EINVAL), a too-small
 *      CQ (IBV_EVENT_CQ_ERR on the context's async fd, the CQ holds what fits);
 *   5. memory windows: type 1 bound with ibv_bind_mw, type 2 with an IBV_WR_BIND_MW work
 *      request, peers' WRITEs through them, LOCAL_INV of the type 2 window, a wrong type;
 *   6. ibv_resize_cq down, up, and below the completions it holds (EINVAL);
 *   7. the context's cmd_fd is a descriptor that dup() accepts, and ibv_import_device says
 *      EOPNOTSUPP (pyverbs' shared-PD test skips on that);
 *   8. the GID table is rxe's 1024 entries, the first two filled: an empty entry reads as
 *      zeros with ibv_query_gid and is ENODATA for ibv_query_gid_ex;
 *   9. ibv_init_ah_from_wc answers a UD receive flagged IBV_WC_GRH (and no immediate data)
 *      from the IPv4 header in the last 20 bytes of its GRH area, as rxe writes it.
 *
 * Prints "ok - ..." per check, "FAIL - ..." and exits 1 at the first failure. Compiled and
 * run by tests/capi_c.rs through `softroce exec`; every wait has a deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { printf("FAIL - " __VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define OK(...) do { printf("ok - " __VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define CHECK(cond, ...) do { if (!(cond)) FAIL(__VA_ARGS__); } while (0)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

#define BUF 4096

static struct ibv_context *ctx[2];
static struct ibv_pd *pd[2];

static void make_side(struct side *s, int dev, int cqe)
{
	s->ctx = ctx[dev];
	s->pd = pd[dev];
	s->cq = ibv_create_cq(s->ctx, cqe, NULL, NULL, 0);
	CHECK(s->cq, "ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(s->pd, &init);
	CHECK(s->qp, "ibv_create_qp: %s", strerror(errno));
	s->buf = calloc(1, BUF);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr, "ibv_reg_mr: %s", strerror(errno));
	CHECK(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0, "ibv_query_gid");
}

static int to_init(struct side *s)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	return ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS);
}

static void to_rts(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qp->qp_num, .rq_psn = 0, .max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = 1, .hop_limit = 64 } } };
	CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER) == 0, "modify to RTR: %s", strerror(errno));
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
		.rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	CHECK(ibv_modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "modify to RTS: %s", strerror(errno));
}

/* A connected pair: s on softroce0, c on softroce1; CQs of cqe_s and cqe_c entries. */
static void make_pair(struct side *s, struct side *c, int cqe_s, int cqe_c)
{
	make_side(s, 0, cqe_s);
	make_side(c, 1, cqe_c);
	CHECK(to_init(s) == 0 && to_init(c) == 0, "modify to INIT: %s", strerror(errno));
	to_rts(s, c);
	to_rts(c, s);
}

static void free_side(struct side *s)
{
	ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	free(s->buf);
}

/* Polls one completion within 5 s. */
static struct ibv_wc poll_one(struct ibv_cq *cq, const char *what)
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

static int post_write(struct side *c, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		      uint32_t len, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey } }, *bad;
	return ibv_post_send(c->qp, &wr, &bad);
}

/* 1 (and 3): the server spins on the last byte of a 64-byte WRITE. */
static void flag_spin(const char *when)
{
	struct side s, c;
	make_pair(&s, &c, 16, 16);
	for (int i = 0; i < 63; i++)
		c.buf[i] = (char)(i + 1);
	c.buf[63] = 1; /* the flag, last byte of the message */
	CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, s.mr->rkey, 64, 7) == 0,
	      "post RDMA WRITE");
	volatile char *flag = &s.buf[63];
	double end = now() + 5;
	while (*flag != 1)
		CHECK(now() < end, "%s: the flag byte was not set within 5 s", when);
	for (int i = 0; i < 63; i++)
		CHECK(s.buf[i] == (char)(i + 1), "%s: byte %d of the WRITE is %d", when, i, s.buf[i]);
	struct ibv_wc wc = poll_one(c.cq, "WRITE completion");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 7,
	      "WRITE completion: status %s", ibv_wc_status_str(wc.status));
	OK("%s: the server saw the flag byte of the client's RDMA WRITE, data intact", when);
	free_side(&s);
	free_side(&c);
}

/* 2: each thread runs SEND/RECV pingpongs on its own QP pair. */
struct thread_arg {
	int id;
	int ok;
	char err[128];
};

static void *pingpong_thread(void *p)
{
	struct thread_arg *t = p;
	struct side s, c;
	make_pair(&s, &c, 16, 16);
	for (int i = 0; i < 200; i++) {
		struct ibv_sge rs = { .addr = (uintptr_t)s.buf, .length = 64, .lkey = s.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = i, .sg_list = &rs, .num_sge = 1 }, *rbad;
		if (ibv_post_recv(s.qp, &rw, &rbad)) {
			snprintf(t->err, sizeof t->err, "post_recv %d", i);
			return NULL;
		}
		snprintf(c.buf, 64, "thread %d message %d", t->id, i);
		struct ibv_sge ss = { .addr = (uintptr_t)c.buf, .length = 64, .lkey = c.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = i, .sg_list = &ss, .num_sge = 1,
			.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;
		if (ibv_post_send(c.qp, &sw, &sbad)) {
			snprintf(t->err, sizeof t->err, "post_send %d", i);
			return NULL;
		}
		struct ibv_wc a = poll_one(s.cq, "thread recv"), b = poll_one(c.cq, "thread send");
		if (a.status || b.status || a.wr_id != (uint64_t)i || a.byte_len != 64 ||
		    strcmp(s.buf, c.buf)) {
			snprintf(t->err, sizeof t->err, "iteration %d: %s / %s, got \"%.40s\"", i,
				 ibv_wc_status_str(a.status), ibv_wc_status_str(b.status), s.buf);
			return NULL;
		}
	}
	free_side(&s);
	free_side(&c);
	t->ok = 1;
	return NULL;
}

static void two_threads(void)
{
	pthread_t th[2];
	struct thread_arg a[2] = { { .id = 0 }, { .id = 1 } };
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&th[i], NULL, pingpong_thread, &a[i]) == 0, "pthread_create");
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CHECK(a[i].ok, "thread %d: %s", i, a[i].err);
	}
	OK("two threads, each posting and polling 200 SEND/RECV on its own QPs of the same contexts");
}

static void forked(void)
{
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0)
		_exit(0); /* the child does no verbs: only the forking thread lives in it */
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
	OK("fork after ibv_fork_init: the child exited");
	flag_spin("after fork");
}

/* Wrong lkey: the requester's completion is IBV_WC_LOC_PROT_ERR. */
static void wrong_lkey(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 16);
	CHECK(post_write(&c, c.mr->lkey + 0x100, (uintptr_t)s.buf, s.mr->rkey, 64, 1) == 0,
	      "post with a wrong lkey is accepted (checked when executed)");
	struct ibv_wc wc = poll_one(c.cq, "wrong lkey");
	CHECK(wc.status == IBV_WC_LOC_PROT_ERR, "wrong lkey: status %s (%d), want %s",
	      ibv_wc_status_str(wc.status), wc.status, ibv_wc_status_str(IBV_WC_LOC_PROT_ERR));
	OK("wrong lkey: completion status %s (%d), vendor_err %u", ibv_wc_status_str(wc.status),
	   wc.status, wc.vendor_err);
	free_side(&s);
	free_side(&c);
}

/* Wrong rkey: the responder NAKs, the requester's completion is IBV_WC_REM_ACCESS_ERR. */
static void wrong_rkey(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 16);
	CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, s.mr->rkey + 0x100, 64, 1) == 0,
	      "post with a wrong rkey");
	struct ibv_wc wc = poll_one(c.cq, "wrong rkey");
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "wrong rkey: status %s (%d), want %s",
	      ibv_wc_status_str(wc.status), wc.status, ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	OK("wrong rkey: completion status %s (%d)", ibv_wc_status_str(wc.status), wc.status);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(c.qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_ERR,
	      "the requester QP is in ERR after the error (state %d)", a.qp_state);
	OK("wrong rkey: the requester's QP went to IBV_QPS_ERR");
	free_side(&s);
	free_side(&c);
}

/* A QP in the wrong state: send in INIT; RESET -> RTS. */
static void wrong_state(void)
{
	struct side s;
	make_side(&s, 0, 16);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };
	errno = 0;
	int r = ibv_modify_qp(s.qp, &a, IBV_QP_STATE);
	CHECK(r == EINVAL, "modify RESET -> RTS returned %d (%s), want EINVAL", r, strerror(r));
	/* rdma-core's failed modify command leaves the value in errno too (perror works). */
	CHECK(errno == EINVAL, "modify RESET -> RTS left errno %d, want EINVAL", errno);
	OK("ibv_modify_qp RESET -> RTS: %s (returned and in errno)", strerror(r));
	CHECK(to_init(&s) == 0, "modify to INIT");
	r = post_write(&s, s.mr->lkey, (uintptr_t)s.buf, s.mr->rkey, 8, 1);
	CHECK(r == EINVAL, "post_send in INIT returned %d (%s), want EINVAL", r, strerror(r));
	OK("ibv_post_send on a QP in INIT: %s", strerror(r));
	free_side(&s);
}

/* A too-small CQ: four signaled WRITEs into a CQ of one entry. */
static void small_cq(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 1);
	for (int i = 0; i < 4; i++)
		CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, s.mr->rkey, 64, i) == 0,
		      "post WRITE %d", i);
	struct pollfd p = { .fd = c.ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int seen = 0;
	double end = now() + 5;
	while (!seen && now() < end) {
		if (poll(&p, 1, 100) != 1)
			continue;
		CHECK(ibv_get_async_event(c.ctx, &ev) == 0, "ibv_get_async_event");
		if (ev.event_type == IBV_EVENT_CQ_ERR) {
			CHECK(ev.element.cq == c.cq, "IBV_EVENT_CQ_ERR names another CQ");
			seen = 1;
		}
		ibv_ack_async_event(&ev);
	}
	CHECK(seen, "no IBV_EVENT_CQ_ERR within 5 s");
	struct ibv_wc wc[4];
	int n = ibv_poll_cq(c.cq, 4, wc);
	CHECK(n == 1, "the one-entry CQ returned %d completions", n);
	OK("too-small CQ: %s on the context's async fd; the CQ holds %d completion",
	   ibv_event_type_str(IBV_EVENT_CQ_ERR), n);
	free_side(&s);
	free_side(&c);
}

/* Polls one completion and checks its status and opcode. */
static void want_wc(struct ibv_cq *cq, enum ibv_wc_status st, enum ibv_wc_opcode op,
		    const char *what)
{
	struct ibv_wc wc = poll_one(cq, what);
	CHECK(wc.status == st && (st != IBV_WC_SUCCESS || wc.opcode == op),
	      "%s: status %s (%d), opcode %d; want %s, opcode %d", what,
	      ibv_wc_status_str(wc.status), wc.status, wc.opcode, ibv_wc_status_str(st), op);
}

/* 5: the server's windows over an MR with MW_BIND; the client WRITEs through them. */
static void memory_windows(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 16);
	struct ibv_mr *mr = ibv_reg_mr(s.pd, s.buf, BUF, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr with IBV_ACCESS_MW_BIND: %s", strerror(errno));
	errno = 0;
	CHECK(!ibv_alloc_mw(s.pd, 3) && errno == EINVAL, "ibv_alloc_mw of type 3: errno %s",
	      strerror(errno));

	struct ibv_mw *mw1 = ibv_alloc_mw(s.pd, IBV_MW_TYPE_1);
	CHECK(mw1 && mw1->type == IBV_MW_TYPE_1 && mw1->pd == s.pd, "ibv_alloc_mw type 1: %s",
	      strerror(errno));
	uint32_t old = mw1->rkey;
	struct ibv_mw_bind b = { .wr_id = 21, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = (uintptr_t)s.buf, .length = 64,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	int r = ibv_bind_mw(s.qp, mw1, &b);
	CHECK(r == 0, "ibv_bind_mw: %s", strerror(r));
	CHECK(mw1->rkey == ibv_inc_rkey(old), "ibv_bind_mw: rkey %#x, want %#x", mw1->rkey,
	      ibv_inc_rkey(old));
	want_wc(s.cq, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "type 1 bind");
	CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, mw1->rkey, 64, 22) == 0, "post WRITE");
	want_wc(c.cq, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE through the type 1 window");
	OK("type 1 window: ibv_bind_mw (rkey %#x -> %#x), IBV_WC_BIND_MW, a WRITE through it",
	   old, mw1->rkey);

	struct ibv_mw *mw2 = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
	CHECK(mw2, "ibv_alloc_mw type 2: %s", strerror(errno));
	uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr wr = { .wr_id = 23, .opcode = IBV_WR_BIND_MW,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = rkey2;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
		.addr = (uintptr_t)s.buf + 64, .length = 64,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_post_send(s.qp, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
	want_wc(s.cq, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "type 2 bind");
	CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf + 64, rkey2, 64, 24) == 0, "post WRITE");
	want_wc(c.cq, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "WRITE through the type 2 window");
	struct ibv_send_wr inv = { .wr_id = 25, .opcode = IBV_WR_LOCAL_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = rkey2 };
	CHECK(ibv_post_send(s.qp, &inv, &bad) == 0, "post IBV_WR_LOCAL_INV");
	want_wc(s.cq, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "LOCAL_INV of the type 2 window");
	CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf + 64, rkey2, 64, 26) == 0, "post WRITE");
	want_wc(c.cq, IBV_WC_REM_ACCESS_ERR, 0, "WRITE through the invalidated window");
	OK("type 2 window: IBV_WR_BIND_MW, a WRITE through it, LOCAL_INV, then %s",
	   ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));

	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	free_side(&s);
	free_side(&c);
}

/* 6: resize the client's CQ; below its queued completions is EINVAL. */
static void resize_cq(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 4);
	int r = ibv_resize_cq(c.cq, 1);
	CHECK(r == 0 && c.cq->cqe >= 1, "ibv_resize_cq to 1: %s, cqe %d", strerror(r), c.cq->cqe);
	CHECK(ibv_resize_cq(c.cq, 0) == EINVAL, "ibv_resize_cq to 0 is not EINVAL");
	r = ibv_resize_cq(c.cq, 8);
	CHECK(r == 0 && c.cq->cqe >= 8, "ibv_resize_cq to 8: %s, cqe %d", strerror(r), c.cq->cqe);
	memset(s.buf, 0, 64);
	for (int i = 0; i < 3; i++) {
		c.buf[63] = (char)(i + 1);
		CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, s.mr->rkey, 64, i) == 0,
		      "post WRITE %d", i);
	}
	/* The last WRITE landed; its ACK (and so its completion) follows within microseconds. */
	double end = now() + 5;
	while (((volatile char *)s.buf)[63] != 3)
		CHECK(now() < end, "the third WRITE did not land within 5 s");
	usleep(200 * 1000);
	CHECK(ibv_resize_cq(c.cq, 2) == EINVAL, "ibv_resize_cq below 3 queued completions");
	struct ibv_wc wc[8];
	int n = ibv_poll_cq(c.cq, 8, wc);
	CHECK(n == 3, "the resized CQ held %d completions, want 3", n);
	OK("ibv_resize_cq: 4 -> 1 -> 8 entries, EINVAL for 0 and below 3 queued completions");
	free_side(&s);
	free_side(&c);
}

/* 7: cmd_fd and device import. */
static void import_device(void)
{
	int fd = dup(ctx[0]->cmd_fd);
	CHECK(fd >= 0, "dup(cmd_fd %d): %s", ctx[0]->cmd_fd, strerror(errno));
	errno = 0;
	CHECK(!ibv_import_device(fd) && errno == EOPNOTSUPP, "ibv_import_device: errno %s",
	      strerror(errno));
	close(fd);
	OK("cmd_fd dups; ibv_import_device: %s", strerror(EOPNOTSUPP));
}

/* 8: an empty GID table entry. */
static void ah_from_wc(void)
{
	/* A receive from 10.1.2.3 to softroce0's own address (its GID index 1). */
	union ibv_gid me;
	CHECK(ibv_query_gid(ctx[0], 1, 1, &me) == 0, "ibv_query_gid");
	uint8_t grh[40] = { 0 };
	grh[20] = 0x45;
	grh[32] = 10, grh[33] = 1, grh[34] = 2, grh[35] = 3;
	memcpy(&grh[36], &me.raw[12], 4);
	struct ibv_wc wc = { .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RECV,
			     .wc_flags = IBV_WC_GRH };
	struct ibv_ah_attr a;
	int r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)grh, &a);
	CHECK(r == 0, "ibv_init_ah_from_wc: %d (%s)", r, strerror(errno));
	CHECK(a.is_global && a.grh.sgid_index == 1 && a.grh.dgid.raw[10] == 0xff &&
	      a.grh.dgid.raw[12] == 10 && a.grh.dgid.raw[15] == 3,
	      "ibv_init_ah_from_wc: sgid index %d, dgid byte 12 %d", a.grh.sgid_index,
	      a.grh.dgid.raw[12]);
	/* Without IBV_WC_GRH libibverbs 44 succeeds with no GRH (is_global 0), which
	 * ibv_create_ah then refuses on a RoCE port. */
	wc.wc_flags = 0;
	CHECK(ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)grh, &a) == 0 && !a.is_global,
	      "ibv_init_ah_from_wc without IBV_WC_GRH: is_global %d", a.is_global);
	OK("ibv_init_ah_from_wc: a GRH-flagged receive answers its IPv4 source from GID 1; "
	   "without the flag, no GRH");
}

static void gid_table(void)
{
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx[0], 1, &pa) == 0, "ibv_query_port");
	CHECK(pa.gid_tbl_len == 1024, "gid_tbl_len %d, want rxe's 1024", pa.gid_tbl_len);
	union ibv_gid gid;
	memset(&gid, 0xa5, sizeof(gid));
	CHECK(ibv_query_gid(ctx[0], 1, 7, &gid) == 0, "ibv_query_gid of empty index 7");
	for (int i = 0; i < 16; i++)
		CHECK(gid.raw[i] == 0, "empty GID 7: byte %d is %#x", i, gid.raw[i]);
	struct ibv_gid_entry e;
	int r = ibv_query_gid_ex(ctx[0], 1, 7, &e, 0);
	CHECK(r == ENODATA, "ibv_query_gid_ex of empty index 7: %d (%s), want ENODATA", r,
	      strerror(r));
	CHECK(ibv_query_gid_ex(ctx[0], 1, 1, &e, 0) == 0 && e.gid_index == 1 &&
	      e.gid_type == IBV_GID_TYPE_ROCE_V2, "ibv_query_gid_ex of index 1");
	CHECK(ibv_query_gid(ctx[0], 1, 1024, &gid) != 0, "ibv_query_gid past the table");
	OK("GID table of %d entries: index 7 empty (zeros, ibv_query_gid_ex %s)",
	   pa.gid_tbl_len, strerror(ENODATA));
}

/* Objects in use: EBUSY from ibv_dealloc_pd and ibv_destroy_cq, as kernel uverbs answers,
 * and the handles stay valid; in the right order every destroy succeeds. */
static void in_use(void)
{
	struct side s;
	struct ibv_pd *p = ibv_alloc_pd(ctx[0]);
	CHECK(p, "ibv_alloc_pd: %s", strerror(errno));
	struct ibv_pd *saved = pd[0];
	pd[0] = p;
	make_side(&s, 0, 16);
	pd[0] = saved;
	int r = ibv_dealloc_pd(p);
	CHECK(r == EBUSY && errno == EBUSY, "dealloc of a PD with a QP and an MR: %d", r);
	r = ibv_destroy_cq(s.cq);
	CHECK(r == EBUSY && errno == EBUSY, "destroy of a CQ a QP uses: %d", r);
	CHECK(ibv_destroy_qp(s.qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_cq(s.cq) == 0, "ibv_destroy_cq after its QP");
	r = ibv_dealloc_pd(p);
	CHECK(r == EBUSY, "dealloc of a PD with an MR: %d", r);
	CHECK(ibv_dereg_mr(s.mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_dealloc_pd(p) == 0, "ibv_dealloc_pd once unused");
	free(s.buf);
	OK("in use: ibv_dealloc_pd and ibv_destroy_cq EBUSY, then each destroy in order succeeds");
}

/* An async event of a CQ destroyed before the event was read is dropped, as the kernel's
 * destroy drops its object's unread events: ibv_get_async_event never names a NULL or
 * freed element (UCX reads element.qp->qp_num of every QP event; softroce handed it NULL
 * and UCX crashed in its async thread). */
static void event_of_a_destroyed_object(void)
{
	struct side s, c;
	make_pair(&s, &c, 16, 1);
	for (int i = 0; i < 4; i++)
		CHECK(post_write(&c, c.mr->lkey, (uintptr_t)s.buf, s.mr->rkey, 64, i) == 0,
		      "post WRITE %d", i);
	/* Wait (without reading) until the CQ's overrun is on the async fd. */
	struct pollfd p = { .fd = c.ctx->async_fd, .events = POLLIN };
	CHECK(poll(&p, 1, 5000) == 1, "no async event within 5 s");
	free_side(&c);
	int fl = fcntl(c.ctx->async_fd, F_GETFL);
	CHECK(fcntl(c.ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct ibv_async_event ev;
	int n = 0;
	while (ibv_get_async_event(c.ctx, &ev) == 0) {
		CHECK(ev.element.cq != NULL, "%s names a NULL element",
		      ibv_event_type_str(ev.event_type));
		CHECK(ev.event_type != IBV_EVENT_CQ_ERR, "IBV_EVENT_CQ_ERR of a destroyed CQ");
		ibv_ack_async_event(&ev);
		n++;
	}
	CHECK(errno == EAGAIN, "ibv_get_async_event: %s, want EAGAIN", strerror(errno));
	CHECK(fcntl(c.ctx->async_fd, F_SETFL, fl) == 0, "blocking again");
	OK("the async event of a destroyed CQ is dropped (%d other events, then EAGAIN)", n);
	free_side(&s);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(ibv_fork_init() == 0, "ibv_fork_init: %s", strerror(errno));
	OK("ibv_fork_init");
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 2, "need two devices (SOFTROCE_IP=A,B), have %d", list ? num : 0);
	for (int i = 0; i < 2; i++) {
		ctx[i] = ibv_open_device(list[i]);
		CHECK(ctx[i], "ibv_open_device %s: %s", ibv_get_device_name(list[i]), strerror(errno));
		pd[i] = ibv_alloc_pd(ctx[i]);
		CHECK(pd[i], "ibv_alloc_pd");
		/* The port-active event every device raises when it opens. */
		struct ibv_async_event ev;
		CHECK(ibv_get_async_event(ctx[i], &ev) == 0 &&
		      ev.event_type == IBV_EVENT_PORT_ACTIVE, "first async event");
		ibv_ack_async_event(&ev);
	}
	ibv_free_device_list(list);
	OK("two devices open, each raised IBV_EVENT_PORT_ACTIVE");

	flag_spin("before fork");
	two_threads();
	forked();
	wrong_lkey();
	wrong_rkey();
	wrong_state();
	small_cq();
	event_of_a_destroyed_object();
	memory_windows();
	resize_cq();
	import_device();
	gid_table();
	ah_from_wc();
	in_use();

	for (int i = 0; i < 2; i++) {
		ibv_dealloc_pd(pd[i]);
		ibv_close_device(ctx[i]);
	}
	printf("all passed\n");
	return 0;
}
