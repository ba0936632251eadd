// The real backend: the table filled from libibverbs and librdmacm. Functions that rdma-core
// defines as inline calls through the provider's ops (post_send, poll_cq...) or as macros
// (ibv_reg_mr, ibv_query_port) get a one-line wrapper; the others are taken as they are.
#include "verbs/verbs_api.hpp"

#include <cerrno>
#include <cstring>

namespace comm::verbs {
namespace {

int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) {
  return ibv_query_port(context, port_num, attr);
}

int query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                 uint32_t flags) {
  return ibv_query_gid_ex(context, port_num, gid_index, entry, flags);
}

ibv_mr* reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr(pd, addr, length, access);
}

int req_notify_cq(ibv_cq* cq, int solicited_only) { return ibv_req_notify_cq(cq, solicited_only); }

int poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) { return ibv_poll_cq(cq, num_entries, wc); }

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return ibv_post_srq_recv(srq, wr, bad_wr);
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return ibv_post_send(qp, wr, bad_wr);
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return ibv_post_recv(qp, wr, bad_wr);
}

int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr) {
  return ibv_query_device_ex(context, input, attr);
}

ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  return ibv_create_cq_ex(context, attr);
}

int start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) { return ibv_start_poll(cq, attr); }

int next_poll(ibv_cq_ex* cq) { return ibv_next_poll(cq); }

void end_poll(ibv_cq_ex* cq) { ibv_end_poll(cq); }

ibv_wc_opcode wc_read_opcode(ibv_cq_ex* cq) { return ibv_wc_read_opcode(cq); }

uint32_t wc_read_byte_len(ibv_cq_ex* cq) { return ibv_wc_read_byte_len(cq); }

__be32 wc_read_imm_data(ibv_cq_ex* cq) { return ibv_wc_read_imm_data(cq); }

uint32_t wc_read_qp_num(ibv_cq_ex* cq) { return ibv_wc_read_qp_num(cq); }

unsigned int wc_read_wc_flags(ibv_cq_ex* cq) { return ibv_wc_read_wc_flags(cq); }

void wc_read_tm_info(ibv_cq_ex* cq, ibv_wc_tm_info* tm_info) { ibv_wc_read_tm_info(cq, tm_info); }

ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  return ibv_create_srq_ex(context, attr);
}

int post_srq_ops(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad_op) {
  return ibv_post_srq_ops(srq, op, bad_op);
}

uint16_t get_src_port(rdma_cm_id* id) { return rdma_get_src_port(id); }

uint16_t get_dst_port(rdma_cm_id* id) { return rdma_get_dst_port(id); }

const api rdma_core_table{
    .size = sizeof(api),
    .backend = "rdma-core",
    .get_device_list = ibv_get_device_list,
    .free_device_list = ibv_free_device_list,
    .get_device_name = ibv_get_device_name,
    .open_device = ibv_open_device,
    .close_device = ibv_close_device,
    .query_device = ibv_query_device,
    .query_port = query_port,
    .query_gid = ibv_query_gid,
    .query_gid_ex = query_gid_ex,
    .get_async_event = ibv_get_async_event,
    .ack_async_event = ibv_ack_async_event,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .reg_mr = reg_mr,
    .dereg_mr = ibv_dereg_mr,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .req_notify_cq = req_notify_cq,
    .poll_cq = poll_cq,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .create_srq = ibv_create_srq,
    .modify_srq = ibv_modify_srq,
    .destroy_srq = ibv_destroy_srq,
    .post_srq_recv = post_srq_recv,
    .create_qp = ibv_create_qp,
    .modify_qp = ibv_modify_qp,
    .query_qp = ibv_query_qp,
    .destroy_qp = ibv_destroy_qp,
    .post_send = post_send,
    .post_recv = post_recv,
    .wc_status_str = ibv_wc_status_str,
    .event_type_str = ibv_event_type_str,
    .cm_event_str = rdma_event_str,
    .create_event_channel = rdma_create_event_channel,
    .destroy_event_channel = rdma_destroy_event_channel,
    .create_id = rdma_create_id,
    .destroy_id = rdma_destroy_id,
    .set_option = rdma_set_option,
    .bind_addr = rdma_bind_addr,
    .listen = rdma_listen,
    .resolve_addr = rdma_resolve_addr,
    .resolve_route = rdma_resolve_route,
    .get_src_port = get_src_port,
    .get_dst_port = get_dst_port,
    .create_qp_on_id = rdma_create_qp,
    .destroy_qp_on_id = rdma_destroy_qp,
    .init_qp_attr = rdma_init_qp_attr,
    .connect = rdma_connect,
    .establish = rdma_establish,
    .accept = rdma_accept,
    .reject = rdma_reject,
    .disconnect = rdma_disconnect,
    .get_cm_event = rdma_get_cm_event,
    .ack_cm_event = rdma_ack_cm_event,
    .query_device_ex = query_device_ex,
    .create_cq_ex = create_cq_ex,
    .start_poll = start_poll,
    .next_poll = next_poll,
    .end_poll = end_poll,
    .wc_read_opcode = wc_read_opcode,
    .wc_read_byte_len = wc_read_byte_len,
    .wc_read_imm_data = wc_read_imm_data,
    .wc_read_qp_num = wc_read_qp_num,
    .wc_read_wc_flags = wc_read_wc_flags,
    .wc_read_tm_info = wc_read_tm_info,
    .create_srq_ex = create_srq_ex,
    .post_srq_ops = post_srq_ops,
};

std::string list_failure(int error) {
  std::string reason = "no RDMA device: ibv_get_device_list failed: ";
  reason += std::strerror(error);
  if (error == ENOSYS) reason += " (the kernel has no RDMA support)";
  return reason;
}

}  // namespace

const api& rdma_core_api() noexcept { return rdma_core_table; }

device_probe probe_devices(const api& table) {
  device_probe probe;
  int count = 0;
  errno = 0;
  ibv_device** list = table.get_device_list(&count);
  if (list == nullptr) {
    probe.reason = list_failure(errno != 0 ? errno : ENODEV);
    return probe;
  }
  for (int i = 0; i < count && list[i] != nullptr; ++i) {
    probe.devices.emplace_back(table.get_device_name(list[i]));
  }
  table.free_device_list(list);
  if (probe.devices.empty()) probe.reason = "no RDMA device: ibv_get_device_list found none";
  return probe;
}

}  // namespace comm::verbs
