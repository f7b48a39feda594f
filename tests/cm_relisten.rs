//! A listener replaced between two connections (issue 16; perftest `-R` does this: it
//! destroys its control connection's listener, then listens on the same port for the data
//! connection, and its client's REQ may come in between). tests/c/cm_relisten.c, through
//! `softroce exec` with a server device on 127.0.160.25 and a client device on 127.0.160.26
//! in one process: the REQ that comes between the two listeners is held and becomes the new
//! listener's CONNECT_REQUEST; after 3 s without a listener a REQ gets REJ 8, the kernel's
//! answer; a channel destroyed twice is refused with EBADF. Skipped, saying why, only when
//! librdmacm-dev or a C compiler is missing (CI installs them).

mod exec_support;
use exec_support::*;

#[test]
fn a_req_between_two_listeners_goes_to_the_second() {
    if let Some(text) = run_c_checks(
        "cm_relisten",
        "127.0.160.25,127.0.160.26",
        &["127.0.160.25", "127.0.160.26"],
        6,
    ) {
        println!("{text}");
    }
}

/// rdma_migrate_id of a synchronous id (rdma_create_ep without a channel) to a channel, as
/// libfabric's verbs provider does: tests/c/cm_migrate.c, on 127.0.160.27 (server) and
/// 127.0.160.28 (client) in one process. Its calls stop waiting for their events, which
/// come on the new channel (before the fix rdma_resolve_route took its own ROUTE_RESOLVED
/// and `fi_pingpong -p verbs -e msg` hung); migrating to NULL makes it synchronous again.
#[test]
fn a_migrated_synchronous_id_is_asynchronous() {
    if let Some(text) = run_c_checks(
        "cm_migrate",
        "127.0.160.27,127.0.160.28",
        &["127.0.160.27", "127.0.160.28"],
        13,
    ) {
        println!("{text}");
    }
}
