//! librdmacm's SRQ calls and `rdma_create_qp_ex` (rdma-core 44 `librdmacm/cma.c`) on
//! softroce's librdmacm.so.1: tests/c/cm_srq.c, compiled against the installed rdma-core
//! headers and run through `softroce exec`. The passive side (127.0.180.1) makes its id with
//! rdma_create_ep and rdma_get_request, its SRQ with rdma_create_srq on the id's PD and its QP
//! with rdma_create_qp (which takes the id's SRQ and makes the CQs); the active side
//! (127.0.180.2) makes its QP with rdma_create_qp_ex (the id's PD, its own send CQ); five
//! SENDs arrive through the SRQ. Both sides also check the error paths (EINVAL without
//! IBV_SRQ_INIT_ATTR_TYPE or with a QP already made, EOPNOTSUPP for XRC and for a QP attribute
//! libibverbs refuses, with the CQs librdmacm made for the failed call gone again) and that
//! rdma_destroy_qp / rdma_destroy_ep free what librdmacm made and nothing of the caller's.
//! Skipped, saying why, only when librdmacm-dev or a C compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;
use std::time::Duration;

const SERVER_IP: &str = "127.0.180.1";
const CLIENT_IP: &str = "127.0.180.2";
const PORT: &str = "7480";

#[test]
fn srq_on_the_passive_side_and_create_qp_ex_on_the_active_side() {
    let dir = std::env::temp_dir().join(format!("softroce-cm-srq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = compile_c("cm_srq", &dir) else {
        return;
    };

    let r = server_then_client(
        SERVER_IP,
        &[
            exe.as_os_str(),
            "server".as_ref(),
            SERVER_IP.as_ref(),
            PORT.as_ref(),
        ],
        CLIENT_IP,
        &[
            exe.as_os_str(),
            "client".as_ref(),
            SERVER_IP.as_ref(),
            PORT.as_ref(),
        ],
        Duration::from_secs(30),
        ("cm_srq server", "cm_srq client"),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let (cout, sout, report) = (&r.client, &r.server, &r.report);
    for line in [
        "[server] rdma_create_srq_ex without TYPE: EINVAL",
        "[server] rdma_create_srq_ex(XRC): EOPNOTSUPP, nothing left behind",
        "[server] received: 'message 0 through the SRQ'",
        "[server] received: 'message 4 through the SRQ'",
        "[server] received 5 SENDs through the SRQ",
        "[server] done",
    ] {
        assert!(sout.lines().any(|l| l == line), "no {line:?}\n{report}");
    }
    for line in [
        "[client] rdma_create_qp_ex(MAX_TSO_HEADER): EOPNOTSUPP, nothing left behind",
        "[client] sent 5 SENDs",
        "[client] disconnected",
        "[client] done",
    ] {
        assert!(cout.lines().any(|l| l == line), "no {line:?}\n{report}");
    }
    assert!(
        sout.lines()
            .any(|l| l.starts_with("[server] QP ") && l.ends_with("second rdma_create_qp: EINVAL")),
        "{report}"
    );
    assert!(
        cout.lines().any(|l| l.starts_with("[client] QP ")
            && l.ends_with("from rdma_create_qp_ex; second one: EINVAL")),
        "{report}"
    );
    println!("{cout}{sout}");
}
