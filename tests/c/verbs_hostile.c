/*
 * softroce's libibverbs.so.1 fed hostile arguments, each answered as rdma-core 44 on kernel
 * rxe answers it (or, where rxe would crash or register something unusable, as recorded in
 * spec/deviations.toml), on two softroce devices of one process (SOFTROCE_IP=A,B):
 *
 *   1. IBV_SEND_INLINE: 0 bytes from a NULL address (one SGE, and no SGE), exactly
 *      cap.max_inline_data bytes (SEND from the stack, RDMA WRITE to the MR's last bytes),
 *      one byte more (EINVAL, *bad_wr), SGEs adding up past the limit (EINVAL), two SGEs
 *      whose 32-bit sum wraps to 0 (EINVAL: rxe's provider sums in 32 bits and would copy
 *      4 GiB into its WQE), more SGEs than max_send_sge (EINVAL); ibv_wr_set_inline_data_list
 *      of 2^62 / SIZE_MAX buffers whose first is too long and ibv_wr_set_inline_data of
 *      SIZE_MAX bytes (ENOSPC from ibv_wr_complete);
 *   2. ibv_init_ah_from_wc / ibv_create_ah_from_wc over garbage GRH areas: all zeros and
 *      all 0xff (-1, EPROTONOSUPPORT), rxe's IPv4 layout with a wrong checksum (IPv4: the
 *      checksum is only consulted when the first nibble says 6), first nibble 6 over an
 *      IPv4 header with a right checksum (IPv4) and with a wrong one (IPv6, whose next
 *      header 0 is EPROTONOSUPPORT), a multicast IPv4 destination (EINVAL);
 *   3. ibv_reg_mr_iova at IOVA 0 and at the top of the 64-bit space (the range ending at
 *      2^64): WRITE / READ at the first and last bytes work, one byte past is
 *      IBV_WC_REM_ACCESS_ERR; a range that would wrap past 2^64 is EINVAL;
 *   4. a zero-based type 2 window as long as its MR: its last byte is reachable, one past
 *      is IBV_WC_REM_ACCESS_ERR; a bind longer than the MR completes IBV_WC_MW_BIND_ERR.
 *
 * Prints "ok - ..." per check, "FAIL - ..." and exits 1 at the first failure. Compiled and
 * run by tests/capi_c.rs through `softroce exec`; every wait has a deadline.
 */
#include <unistd.h>

#include "rc_pair.h"

/* No completion arrives on `cq` within 200 ms. */
static void want_none(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 0.2;
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n == 0, "%s: a completion came (status %s)", what,
		      n > 0 ? ibv_wc_status_str(wc.status) : "poll error");
	}
}

static void pair(struct rc *s, struct rc *c, uint32_t inl)
{
	rc_make(s, 0, inl, 0);
	rc_make(c, 1, inl, 0);
	rc_connect(s, c);
	rc_connect(c, s);
}

static void unpair(struct rc *s, struct rc *c)
{
	rc_free(s);
	rc_free(c);
}

/* 1: IBV_SEND_INLINE at and past its limits. */
static void inline_edges(void)
{
	struct rc s, c;
	pair(&s, &c, 64);
	uint32_t max = c.cap.max_inline_data;
	CHECK(max == 64 && c.cap.max_send_sge == 4, "caps %u / %u, want rxe's 64 / 4", max,
	      c.cap.max_send_sge);
	struct ibv_send_wr *bad = NULL;

	/* 0 bytes from NULL, as one SGE and as none. */
	struct ibv_sge null_sge = { .addr = 0, .length = 0, .lkey = 0 };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &null_sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	for (int none = 0; none < 2; none++) {
		post_recv(s.qp, s.mr, s.buf, 256);
		w.num_sge = none ? 0 : 1;
		w.sg_list = none ? NULL : &null_sge;
		CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "INLINE SEND of 0 bytes (%d SGE): %s",
		      w.num_sge, strerror(errno));
		want_ok(c.cq, IBV_WC_SEND, "INLINE SEND of 0 bytes");
		struct ibv_wc r = poll_one(s.cq, "0-byte receive");
		CHECK(r.status == IBV_WC_SUCCESS && r.byte_len == 0, "0-byte receive: %s, %u bytes",
		      ibv_wc_status_str(r.status), r.byte_len);
	}
	OK("IBV_SEND_INLINE of 0 bytes from a NULL address (1 SGE) and with no SGE: sent, "
	   "received as 0 bytes");

	/* Exactly max_inline_data bytes from the stack, in 4 SGEs. */
	char stack[64];
	fill(stack, 64, 3);
	struct ibv_sge four[4];
	for (int i = 0; i < 4; i++)
		four[i] = (struct ibv_sge){ .addr = (uintptr_t)stack + 16 * i, .length = 16 };
	post_recv(s.qp, s.mr, s.buf, 256);
	w.sg_list = four;
	w.num_sge = 4;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "INLINE SEND of max_inline_data bytes: %s",
	      strerror(errno));
	memset(stack, 0, sizeof stack);
	want_ok(c.cq, IBV_WC_SEND, "INLINE SEND of max_inline_data bytes");
	struct ibv_wc r = poll_one(s.cq, "max_inline_data receive");
	CHECK(r.byte_len == 64 && same(s.buf, 64, 3), "max_inline_data receive: %u bytes",
	      r.byte_len);

	/* RDMA WRITE of max_inline_data bytes to the peer MR's last bytes. */
	fill(stack, 64, 9);
	struct ibv_sge one = { .addr = (uintptr_t)stack, .length = 64 };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &one, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		.wr.rdma = { .remote_addr = (uintptr_t)s.buf + BUF - 64, .rkey = s.mr->rkey } };
	CHECK(ibv_post_send(c.qp, &wr, &bad) == 0, "INLINE WRITE of max bytes");
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "INLINE WRITE to the MR's last 64 bytes");
	CHECK(same(s.buf + BUF - 64, 64, 9), "INLINE WRITE: data wrong");
	OK("IBV_SEND_INLINE of exactly max_inline_data (%u) bytes: SEND in 4 SGEs from the "
	   "stack, RDMA WRITE to the MR's last bytes", max);

	/* One byte more; SGEs adding up past it; a 32-bit sum that wraps; too many SGEs. */
	struct ibv_send_wr first = { .wr_id = 7, .sg_list = &one, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
		.wr.rdma = wr.wr.rdma, .next = &w };
	one.length = 64;
	char big[65];
	struct ibv_sge over = { .addr = (uintptr_t)big, .length = max + 1 };
	w.sg_list = &over;
	w.num_sge = 1;
	bad = NULL;
	CHECK(ibv_post_send(c.qp, &first, &bad) == EINVAL && bad == &w,
	      "INLINE of max_inline_data + 1 bytes after a good WR: want EINVAL at the second");
	want_ok(c.cq, IBV_WC_RDMA_WRITE, "the good WR before the bad one");
	for (int i = 0; i < 4; i++)
		four[i] = (struct ibv_sge){ .addr = (uintptr_t)big, .length = 17 };
	w.sg_list = four;
	w.num_sge = 4;
	bad = NULL;
	CHECK(ibv_post_send(c.qp, &w, &bad) == EINVAL && bad == &w,
	      "4 inline SGEs of 17 bytes (68 > 64): want EINVAL");
	struct ibv_sge wrap[2] = { { .addr = 0, .length = 0x80000000u },
				   { .addr = 0, .length = 0x80000000u } };
	w.sg_list = wrap;
	w.num_sge = 2;
	bad = NULL;
	CHECK(ibv_post_send(c.qp, &w, &bad) == EINVAL && bad == &w,
	      "2 inline SGEs of 2 GiB (32-bit sum 0): want EINVAL");
	struct ibv_sge five[5] = { { 0 } };
	w.sg_list = five;
	w.num_sge = 5;
	w.send_flags = IBV_SEND_SIGNALED;
	bad = NULL;
	CHECK(ibv_post_send(c.qp, &w, &bad) == EINVAL && bad == &w,
	      "5 SGEs with max_send_sge 4: want EINVAL");
	want_none(c.cq, "refused WRs");
	OK("max_inline_data + 1 bytes, 4 x 17 bytes, 2 x 2 GiB (wrapping), 5 SGEs: %s with "
	   "*bad_wr, nothing sent", strerror(EINVAL));
	unpair(&s, &c);
}

/* 1b: ibv_wr_set_inline_data(_list) with absurd lengths and counts: ENOSPC from
 * ibv_wr_complete, the list read only up to the entry that passes the limit (rxe's
 * provider reads it the same way); the QP still works afterwards. */
static void inline_wr_edges(void)
{
	struct rc s, c;
	rc_make(&s, 0, 64, 1);
	rc_make(&c, 1, 64, 1);
	rc_connect(&s, &c);
	rc_connect(&c, &s);
	struct ibv_qp_ex *x = c.qpx;
	char stack[64];
	struct ibv_data_buf over[1] = { { .addr = stack, .length = 65 } };
	size_t counts[2] = { (size_t)1 << 62, SIZE_MAX };
	for (int i = 0; i < 2; i++) {
		ibv_wr_start(x);
		x->wr_id = 20;
		x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_send(x);
		ibv_wr_set_inline_data_list(x, counts[i], over);
		int r = ibv_wr_complete(x);
		CHECK(r == ENOSPC, "inline list of %zu buffers, the first too long: %d (%s)",
		      counts[i], r, strerror(r));
	}
	ibv_wr_start(x);
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, NULL, SIZE_MAX);
	int r = ibv_wr_complete(x);
	CHECK(r == ENOSPC, "inline data of SIZE_MAX bytes: %d (%s)", r, strerror(r));
	want_none(c.cq, "refused inline WRs");
	post_recv(s.qp, s.mr, s.buf, 256);
	fill(stack, 64, 5);
	ibv_wr_start(x);
	x->wr_id = 21;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, stack, 64);
	CHECK(ibv_wr_complete(x) == 0, "inline data of max_inline_data bytes");
	/* A negative count takes nothing and returns 0 (rxe_poll_cq), leaving the completion
	 * (given 50 ms to arrive) for the next poll. */
	usleep(50000);
	struct ibv_wc dummy;
	int polled = ibv_poll_cq(c.cq, -1, &dummy);
	CHECK(polled == 0 && ibv_poll_cq(c.cq, INT32_MIN, NULL) == 0,
	      "ibv_poll_cq with a negative count: %d, want 0 as rxe", polled);
	want_ok(c.cq, IBV_WC_SEND, "inline send after the refusals");
	struct ibv_wc rw = poll_one(s.cq, "inline receive after the refusals");
	CHECK(rw.byte_len == 64 && same(s.buf, 64, 5), "inline receive: %u bytes", rw.byte_len);
	OK("ibv_wr_set_inline_data_list of 2^62 and SIZE_MAX buffers whose first passes the "
	   "limit, ibv_wr_set_inline_data of SIZE_MAX bytes: %s from ibv_wr_complete; then 64 "
	   "bytes go through; ibv_poll_cq with a negative count: 0", strerror(ENOSPC));
	unpair(&s, &c);
}

/* 2: ibv_init_ah_from_wc over garbage GRH areas. */
static uint16_t csum(const unsigned char *h)
{
	uint32_t sum = 0;
	for (int i = 0; i < 20; i += 2)
		if (i != 10)
			sum += (uint32_t)h[i] << 8 | h[i + 1];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/* A GRH area as rxe writes it for IPv4: 20 zero bytes, then the IPv4 header from
 * device 1 to device 0 (TTL 33, TOS 0x28), with a right checksum. */
static void ipv4_area(unsigned char *g)
{
	memset(g, 0, 40);
	unsigned char *h = g + 20;
	h[0] = 0x45;
	h[1] = 0x28;
	h[3] = 40;
	h[8] = 33;
	h[9] = 17;
	memcpy(h + 12, &gid[1].raw[12], 4);
	memcpy(h + 16, &gid[0].raw[12], 4);
	uint16_t c = csum(h);
	h[10] = c >> 8;
	h[11] = c & 0xff;
}

static void ah_garbage(void)
{
	struct ibv_wc wc = { .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RECV,
			     .wc_flags = IBV_WC_GRH, .src_qp = 0x42 };
	unsigned char g[40];
	struct ibv_ah_attr a;
	int r;

	for (int fill_byte = 0; fill_byte < 0x100; fill_byte += 0xff) {
		memset(g, fill_byte, sizeof g);
		errno = 0;
		r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
		CHECK(r == -1 && errno == EPROTONOSUPPORT,
		      "GRH area of %#x bytes: %d, errno %s; want -1, EPROTONOSUPPORT", fill_byte,
		      r, strerror(errno));
		errno = 0;
		CHECK(!ibv_create_ah_from_wc(pd[0], &wc, (struct ibv_grh *)g, 1) &&
		      errno == EPROTONOSUPPORT, "ibv_create_ah_from_wc over %#x bytes: errno %s",
		      fill_byte, strerror(errno));
	}
	OK("GRH area all 0x00 / all 0xff: -1 with %s, ibv_create_ah_from_wc NULL",
	   strerror(EPROTONOSUPPORT));

	/* rxe's layout with a wrong checksum: still IPv4. */
	ipv4_area(g);
	g[31] ^= 0x5a;
	r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
	CHECK(r == 0 && a.is_global && !memcmp(&a.grh.dgid, &gid[1], 16) &&
	      a.grh.sgid_index == 1 && a.grh.hop_limit == 33 && a.grh.traffic_class == 0x28,
	      "IPv4 area with a wrong checksum: %d (%s), hop_limit %u, tclass %#x", r,
	      strerror(errno), a.grh.hop_limit, a.grh.traffic_class);
	struct ibv_ah *ah = ibv_create_ah_from_wc(pd[0], &wc, (struct ibv_grh *)g, 1);
	CHECK(ah, "ibv_create_ah_from_wc of an IPv4 area: %s", strerror(errno));
	ibv_destroy_ah(ah);

	/* First nibble 6 over an IPv4 header: IPv4 if its checksum is right... */
	ipv4_area(g);
	g[0] = 0x60;
	r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
	CHECK(r == 0 && !memcmp(&a.grh.dgid, &gid[1], 16) && a.grh.hop_limit == 33,
	      "nibble 6 over a checked IPv4 header: %d (%s)", r, strerror(errno));
	/* ... else IPv6, whose next header (byte 6: 0) is neither UDP nor 0x1b. */
	g[31] ^= 0x5a;
	errno = 0;
	r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
	CHECK(r == -1 && errno == EPROTONOSUPPORT,
	      "nibble 6 over an IPv4 header with a wrong checksum: %d, errno %s", r,
	      strerror(errno));
	/* IPv6, next header UDP, destination GID that is none of ours: EINVAL. */
	g[6] = 17;
	errno = 0;
	r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
	CHECK(r == -1 && errno == EINVAL, "IPv6 area to no GID of ours: %d, errno %s", r,
	      strerror(errno));
	/* A multicast IPv4 destination. */
	ipv4_area(g);
	g[36] = 224;
	errno = 0;
	r = ibv_init_ah_from_wc(ctx[0], 1, &wc, (struct ibv_grh *)g, &a);
	CHECK(r == -1 && errno == EINVAL, "multicast IPv4 destination: %d, errno %s", r,
	      strerror(errno));
	OK("IPv4 area with a wrong checksum: IPv4 (TTL -> hop_limit, TOS -> traffic_class); "
	   "nibble 6 over a checked IPv4 header: IPv4; unchecked: IPv6 (next header 0: %s, "
	   "unknown GID: %s); multicast destination: %s", strerror(EPROTONOSUPPORT),
	   strerror(EINVAL), strerror(EINVAL));
}

/* One RDMA op of `len` bytes at remote `va` through `rkey`; its completion status. The QP
 * pair is fresh each time (an access error moves it to ERR). */
static enum ibv_wc_status remote_op(enum ibv_wr_opcode op, uint64_t va, uint32_t rkey,
				    uint32_t len, int seed, struct ibv_mr **mr_on_s,
				    void (*make_mr)(struct rc *, struct ibv_mr **))
{
	struct rc s, c;
	pair(&s, &c, 0);
	make_mr(&s, mr_on_s);
	if (!rkey)
		rkey = (*mr_on_s)->rkey;
	fill(c.buf, len, seed);
	struct ibv_sge sge = { .addr = (uintptr_t)c.buf, .length = len, .lkey = c.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = va, .rkey = rkey } };
	struct ibv_send_wr *bad;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post RDMA op at %#llx",
	      (unsigned long long)va);
	struct ibv_wc wc = poll_one(c.cq, "RDMA op");
	ibv_dereg_mr(*mr_on_s);
	unpair(&s, &c);
	return wc.status;
}

static char *page;
static uint64_t cur_iova;

static void iova_mr_make(struct rc *s, struct ibv_mr **mr)
{
	(void)s;
	*mr = ibv_reg_mr_iova(pd[0], page, 4096, cur_iova, IBV_ACCESS_LOCAL_WRITE |
			      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(*mr, "ibv_reg_mr_iova at %#llx: %s", (unsigned long long)cur_iova,
	      strerror(errno));
}

/* 3: ibv_reg_mr_iova at the ends of the 64-bit space. */
static void iova_edges(void)
{
	page = aligned_alloc(4096, 4096);
	CHECK(page, "aligned_alloc");
	uint64_t tops[2] = { 0, 0ull - 4096 };
	for (int t = 0; t < 2; t++) {
		cur_iova = tops[t];
		struct ibv_mr *mr;
		memset(page, 0, 4096);
		enum ibv_wc_status st;
		st = remote_op(IBV_WR_RDMA_WRITE, cur_iova, 0, 16, 1, &mr, iova_mr_make);
		CHECK(st == IBV_WC_SUCCESS && same(page, 16, 1), "WRITE at the IOVA %#llx: %s",
		      (unsigned long long)cur_iova, ibv_wc_status_str(st));
		st = remote_op(IBV_WR_RDMA_WRITE, cur_iova + 4096 - 16, 0, 16, 2, &mr,
			       iova_mr_make);
		CHECK(st == IBV_WC_SUCCESS && same(page + 4096 - 16, 16, 2),
		      "WRITE to the last 16 bytes at %#llx: %s",
		      (unsigned long long)(cur_iova + 4096 - 16), ibv_wc_status_str(st));
		st = remote_op(IBV_WR_RDMA_READ, cur_iova + 4096 - 1, 0, 1, 3, &mr, iova_mr_make);
		CHECK(st == IBV_WC_SUCCESS, "READ of the last byte: %s", ibv_wc_status_str(st));
		st = remote_op(IBV_WR_RDMA_WRITE, cur_iova + 4096 - 16, 0, 17, 4, &mr,
			       iova_mr_make);
		CHECK(st == IBV_WC_REM_ACCESS_ERR, "WRITE one byte past the end: %s",
		      ibv_wc_status_str(st));
		st = remote_op(IBV_WR_RDMA_READ, cur_iova - 1, 0, 2, 5, &mr, iova_mr_make);
		CHECK(st == IBV_WC_REM_ACCESS_ERR, "READ from one byte before the start: %s",
		      ibv_wc_status_str(st));
		OK("ibv_reg_mr_iova at %#llx: WRITE / READ at the first and last bytes, one byte "
		   "past either end %s", (unsigned long long)cur_iova,
		   ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR));
	}
	errno = 0;
	CHECK(!ibv_reg_mr_iova(pd[0], page, 4096, 0ull - 2048 - 4096 + 0, IBV_ACCESS_LOCAL_WRITE)
	      && errno == EINVAL, "IOVA at another page offset: errno %s", strerror(errno));
	char *two = aligned_alloc(4096, 8192);
	CHECK(two, "aligned_alloc");
	errno = 0;
	CHECK(!ibv_reg_mr_iova(pd[0], two, 8192, 0ull - 4096, IBV_ACCESS_LOCAL_WRITE) &&
	      errno == EINVAL, "an IOVA range wrapping past 2^64: errno %s", strerror(errno));
	free(two);
	free(page);
	OK("an IOVA range that would wrap past 2^64: %s (deviation: rxe registers it)",
	   strerror(EINVAL));
}

/* 4: a zero-based type 2 window as long as its MR. */
static void mw_edges(void)
{
	for (int past = 0; past < 3; past++) {
		struct rc s, c;
		pair(&s, &c, 0);
		struct ibv_mr *mr = ibv_reg_mr(pd[0], s.buf, BUF, IBV_ACCESS_LOCAL_WRITE |
					       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					       IBV_ACCESS_MW_BIND);
		CHECK(mr, "ibv_reg_mr with MW_BIND");
		struct ibv_mw *mw = ibv_alloc_mw(pd[0], IBV_MW_TYPE_2);
		CHECK(mw, "ibv_alloc_mw");
		uint32_t rkey = ibv_inc_rkey(mw->rkey);
		struct ibv_send_wr wr = { .wr_id = 2, .opcode = IBV_WR_BIND_MW,
			.send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = rkey;
		wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr,
			.addr = (uintptr_t)s.buf, .length = BUF + (past == 2),
			.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					   IBV_ACCESS_ZERO_BASED };
		CHECK(ibv_post_send(s.qp, &wr, &bad) == 0, "post the bind");
		struct ibv_wc bw = poll_one(s.cq, "bind");
		if (past == 2) {
			CHECK(bw.status == IBV_WC_MW_BIND_ERR, "bind longer than the MR: %s",
			      ibv_wc_status_str(bw.status));
		} else {
			CHECK(bw.status == IBV_WC_SUCCESS, "bind as long as the MR: %s",
			      ibv_wc_status_str(bw.status));
			fill(c.buf, 16, 77);
			struct ibv_sge sge = { .addr = (uintptr_t)c.buf, .length = 16 + past,
					       .lkey = c.mr->lkey };
			struct ibv_send_wr w = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = { .remote_addr = BUF - 16, .rkey = rkey } };
			CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post WRITE through the window");
			struct ibv_wc wc = poll_one(c.cq, "WRITE through the window");
			if (past)
				CHECK(wc.status == IBV_WC_REM_ACCESS_ERR,
				      "WRITE one byte past the window: %s",
				      ibv_wc_status_str(wc.status));
			else
				CHECK(wc.status == IBV_WC_SUCCESS && same(s.buf + BUF - 16, 16, 77),
				      "WRITE to the window's last 16 bytes: %s",
				      ibv_wc_status_str(wc.status));
		}
		ibv_dealloc_mw(mw);
		ibv_dereg_mr(mr);
		unpair(&s, &c);
	}
	OK("zero-based type 2 window over a whole %d-byte MR: its last 16 bytes written, one "
	   "byte past %s; a bind one byte longer than the MR %s", BUF,
	   ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), ibv_wc_status_str(IBV_WC_MW_BIND_ERR));
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	open_devices();

	inline_edges();
	inline_wr_edges();
	ah_garbage();
	iova_edges();
	mw_edges();

	close_devices();
	printf("all passed\n");
	return 0;
}
