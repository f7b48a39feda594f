//! The rdma_cm objects (event channels, ids, events), the per-device CM driver, and the
//! `rdma_*` entry points, one file per concept, each depending only on the files listed
//! before it (tests/import_circles.rs):
//!
//! - `state`: the one [`State`](state::State) behind one lock (devices, ids, bound ports),
//!   the per-process reset of a `fork`ed child, making and freeing ids;
//! - `addr`: sockaddrs, an id's route and path record, a route's address handle;
//! - `transitions`: the INIT/RTR/RTS/ERR attributes of an id's QP and `ibv_modify_qp`;
//! - `events`: event channels, events, `rdma_get_cm_event` / `rdma_ack_cm_event`, the wait
//!   of synchronous ids;
//! - `driver`: the CM driver of each opened device (its thread, `pump`, the engine's events
//!   as rdma_cm events, ending a connection);
//! - `requests`: a REQ or SIDR_REQ for a listener making a passive id;
//! - `qp`: `rdma_create_qp(_ex)`, `rdma_create_srq(_ex)` and their destroy calls;
//! - `ids`: create, destroy, bind, resolve; `rdma_create_ep`; ports; devices;
//! - `connections`: listen, connect, accept, reject, establish, disconnect, get_request;
//! - `options`: `rdma_set_option`, `rdma_init_qp_attr`, ECE;
//! - `mcast`: multicast joins and leaves (no CM messages on RoCE: no SA);
//! - `testing` (feature `testing`): the in-memory bench that runs the driver and the
//!   entry points above against a libibverbs.so.1 held in memory, for the fuzz target.
//!
//! Entry points and driver threads take the lock, call the engine, then pump its events
//! (into rdma_cm events, applying REQ/REP to the id's QP) and MADs (onto QP1 through
//! `softroce_mad_send`). The ibv_* calls made under the lock never call back.
//!
//! Sources: rdma-core `librdmacm/cma.c` (rdma_create_qp's default CQs and INIT, the
//! RTR/RTS sequence of `ucma_modify_qp_rtr`/`_rts`, rdma_disconnect moving the QP to ERR,
//! events and their private data), kernel `drivers/infiniband/core/cma.c` (service IDs, the
//! cma header, CONNECT_REQUEST parameters as the passive side sees them).

mod addr;
mod connections;
mod driver;
mod events;
mod ids;
mod mcast;
mod options;
mod qp;
mod requests;
mod state;
#[cfg(feature = "testing")]
pub mod testing;
mod transitions;

pub(crate) use connections::{
    rdma_accept, rdma_connect, rdma_disconnect, rdma_establish, rdma_get_request, rdma_listen,
    rdma_reject, rdma_reject_ece,
};
pub(crate) use events::{
    rdma_ack_cm_event, rdma_create_event_channel, rdma_destroy_event_channel, rdma_event_str,
    rdma_get_cm_event,
};
pub(crate) use ids::{
    rdma_bind_addr, rdma_create_ep, rdma_create_id, rdma_destroy_ep, rdma_destroy_id,
    rdma_free_devices, rdma_get_devices, rdma_get_dst_port, rdma_get_src_port, rdma_migrate_id,
    rdma_notify, rdma_resolve_addr, rdma_resolve_route,
};
pub(crate) use mcast::{rdma_join_multicast, rdma_join_multicast_ex, rdma_leave_multicast};
pub(crate) use options::{
    rdma_get_remote_ece, rdma_init_qp_attr, rdma_set_local_ece, rdma_set_option,
};
pub(crate) use qp::{
    rdma_create_qp, rdma_create_qp_ex, rdma_create_srq, rdma_create_srq_ex, rdma_destroy_qp,
    rdma_destroy_srq,
};
