// rdma_create_srq / rdma_create_srq_ex / rdma_create_qp_ex over librdmacm, as rdma-core 44's
// librdmacm/cma.c defines them, run through `softroce exec` by tests/cm_srq.rs.
//
//   cm_srq server IP PORT   passive: rdma_create_ep, rdma_get_request, the error paths of
//                           rdma_create_srq_ex, rdma_create_srq (id's PD), rdma_create_qp (QP
//                           on the id's SRQ, recv CQ made by librdmacm), N receives posted to
//                           the SRQ, rdma_accept, N SENDs received through the SRQ,
//                           rdma_disconnect, rdma_destroy_ep.
//   cm_srq client IP PORT   active: rdma_create_ep without QP, the error paths of
//                           rdma_create_qp_ex, rdma_create_qp_ex with the caller's send CQ and
//                           no PD (the id's), rdma_connect, N SENDs, rdma_disconnect,
//                           rdma_destroy_qp (the caller's CQ survives it), rdma_destroy_ep.
//
// Every check that fails prints "FAIL: ..." and exits 1.
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N 5
#define MSG 64

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            printf("FAIL: " __VA_ARGS__);                                                  \
            printf(" (errno %d %s)\n", errno, strerror(errno));                           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// Polls `cq` for one completion, up to 10 s.
static struct ibv_wc poll_one(struct ibv_cq *cq, const char *what) {
    struct ibv_wc wc;
    double end = now() + 10;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        CHECK(now() < end, "no completion for %s within 10 s", what);
    CHECK(n == 1, "ibv_poll_cq for %s returned %d", what, n);
    CHECK(wc.status == IBV_WC_SUCCESS, "%s completed with %s", what,
          ibv_wc_status_str(wc.status));
    return wc;
}

static struct rdma_addrinfo *addrinfo(const char *ip, const char *port, int passive) {
    struct rdma_addrinfo hints = {0}, *res = NULL;
    hints.ai_port_space = RDMA_PS_TCP;
    if (passive)
        hints.ai_flags = RAI_PASSIVE;
    CHECK(rdma_getaddrinfo(ip, port, &hints, &res) == 0, "rdma_getaddrinfo %s:%s", ip, port);
    return res;
}

static int server(const char *ip, const char *port) {
    struct rdma_addrinfo *res = addrinfo(ip, port, 1);
    struct rdma_cm_id *listen_id, *id;
    CHECK(rdma_create_ep(&listen_id, res, NULL, NULL) == 0, "rdma_create_ep (passive)");
    rdma_freeaddrinfo(res);
    CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");
    printf("[server] listening on %s:%s\n", ip, port);
    fflush(stdout);
    CHECK(rdma_get_request(listen_id, &id) == 0, "rdma_get_request");
    CHECK(id->qp == NULL, "rdma_get_request made a QP without qp_init_attr");

    // rdma_create_srq_ex: IBV_SRQ_INIT_ATTR_TYPE is required.
    struct ibv_srq_init_attr_ex sx = {0};
    sx.attr.max_wr = N;
    sx.attr.max_sge = 1;
    sx.comp_mask = IBV_SRQ_INIT_ATTR_PD;
    errno = 0;
    CHECK(rdma_create_srq_ex(id, &sx) == -1 && errno == EINVAL,
          "rdma_create_srq_ex without IBV_SRQ_INIT_ATTR_TYPE did not fail with EINVAL");
    printf("[server] rdma_create_srq_ex without TYPE: EINVAL\n");

    // An XRC SRQ needs an XRC domain, which the device does not have: the receive CQ
    // librdmacm made for it is gone again.
    memset(&sx, 0, sizeof(sx));
    sx.attr.max_wr = N;
    sx.attr.max_sge = 1;
    sx.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
    sx.srq_type = IBV_SRQT_XRC;
    errno = 0;
    CHECK(rdma_create_srq_ex(id, &sx) == -1 && errno == EOPNOTSUPP,
          "rdma_create_srq_ex(XRC) did not fail with EOPNOTSUPP");
    CHECK(id->srq == NULL && id->recv_cq == NULL && id->recv_cq_channel == NULL,
          "a failed rdma_create_srq_ex left an SRQ or CQ in the id");
    printf("[server] rdma_create_srq_ex(XRC): EOPNOTSUPP, nothing left behind\n");

    // The SRQ on the id's PD (pd NULL), no CQ made for a BASIC SRQ.
    struct ibv_srq_init_attr sa = {0};
    sa.attr.max_wr = N;
    sa.attr.max_sge = 1;
    CHECK(rdma_create_srq(id, NULL, &sa) == 0, "rdma_create_srq");
    CHECK(id->srq != NULL && id->srq->pd == id->pd, "rdma_create_srq: srq %p pd %p/%p",
          (void *)id->srq, id->srq ? (void *)id->srq->pd : NULL, (void *)id->pd);
    CHECK(id->recv_cq == NULL, "rdma_create_srq made a CQ for a BASIC SRQ");

    // The QP takes the id's SRQ; librdmacm makes its send and receive CQs.
    struct ibv_qp_init_attr qa = {0};
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 4;
    // With an SRQ the QP has no receive queue of its own, but librdmacm sizes the receive CQ
    // it makes by max_recv_wr: room for all N completions (else a slow poller overruns it).
    qa.cap.max_recv_wr = N;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp on an id with an SRQ");
    CHECK(qa.srq == id->srq && id->qp->srq == id->srq, "the QP is not on the id's SRQ");
    CHECK(id->recv_cq != NULL && id->send_cq != NULL && id->recv_cq_channel != NULL &&
              qa.recv_cq == id->recv_cq && id->qp->recv_cq == id->recv_cq,
          "rdma_create_qp did not make and report the id's CQs");
    errno = 0;
    CHECK(rdma_create_qp(id, NULL, &qa) == -1 && errno == EINVAL,
          "a second rdma_create_qp on the id did not fail with EINVAL");
    printf("[server] QP %u on the id's SRQ; second rdma_create_qp: EINVAL\n", id->qp->qp_num);

    char *buf = calloc(N, MSG);
    struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, N * MSG, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL, "ibv_reg_mr");
    for (int i = 0; i < N; i++) {
        struct ibv_sge sge = {(uintptr_t)(buf + i * MSG), MSG, mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
        CHECK(ibv_post_srq_recv(id->srq, &wr, &bad) == 0, "ibv_post_srq_recv %d", i);
    }
    CHECK(rdma_accept(id, NULL) == 0, "rdma_accept");
    printf("[server] connected\n");

    for (int i = 0; i < N; i++) {
        struct ibv_wc wc = poll_one(id->recv_cq, "a receive");
        CHECK(wc.opcode == IBV_WC_RECV && wc.qp_num == id->qp->qp_num && wc.wr_id < N,
              "receive %d: opcode %d qp %u wr_id %llu", i, wc.opcode, wc.qp_num,
              (unsigned long long)wc.wr_id);
        char want[MSG];
        snprintf(want, sizeof(want), "message %d through the SRQ", i);
        CHECK(wc.byte_len == strlen(want) + 1 && strcmp(buf + wc.wr_id * MSG, want) == 0,
              "receive %d: %u bytes '%s'", i, wc.byte_len, buf + wc.wr_id * MSG);
        printf("[server] received: '%s'\n", buf + wc.wr_id * MSG);
    }
    printf("[server] received %d SENDs through the SRQ\n", N);

    CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    rdma_destroy_ep(id);
    rdma_destroy_ep(listen_id);
    free(buf);
    printf("[server] done\n");
    return 0;
}

static int client(const char *ip, const char *port) {
    struct rdma_addrinfo *res = addrinfo(ip, port, 0);
    struct rdma_cm_id *id;
    CHECK(rdma_create_ep(&id, res, NULL, NULL) == 0, "rdma_create_ep (active)");
    rdma_freeaddrinfo(res);
    CHECK(id->qp == NULL && id->pd != NULL, "rdma_create_ep: qp %p pd %p", (void *)id->qp,
          (void *)id->pd);

    struct ibv_cq *scq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
    CHECK(scq != NULL, "ibv_create_cq");

    // A comp_mask bit libibverbs' create_qp_ex refuses: no QP, and the receive CQ
    // librdmacm made for it is gone again.
    struct ibv_qp_init_attr_ex qx = {0};
    qx.qp_type = IBV_QPT_RC;
    qx.cap.max_send_wr = 8;
    qx.cap.max_recv_wr = 1;
    qx.cap.max_send_sge = 1;
    qx.cap.max_recv_sge = 1;
    qx.send_cq = scq;
    qx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER;
    qx.max_tso_header = 64;
    errno = 0;
    CHECK(rdma_create_qp_ex(id, &qx) == -1 && errno == EOPNOTSUPP,
          "rdma_create_qp_ex with MAX_TSO_HEADER did not fail with EOPNOTSUPP");
    CHECK(id->qp == NULL && id->recv_cq == NULL && id->recv_cq_channel == NULL,
          "a failed rdma_create_qp_ex left a QP or CQ in the id");
    printf("[client] rdma_create_qp_ex(MAX_TSO_HEADER): EOPNOTSUPP, nothing left behind\n");

    // comp_mask PD with a NULL PD: the id's PD. The caller's send CQ is used and not kept
    // in the id; the receive CQ is librdmacm's.
    qx.comp_mask = IBV_QP_INIT_ATTR_PD;
    qx.pd = NULL;
    qx.max_tso_header = 0;
    qx.recv_cq = NULL;
    CHECK(rdma_create_qp_ex(id, &qx) == 0, "rdma_create_qp_ex");
    CHECK(qx.pd == id->pd && id->qp->pd == id->pd, "rdma_create_qp_ex did not use the id's PD");
    CHECK(id->send_cq == NULL && id->qp->send_cq == scq, "the caller's send CQ: id %p qp %p",
          (void *)id->send_cq, (void *)id->qp->send_cq);
    CHECK(id->recv_cq != NULL && qx.recv_cq == id->recv_cq, "no receive CQ made");
    errno = 0;
    CHECK(rdma_create_qp_ex(id, &qx) == -1 && errno == EINVAL,
          "a second rdma_create_qp_ex did not fail with EINVAL");
    printf("[client] QP %u from rdma_create_qp_ex; second one: EINVAL\n", id->qp->qp_num);

    CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
    printf("[client] connected\n");

    char *buf = calloc(N, MSG);
    struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, N * MSG, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL, "ibv_reg_mr");
    for (int i = 0; i < N; i++) {
        char *m = buf + i * MSG;
        snprintf(m, MSG, "message %d through the SRQ", i);
        struct ibv_sge sge = {(uintptr_t)m, (uint32_t)strlen(m) + 1, mr->lkey};
        struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1,
                                 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED},
                           *bad;
        CHECK(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send %d", i);
        struct ibv_wc wc = poll_one(scq, "a SEND");
        CHECK(wc.wr_id == (uint64_t)i && wc.opcode == IBV_WC_SEND, "SEND %d completion", i);
    }
    printf("[client] sent %d SENDs\n", N);

    // Both sides disconnect, as librdmacm's examples/rdma_client.c and rdma_server.c do.
    CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
    printf("[client] disconnected\n");

    rdma_destroy_qp(id);
    CHECK(id->qp == NULL && id->recv_cq == NULL && id->recv_cq_channel == NULL,
          "rdma_destroy_qp left the QP or librdmacm's CQ");
    CHECK(ibv_destroy_cq(scq) == 0, "the caller's CQ did not survive rdma_destroy_qp");
    CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
    rdma_destroy_ep(id);
    free(buf);
    printf("[client] done\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "server") == 0)
        return server(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "client") == 0)
        return client(argv[2], argv[3]);
    fprintf(stderr, "usage: %s server|client IP PORT\n", argv[0]);
    return 2;
}
