// The verbs transport's one door to RDMA: a table of every libibverbs and librdmacm function it
// calls. ibv_post_send, ibv_poll_cq and friends are inline calls through a context's provider ops,
// so they cannot be interposed; instead the transport never names an ibv_* or rdma_* function and
// calls through this table. Two backends fill it:
//   - rdma_core_api(): libibverbs and librdmacm themselves (transports/verbs/verbs_api.cpp);
//   - the verbs test device (transports/verbs/testdev/), an in-process emulation for tests only.
// The signatures are rdma-core's own, with its types (ibv_wc, ibv_send_wr, rdma_cm_event...), so
// code written against the table reads like ordinary verbs code: `v.post_send(qp, &wr, &bad)`.
// Each member keeps the return convention of the rdma-core function it stands for (errno value,
// -1 and errno, or NULL and errno; see the man pages).
#pragma once

#include <infiniband/tm_types.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::verbs {

/// Every verbs and rdmacm function the transport uses. Like libfabric's ops tables it begins with
/// its own size, so a table can grow without breaking code built against an older one: check
/// `provides()` before calling a member added after the first version.
struct api {
  /// sizeof(api) of the code that filled the table.
  size_t size;
  /// Which backend filled it: "rdma-core" or "verbs test device".
  const char* backend;

  // -- devices, ports, GIDs --

  /// ibv_get_device_list: NULL-terminated list, NULL and errno on failure (ENOSYS: no kernel
  /// support).
  ibv_device** (*get_device_list)(int* num_devices);
  /// ibv_free_device_list.
  void (*free_device_list)(ibv_device** list);
  /// ibv_get_device_name.
  const char* (*get_device_name)(ibv_device* device);
  /// ibv_open_device: NULL and errno on failure.
  ibv_context* (*open_device)(ibv_device* device);
  /// ibv_close_device: 0, or -1 and errno.
  int (*close_device)(ibv_context* context);
  /// ibv_query_device: 0 or an errno value.
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  /// ibv_query_port: 0 or an errno value.
  int (*query_port)(ibv_context* context, uint8_t port_num, ibv_port_attr* attr);
  /// ibv_query_gid: 0, or -1 and errno.
  int (*query_gid)(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid);
  /// ibv_query_gid_ex: the GID with its type (IB, RoCE v1, RoCE v2); 0 or an errno value.
  int (*query_gid_ex)(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags);
  /// ibv_get_async_event: blocks unless context->async_fd is non-blocking; 0, or -1 and errno.
  int (*get_async_event)(ibv_context* context, ibv_async_event* event);
  /// ibv_ack_async_event.
  void (*ack_async_event)(ibv_async_event* event);

  // -- protection domain and memory registration --

  /// ibv_alloc_pd: NULL and errno on failure.
  ibv_pd* (*alloc_pd)(ibv_context* context);
  /// ibv_dealloc_pd: 0 or an errno value (EBUSY while it has MRs, QPs or SRQs).
  int (*dealloc_pd)(ibv_pd* pd);
  /// ibv_reg_mr with IBV_ACCESS_* flags: NULL and errno on failure.
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, size_t length, int access);
  /// ibv_dereg_mr: 0 or an errno value.
  int (*dereg_mr)(ibv_mr* mr);

  // -- completion channels and completion queues --

  /// ibv_create_comp_channel: NULL and errno on failure. Its `fd` is readable while events wait.
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context);
  /// ibv_destroy_comp_channel: 0 or an errno value.
  int (*destroy_comp_channel)(ibv_comp_channel* channel);
  /// ibv_create_cq: NULL and errno on failure.
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int comp_vector);
  /// ibv_destroy_cq: 0 or an errno value.
  int (*destroy_cq)(ibv_cq* cq);
  /// ibv_req_notify_cq: arms the CQ for one event on its channel; 0 or an errno value.
  int (*req_notify_cq)(ibv_cq* cq, int solicited_only);
  /// ibv_poll_cq: number of completions written to `wc`, negative on error.
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc);
  /// ibv_get_cq_event: blocks unless channel->fd is non-blocking; 0, or -1 and errno.
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context);
  /// ibv_ack_cq_events.
  void (*ack_cq_events)(ibv_cq* cq, unsigned int nevents);

  // -- shared receive queue --

  /// ibv_create_srq: NULL and errno on failure; srq_init_attr->attr returns the actual sizes.
  ibv_srq* (*create_srq)(ibv_pd* pd, ibv_srq_init_attr* srq_init_attr);
  /// ibv_modify_srq (IBV_SRQ_LIMIT arms the limit event): 0 or an errno value.
  int (*modify_srq)(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask);
  /// ibv_destroy_srq: 0 or an errno value.
  int (*destroy_srq)(ibv_srq* srq);
  /// ibv_post_srq_recv: 0 or an errno value, with *bad_wr the first request not posted.
  int (*post_srq_recv)(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

  // -- queue pairs --

  /// ibv_create_qp: NULL and errno on failure; init_attr->cap returns the actual capacities.
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* init_attr);
  /// ibv_modify_qp (RESET, INIT, RTR, RTS, ERR): 0 or an errno value.
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);
  /// ibv_query_qp: 0 or an errno value.
  int (*query_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr);
  /// ibv_destroy_qp: 0 or an errno value.
  int (*destroy_qp)(ibv_qp* qp);
  /// ibv_post_send (SEND, SEND_WITH_IMM, RDMA_WRITE[_WITH_IMM], RDMA_READ; INLINE, SIGNALED,
  /// SOLICITED, FENCE): 0 or an errno value, with *bad_wr the first request not posted.
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
  /// ibv_post_recv: 0 or an errno value, with *bad_wr the first request not posted.
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);

  // -- readable names --

  /// ibv_wc_status_str.
  const char* (*wc_status_str)(ibv_wc_status status);
  /// ibv_event_type_str.
  const char* (*event_type_str)(ibv_event_type event);
  /// rdma_event_str.
  const char* (*cm_event_str)(rdma_cm_event_type event);

  // -- rdmacm: event channel, ids, addresses --

  /// rdma_create_event_channel: NULL and errno on failure. Its `fd` is readable while events wait.
  rdma_event_channel* (*create_event_channel)();
  /// rdma_destroy_event_channel.
  void (*destroy_event_channel)(rdma_event_channel* channel);
  /// rdma_create_id: 0, or -1 and errno.
  int (*create_id)(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps);
  /// rdma_destroy_id: 0, or -1 and errno.
  int (*destroy_id)(rdma_cm_id* id);
  /// rdma_set_option (RDMA_OPTION_ID_ACK_TIMEOUT among others): 0, or -1 and errno.
  int (*set_option)(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen);
  /// rdma_bind_addr: 0, or -1 and errno.
  int (*bind_addr)(rdma_cm_id* id, sockaddr* addr);
  /// rdma_listen: 0, or -1 and errno.
  int (*listen)(rdma_cm_id* id, int backlog);
  /// rdma_resolve_addr: ADDR_RESOLVED or ADDR_ERROR follows; 0, or -1 and errno.
  int (*resolve_addr)(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms);
  /// rdma_resolve_route: ROUTE_RESOLVED or ROUTE_ERROR follows; 0, or -1 and errno.
  int (*resolve_route)(rdma_cm_id* id, int timeout_ms);
  /// rdma_get_src_port (network byte order).
  uint16_t (*get_src_port)(rdma_cm_id* id);
  /// rdma_get_dst_port (network byte order).
  uint16_t (*get_dst_port)(rdma_cm_id* id);

  // -- rdmacm: queue pair on an id, connection --

  /// rdma_create_qp: a QP on id->verbs, moved to INIT; the connection moves it to RTR and RTS.
  int (*create_qp_on_id)(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* init_attr);
  /// rdma_destroy_qp.
  void (*destroy_qp_on_id)(rdma_cm_id* id);
  /// rdma_init_qp_attr: the attributes that move a QP of this connection to attr->qp_state.
  int (*init_qp_attr)(rdma_cm_id* id, ibv_qp_attr* attr, int* attr_mask);
  /// rdma_connect with private data (at most 56 bytes): 0, or -1 and errno.
  int (*connect)(rdma_cm_id* id, rdma_conn_param* param);
  /// rdma_establish (the client of a connection without a QP on its id, after CONNECT_RESPONSE).
  int (*establish)(rdma_cm_id* id);
  /// rdma_accept with private data (at most 196 bytes): 0, or -1 and errno.
  int (*accept)(rdma_cm_id* id, rdma_conn_param* param);
  /// rdma_reject with private data (at most 148 bytes): 0, or -1 and errno.
  int (*reject)(rdma_cm_id* id, const void* private_data, uint8_t private_data_len);
  /// rdma_disconnect: moves the id's QP to ERR; both sides get DISCONNECTED.
  int (*disconnect)(rdma_cm_id* id);
  /// rdma_get_cm_event: blocks unless channel->fd is non-blocking; 0, or -1 and errno.
  int (*get_cm_event)(rdma_event_channel* channel, rdma_cm_event** event);
  /// rdma_ack_cm_event: 0, or -1 and errno.
  int (*ack_cm_event)(rdma_cm_event* event);

  // -- added after the first version: check provides() --

  /// ibv_query_device_ex: the extended attributes, among them tm_caps (the tag matching a device
  /// offers through IBV_SRQT_TM shared receive queues); 0 or an errno value.
  int (*query_device_ex)(ibv_context* context, const ibv_query_device_ex_input* input,
                         ibv_device_attr_ex* attr);

  // -- tag matching (TM-SRQs) and extended CQs: added with them; check provides() --

  /// ibv_create_cq_ex (IBV_WC_EX_WITH_TM_INFO among the wc_flags, so completions of a
  /// tag-matching SRQ can be read): NULL and errno on failure. ibv_cq_ex_to_cq gives the handle
  /// the ibv_cq members above take (req_notify_cq, get_cq_event, destroy_cq).
  ibv_cq_ex* (*create_cq_ex)(ibv_context* context, ibv_cq_init_attr_ex* cq_attr);
  /// ibv_start_poll: 0 with the first completion current (cq->wr_id, cq->status), ENOENT when
  /// the CQ is empty, or an errno value. end_poll must follow unless it returned ENOENT.
  int (*start_poll)(ibv_cq_ex* cq, ibv_poll_cq_attr* attr);
  /// ibv_next_poll: 0 with the next completion current, ENOENT when there is none.
  int (*next_poll)(ibv_cq_ex* cq);
  /// ibv_end_poll: the completions read are consumed.
  void (*end_poll)(ibv_cq_ex* cq);
  /// ibv_wc_read_opcode of the current completion (successful ones only).
  ibv_wc_opcode (*wc_read_opcode)(ibv_cq_ex* cq);
  /// ibv_wc_read_byte_len of the current completion.
  uint32_t (*wc_read_byte_len)(ibv_cq_ex* cq);
  /// ibv_wc_read_imm_data of the current completion (valid with IBV_WC_WITH_IMM).
  __be32 (*wc_read_imm_data)(ibv_cq_ex* cq);
  /// ibv_wc_read_qp_num of the current completion.
  uint32_t (*wc_read_qp_num)(ibv_cq_ex* cq);
  /// ibv_wc_read_wc_flags of the current completion (IBV_WC_WITH_IMM, IBV_WC_TM_MATCH,
  /// IBV_WC_TM_DATA_VALID, IBV_WC_TM_SYNC_REQ...).
  unsigned int (*wc_read_wc_flags)(ibv_cq_ex* cq);
  /// ibv_wc_read_tm_info of the current completion: the tag and app_ctx of its TMH.
  void (*wc_read_tm_info)(ibv_cq_ex* cq, ibv_wc_tm_info* tm_info);
  /// ibv_create_srq_ex (IBV_SRQT_TM with tm_cap and the CQ of its list operations): NULL and
  /// errno on failure.
  ibv_srq* (*create_srq_ex)(ibv_context* context, ibv_srq_init_attr_ex* srq_init_attr_ex);
  /// ibv_post_srq_ops (IBV_WR_TAG_ADD, IBV_WR_TAG_DEL, IBV_WR_TAG_SYNC on a TM-SRQ; an ADD's
  /// handle is written back into its tm.handle): 0 or an errno value, with *bad_op the first
  /// operation not posted.
  int (*post_srq_ops)(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad_op);
};

/// True when `table` was filled by code that knew `member` (its size reaches past it).
template <class Member>
bool provides(const api& table, Member api::*member) noexcept {
  static const api layout{};
  const auto offset = static_cast<size_t>(reinterpret_cast<const char*>(&(layout.*member)) -
                                          reinterpret_cast<const char*>(&layout));
  return table.size >= offset + sizeof(Member);
}

/// The table filled from libibverbs and librdmacm.
const api& rdma_core_api() noexcept;

/// What a backend's device list shows.
struct device_probe {
  /// Names of the devices found (empty when none).
  std::vector<std::string> devices;
  /// Why there is no device, e.g. "no RDMA device: ibv_get_device_list failed: Function not
  /// implemented (the kernel has no RDMA support)"; empty when a device was found.
  std::string reason;
};

/// Lists the devices of `table`'s backend, or says plainly why there is none. Never throws on a
/// machine without RDMA.
device_probe probe_devices(const api& table);

}  // namespace comm::verbs
