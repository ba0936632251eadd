#include "verbs/verbs_conn.hpp"

#include "verbs/verbs_ep.hpp"
#include "verbs/verbs_iface.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::verbs {
namespace {
constexpr const char* log_name = "verbs";
}

status status_of(ibv_wc_status st) {
  switch (st) {
    case IBV_WC_SUCCESS:
      return status::ok;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return status::endpoint_timeout;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return status::protection_error;
    case IBV_WC_LOC_LEN_ERR:
      return status::length_error;
    case IBV_WC_WR_FLUSH_ERR:
      return status::canceled;
    default:
      return status::io_error;
  }
}

verbs_conn::verbs_conn(verbs_iface& owner, uint64_t serial, ibv_qp* qp, rdma_cm_id* id,
                       bool passive, uint32_t psn)
    : owner_(owner), serial_(serial), qp_(qp), id_(id), passive_(passive), psn_(psn),
      sq_free_(owner.config().tx_queue) {}

verbs_conn::~verbs_conn() {
  const api& t = owner_.table();
  if (state_ != conn_state::failed) abort_operations(status::canceled);
  disconnect();
  if (id_ != nullptr) t.destroy_id(id_);
  if (qp_ != nullptr) t.destroy_qp(qp_);
}

int verbs_conn::connected(const handshake& peer) {
  peer_ = peer;
  const int error = owner_.connect_qp(qp_, psn_, peer);
  if (error != 0) return error;
  tx_credits_ = peer.credits;
  const uint32_t local = owner_.attr().max_outstanding_reads;
  max_reads_ = std::max<uint32_t>(1, std::min<uint32_t>(local, peer.rd_atom));
  return 0;
}

void verbs_conn::established() {
  established_ = true;
  if (state_ == conn_state::connecting) state_ = conn_state::ready;
}

void verbs_conn::fail(status reason) {
  if (state_ == conn_state::failed) return;
  abort_operations(reason);
  fins_due_.clear();
  if (ep != nullptr) ep->fail_rendezvous(reason);
  COMM_LOG(info, log_name, "connection %llu (qp %u) failed: %s",
           static_cast<unsigned long long>(serial_), qp_->qp_num, to_string(reason));
  owner_.report_failure(*this);
}

void verbs_conn::abort_operations(status reason) {
  state_ = conn_state::failed;
  failure_ = reason;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  owner_.table().modify_qp(qp_, &attr, IBV_QP_STATE);
  while (!outstanding_.empty()) {
    tx_entry e = outstanding_.front();
    outstanding_.pop_front();
    complete_entry(e, reason);
  }
}

void verbs_conn::disconnect() {
  if (disconnected_ || id_ == nullptr || !established_) return;
  disconnected_ = true;
  owner_.table().disconnect(id_);
}

status verbs_conn::can_post(bool needs_credit) const {
  if (state_ == conn_state::failed) return failure_;
  if (state_ != conn_state::ready || sq_free_ == 0) return status::no_resource;
  if (needs_credit && tx_credits_ == 0) return status::no_resource;
  return status::ok;
}

bool verbs_conn::wants_signal(const tx_request& req) const {
  return req.signal || req.comp != nullptr || req.pins.count != 0 ||
         req.wr.opcode == IBV_WR_RDMA_READ || (req.buffer >= 0 && owner_.tx_buffers_low()) ||
         unsignaled_ + 1 >= owner_.config().tx_queue / 2;
}

status verbs_conn::post(tx_request& req) {
  const bool signal = wants_signal(req);
  req.wr.wr_id = next_seq_;
  req.wr.next = nullptr;
  req.wr.send_flags |= signal ? IBV_SEND_SIGNALED : 0;
  if (fence_next_) req.wr.send_flags |= IBV_SEND_FENCE;
  ibv_send_wr* bad = nullptr;
  const int error = owner_.table().post_send(qp_, &req.wr, &bad);
  if (error != 0) {
    COMM_LOG(warn, log_name, "post_send on qp %u: %s", qp_->qp_num, std::strerror(error));
    if (req.buffer >= 0) owner_.return_tx_buffer(req.buffer);
    owner_.md().unpin(req.pins);
    fail(status::io_error);
    return failure_;
  }
  fence_next_ = false;
  unsignaled_ = signal ? 0 : unsignaled_ + 1;
  --sq_free_;
  if (req.needs_credit) --tx_credits_;
  const bool read = req.wr.opcode == IBV_WR_RDMA_READ;
  if (read) ++reads_in_flight_;
  outstanding_.push_back(tx_entry{next_seq_++, req.comp, req.buffer, read, req.pins});
  return status::ok;
}

status verbs_conn::flush(tl::completion* comp) {
  if (state_ == conn_state::failed) return failure_;
  // Nothing is posted before the connection is ready: while connecting, nothing was started.
  if (outstanding_.empty()) return status::ok;
  // Unsignaled sends leave the queue only behind a signaled one: post one if none follows them.
  if (comp == nullptr && (unsignaled_ == 0 || sq_free_ == 0)) return status::in_progress;
  if (sq_free_ == 0) return status::no_resource;
  tx_request req;
  req.wr.opcode = IBV_WR_RDMA_WRITE;
  req.comp = comp;
  req.signal = true;
  const status st = post(req);
  return st == status::ok ? status::in_progress : st;
}

void verbs_conn::complete_entry(tx_entry& e, status st) {
  if (e.buffer >= 0) owner_.return_tx_buffer(e.buffer);
  owner_.md().unpin(e.pins);
  if (e.read) --reads_in_flight_;
  ++sq_free_;
  if (e.comp != nullptr) tl::complete(e.comp, st);
}

void verbs_conn::complete_until(uint64_t seq, status st) {
  while (!outstanding_.empty() && outstanding_.front().seq <= seq) {
    tx_entry e = outstanding_.front();
    outstanding_.pop_front();
    complete_entry(e, st);
  }
}

void verbs_conn::send_completed(uint64_t seq, ibv_wc_status st) {
  if (state_ == conn_state::failed) return;
  if (st == IBV_WC_SUCCESS) {
    complete_until(seq, status::ok);
    return;
  }
  complete_until(seq - 1, status::ok);
  COMM_LOG(info, log_name, "qp %u: work request failed: %s", qp_->qp_num,
           owner_.table().wc_status_str(st));
  fail(st == IBV_WC_WR_FLUSH_ERR ? status::io_error : status_of(st));
}

uint16_t verbs_conn::take_credits_to_return() {
  const uint32_t n = std::min<uint32_t>(rx_to_return_, UINT16_MAX);
  rx_to_return_ -= n;
  return static_cast<uint16_t>(n);
}

uint32_t verbs_conn::grant_threshold() const { return std::max(1u, owner_.config().credits / 2u); }

bool verbs_conn::grant_due() const {
  return state_ == conn_state::ready && rx_to_return_ >= grant_threshold();
}

void verbs_conn::receive_reposted() {
  if (++rx_to_return_ >= grant_threshold()) owner_.watch(*this);
}

bool verbs_conn::holds_user_memory() const {
  for (const tx_entry& e : outstanding_) {
    if (e.comp != nullptr || e.pins.count != 0 || e.read) return true;
  }
  return false;
}

void verbs_conn::release() {
  released_ = true;
  release_due_ = true;
  owner_.watch(*this);
}

status verbs_conn::send_release() {
  const status st = send_credit_free(message_kind::release);
  if (st == status::ok) release_due_ = false;
  return st;
}

status verbs_conn::send_grant() {
  const status st = send_credit_free(message_kind::grant);
  if (st == status::ok) ++grants_sent_;
  return st;
}

void verbs_conn::send_fin(uint32_t op_id) {
  if (state_ == conn_state::failed) return;
  fins_due_.push_back(op_id);
  if (!send_due_fins()) owner_.watch(*this);
}

bool verbs_conn::send_due_fins() {
  while (!fins_due_.empty()) {
    if (send_credit_free(message_kind::rndv_fin, fins_due_.front()) != status::ok) return false;
    fins_due_.pop_front();
  }
  return true;
}

status verbs_conn::send_credit_free(message_kind kind, uint32_t op_id) {
  const status st = can_post(false);
  if (st != status::ok) return st;
  tx_request req;
  const auto size = static_cast<uint32_t>(owner_.header_size());
  alignas(8) uint8_t header[tmh_size + message_header_size];
  ibv_sge sge{reinterpret_cast<uintptr_t>(header), size, 0};
  uint8_t* dst = header;
  if (owner_.max_inline() >= size) {
    req.wr.send_flags = IBV_SEND_INLINE;
  } else {
    req.buffer = owner_.take_tx_buffer();
    if (req.buffer < 0) return status::no_resource;
    dst = owner_.tx_buffer(req.buffer);
    sge = ibv_sge{reinterpret_cast<uintptr_t>(dst), size, owner_.tx_lkey()};
  }
  owner_.write_header(dst, kind, 0, take_credits_to_return(), op_id);
  req.wr.opcode = IBV_WR_SEND;
  req.wr.sg_list = &sge;
  req.wr.num_sge = 1;
  return post(req);
}

bool verbs_conn::pending_can_run() const {
  return !pending.empty() && state_ == conn_state::ready && sq_free_ != 0 && tx_credits_ != 0;
}

bool verbs_conn::needs_watching() const {
  return state_ != conn_state::failed && (rx_to_return_ >= grant_threshold() || !pending.empty() ||
                                          release_due_ || !fins_due_.empty());
}

}  // namespace comm::verbs
