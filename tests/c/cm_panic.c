/* No silent hang (issue 22): a thread softroce starts that panics fails what waits on it.
 * Run through `softroce exec --ip IP` with the test hook SOFTROCE_TEST_PANIC=rdmacm:<ms>
 * (librdmacm's CM driver thread panics) or device:<ms> (libibverbs' device driver thread
 * panics); argv[1] is the device address, argv[2] "rdmacm" or "device". A listener blocks in
 * rdma_get_cm_event until the panic, then gets RDMA_CM_EVENT_DEVICE_REMOVAL with status
 * -EIO, and so does a listener on the wildcard address (the process has no other device);
 * binding a new id to the device fails with EIO, and a synchronous listener's
 * rdma_get_request (its event came meanwhile) fails with EIO. With "device", a completion channel
 * wait (ibv_get_cq_event) on the device fails with EIO too, and ibv_get_async_event gives
 * IBV_EVENT_DEVICE_FATAL. Prints one line per check and "cm_panic: end N" (N failed
 * checks), exiting with N. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
	struct sockaddr_in a, b;
	struct rdma_event_channel *ch, *wild_ch;
	struct rdma_cm_id *listen, *late, *sync_listen, *req, *wild;
	struct rdma_addrinfo hints, *res;
	struct rdma_cm_event *ev = NULL;
	struct ibv_comp_channel *cc = NULL;
	struct ibv_cq *cq = NULL;
	int device, rc, err;

	if (argc != 3) {
		fprintf(stderr, "usage: cm_panic IP rdmacm|device\n");
		return 100;
	}
	device = strcmp(argv[2], "device") == 0;
	a = in4(argv[1], 7471);
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen, (struct sockaddr *)&a) || rdma_listen(listen, 1)) {
		perror("listener");
		return 100;
	}
	b = in4("0.0.0.0", 7474);
	wild_ch = rdma_create_event_channel();
	if (!wild_ch || rdma_create_id(wild_ch, &wild, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(wild, (struct sockaddr *)&b) || rdma_listen(wild, 1)) {
		perror("wildcard listener");
		return 100;
	}
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_port_space = RDMA_PS_TCP;
	if (rdma_getaddrinfo(argv[1], "7473", &hints, &res) ||
	    rdma_create_ep(&sync_listen, res, NULL, NULL) || rdma_listen(sync_listen, 1)) {
		perror("synchronous listener");
		return 100;
	}
	rdma_freeaddrinfo(res);
	if (device) {
		cc = ibv_create_comp_channel(listen->verbs);
		cq = cc ? ibv_create_cq(listen->verbs, 4, NULL, cc, 0) : NULL;
		if (!cq || ibv_req_notify_cq(cq, 0)) {
			perror("completion channel");
			return 100;
		}
	}
	/* Blocks until the panic: before softroce caught it, forever. */
	rc = rdma_get_cm_event(ch, &ev);
	CHECK(rc == 0 && ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL && ev->status == -EIO,
	      "a blocked rdma_get_cm_event returns DEVICE_REMOVAL, status -EIO (rc %d, %s, status %d)",
	      rc, rc == 0 ? rdma_event_str(ev->event) : "-", rc == 0 ? ev->status : 0);
	if (rc == 0)
		rdma_ack_cm_event(ev);
	rc = rdma_get_cm_event(wild_ch, &ev);
	CHECK(rc == 0 && ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL && ev->status == -EIO,
	      "the wildcard listener gets DEVICE_REMOVAL, status -EIO (rc %d, %s, status %d)", rc,
	      rc == 0 ? rdma_event_str(ev->event) : "-", rc == 0 ? ev->status : 0);
	if (rc == 0)
		rdma_ack_cm_event(ev);
	b = in4(argv[1], 7472);
	rc = rdma_create_id(ch, &late, NULL, RDMA_PS_TCP);
	if (rc == 0) {
		rc = rdma_bind_addr(late, (struct sockaddr *)&b);
		err = errno;
		CHECK(rc == -1 && err == EIO, "binding to the failed device: EIO (rc %d, %s)", rc,
		      strerror(err));
		rdma_destroy_id(late);
	}
	rc = rdma_get_request(sync_listen, &req);
	err = errno;
	CHECK(rc == -1 && err == EIO, "a synchronous rdma_get_request: EIO (rc %d, %s)", rc,
	      strerror(err));
	if (device) {
		struct ibv_async_event aev;
		struct ibv_cq *evcq;
		void *evctx;
		int fatal = 0, i;

		rc = ibv_get_cq_event(cc, &evcq, &evctx);
		err = errno;
		CHECK(rc == -1 && err == EIO, "ibv_get_cq_event on the failed device: EIO (rc %d, %s)",
		      rc, strerror(err));
		for (i = 0; i < 8 && !fatal; i++) {
			if (ibv_get_async_event(listen->verbs, &aev))
				break;
			fatal = aev.event_type == IBV_EVENT_DEVICE_FATAL;
			ibv_ack_async_event(&aev);
		}
		CHECK(fatal, "ibv_get_async_event: IBV_EVENT_DEVICE_FATAL");
		ibv_destroy_cq(cq);
		ibv_destroy_comp_channel(cc);
	}
	rdma_destroy_ep(sync_listen);
	rdma_destroy_id(wild);
	rdma_destroy_event_channel(wild_ch);
	rdma_destroy_id(listen);
	rdma_destroy_event_channel(ch);
	printf("cm_panic: end %d\n", failed);
	return failed;
}
