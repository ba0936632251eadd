// The verbs test device's wire: posting work requests, executing them against the responder QP
// their address vector and destination QP number lead to, and writing completions. What the
// responder checks, and what the requester sees when a check fails:
//   - no responder (vanished, not RTR/RTS, connected elsewhere, PSN mismatch, port down): no
//     answer; retried after the ACK timeout, then IBV_WC_RETRY_EXC_ERR;
//   - SEND with no receive posted: RNR; retried after the responder's min_rnr_timer up to
//     rnr_retry times (7: for ever), then IBV_WC_RNR_RETRY_EXC_ERR;
//   - SEND longer than the receive: the receive completes with IBV_WC_LOC_LEN_ERR, the requester
//     with IBV_WC_REM_INV_REQ_ERR; a receive with a bad lkey: IBV_WC_LOC_PROT_ERR and
//     IBV_WC_REM_OP_ERR; both QPs go to error;
//   - WRITE/READ without the QP's remote access flag, or more READs than the responder's
//     max_dest_rd_atomic: IBV_WC_REM_INV_REQ_ERR (responder: IBV_EVENT_QP_REQ_ERR, to error);
//   - bad rkey, out of the MR's bounds, MR without the access or in another PD:
//     IBV_WC_REM_ACCESS_ERR (responder: IBV_EVENT_QP_ACCESS_ERR, to error);
//   - a local gather/scatter entry with a bad lkey or range (or a READ into memory without
//     LOCAL_WRITE): IBV_WC_LOC_PROT_ERR; longer than the port's max_msg_sz: IBV_WC_LOC_LEN_ERR.
// A failed request takes its QP to error and flushes everything after it; READs posted before it
// that are still in flight answer first, as their responses precede the failure on the wire.
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <cerrno>
#include <cstring>

namespace comm::verbs::testdev::detail {
namespace {

/// Where an attempt to execute (or answer) a work request left it.
enum class outcome {
  done,     ///< executed (a READ: its response arrived)
  issued,   ///< a READ reached the responder; its response is in flight
  blocked,  ///< waits: RNR or ACK timer, or a READ response still to come
  failed,   ///< the request failed; see result
};

/// The outcome of one attempt, and what a failure does to the responder.
struct result {
  outcome what = outcome::done;
  ibv_wc_status status = IBV_WC_SUCCESS;  ///< the requester's status when failed
  qp_obj* responder = nullptr;            ///< a responder that goes to error as well
  std::optional<ibv_event_type> responder_event;
};

/// An attempt that did not fail.
result reached(outcome what) {
  result r;
  r.what = what;
  return r;
}

result failure(ibv_wc_status status, qp_obj* responder = nullptr,
               std::optional<ibv_event_type> event = std::nullopt) {
  return result{outcome::failed, status, responder, event};
}

// -- memory --

/// Bytes of registered memory an entry resolved to.
struct span {
  uint8_t* data;
  uint64_t length;
};

/// The MR under `key` in `pd` granting `access` that holds [addr, addr + length), or null.
const mr_obj* covering_mr(fabric& f, const pd_obj& pd, uint32_t key, uint64_t addr, uint64_t length,
                          int access) {
  const mr_obj* mr = f.find_mr(key);
  if (mr == nullptr || mr->pd != &pd || (mr->access & access) != access) return nullptr;
  const auto start = reinterpret_cast<uint64_t>(mr->pub.addr);
  const bool inside =
      addr >= start && length <= mr->pub.length && addr - start <= mr->pub.length - length;
  return inside ? mr : nullptr;
}

/// Resolves local gather/scatter entries; false when one is not registered memory of `pd` with
/// `access` (0 for reading it).
bool resolve_local(fabric& f, const pd_obj& pd, const std::vector<ibv_sge>& sges, int access,
                   std::vector<span>& out) {
  for (const ibv_sge& sge : sges) {
    if (sge.length == 0) continue;
    if (covering_mr(f, pd, sge.lkey, sge.addr, sge.length, access) == nullptr) return false;
    out.push_back(span{reinterpret_cast<uint8_t*>(sge.addr), sge.length});
  }
  return true;
}

/// Resolves a remote range under `rkey` in the responder's PD; false on any protection failure.
bool resolve_remote(fabric& f, const pd_obj& pd, uint64_t addr, uint32_t rkey, uint64_t length,
                    int access, span& out) {
  if (covering_mr(f, pd, rkey, addr, length, access) == nullptr) return false;
  out = span{reinterpret_cast<uint8_t*>(addr), length};
  return true;
}

/// Copies `length` bytes from `from` to `to`, entry after entry (both hold at least that much).
void copy_spans(const std::vector<span>& from, const std::vector<span>& to, uint64_t length) {
  size_t fi = 0, ti = 0;
  uint64_t foff = 0, toff = 0;
  while (length > 0) {
    const uint64_t n = std::min({from[fi].length - foff, to[ti].length - toff, length});
    std::memmove(to[ti].data + toff, from[fi].data + foff, n);
    length -= n;
    foff += n;
    toff += n;
    if (foff == from[fi].length) fi++, foff = 0;
    if (toff == to[ti].length) ti++, toff = 0;
  }
}

uint64_t capacity(const std::vector<span>& spans) {
  uint64_t total = 0;
  for (const span& s : spans) total += s.length;
  return total;
}

// -- paths --

/// A port of the fabric.
struct endpoint {
  device_obj* dev = nullptr;
  port_obj* port = nullptr;
  uint32_t num = 0;
};

bool has_gid(const port_obj& port, const ibv_gid& gid, uint32_t type) {
  for (const ibv_gid_entry& entry : port.gids) {
    if (entry.gid_type == type && std::memcmp(entry.gid.raw, gid.raw, sizeof(gid.raw)) == 0)
      return true;
  }
  return false;
}

endpoint local_endpoint(const qp_obj& qp) {
  device_obj* dev = qp.pd->ctx->dev;
  return endpoint{dev, port_of(*dev, qp.attr.port_num), qp.attr.port_num};
}

/// The port the QP's address vector leads to: by LID on InfiniBand, by destination GID (of the
/// source GID's type) on RoCE.
endpoint path_target(fabric& f, const qp_obj& qp) {
  const endpoint local = local_endpoint(qp);
  if (local.port == nullptr) return {};
  const ibv_ah_attr& ah = qp.attr.ah_attr;
  const bool ib = local.port->attr.link_layer == IBV_LINK_LAYER_INFINIBAND;
  if (!ib && ah.grh.sgid_index >= local.port->gids.size()) return {};
  const uint32_t type =
      ib ? uint32_t{IBV_GID_TYPE_IB} : local.port->gids[ah.grh.sgid_index].gid_type;
  for (auto& dev : f.devices) {
    for (size_t i = 0; i < dev->ports.size(); ++i) {
      port_obj& port = dev->ports[i];
      if (port.attr.link_layer != local.port->attr.link_layer) continue;
      const bool match = ib ? port.attr.lid == ah.dlid : has_gid(port, ah.grh.dgid, type);
      if (match) return endpoint{dev.get(), &port, static_cast<uint32_t>(i + 1)};
    }
  }
  return {};
}

/// The QP that answers `qp`'s requests, or null when nobody would (a request is then lost).
qp_obj* responder(fabric& f, const qp_obj& qp) {
  const endpoint local = local_endpoint(qp);
  const endpoint remote = path_target(f, qp);
  if (local.port == nullptr || remote.port == nullptr) return nullptr;
  if (local.port->attr.state != IBV_PORT_ACTIVE || remote.port->attr.state != IBV_PORT_ACTIVE) {
    return nullptr;
  }
  const auto it = f.qp_by_num.find(qp.attr.dest_qp_num);
  if (it == f.qp_by_num.end()) return nullptr;
  qp_obj* r = it->second;
  const bool listening = r->attr.qp_state == IBV_QPS_RTR || r->attr.qp_state == IBV_QPS_RTS;
  if (dead(*r) || !listening || r->pd->ctx->dev != remote.dev || r->attr.port_num != remote.num) {
    return nullptr;
  }
  if (r->attr.dest_qp_num != qp.pub.qp_num || path_target(f, *r).port != local.port) return nullptr;
  if (((qp.attr.sq_psn ^ r->attr.rq_psn) & 0xffffff) != 0) return nullptr;
  return r;
}

// -- timers --

clock::duration ack_timeout(uint8_t timeout) {
  return std::chrono::nanoseconds(int64_t{4096} << timeout);
}

clock::duration rnr_delay(uint8_t min_rnr_timer) {
  static const int micros[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                 160,    240,   320,   480,    640,    960,    1280,   1920,
                                 2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                 40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::chrono::microseconds(micros[min_rnr_timer & 31]);
}

/// Nobody answered: wait for the ACK timeout (for ever when timeout is 0).
result no_answer(qp_obj& qp, send_wqe& wqe, clock::time_point now, clock::time_point& retry_at) {
  wqe.awaiting_answer = qp.attr.timeout != 0;
  retry_at = wqe.awaiting_answer ? now + ack_timeout(qp.attr.timeout) : never;
  return reached(outcome::blocked);
}

/// A timer ran out without an answer: count it, and fail once retry_cnt retries are spent.
bool retries_spent(fabric& f, const qp_obj& qp, send_wqe& wqe) {
  if (!wqe.awaiting_answer) return false;
  wqe.awaiting_answer = false;
  ++f.stats.ack_timeouts;
  return ++wqe.timeouts > qp.attr.retry_cnt;
}

// -- the responder's side --

/// The receive queue a SEND to `r` consumes from (its SRQ or its own).
std::deque<recv_wqe>& receives_of(qp_obj& r) { return r.srq ? r.srq->wqes : r.rq; }

/// Takes the next receive of `r`, raising the SRQ limit event when it falls below the limit.
recv_wqe take_receive(fabric& f, qp_obj& r) {
  std::deque<recv_wqe>& queue = receives_of(r);
  recv_wqe wqe = std::move(queue.front());
  queue.pop_front();
  srq_obj* srq = r.srq;
  if (srq != nullptr && srq->limit != 0 && srq->wqes.size() < srq->limit) {
    srq->limit = 0;
    f.raise_async(*srq->pd->ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq);
  }
  return wqe;
}

/// The responder's receive completion for a request of `qp`.
void complete_receive(fabric& f, qp_obj& r, const qp_obj& qp, const send_wqe& wqe,
                      const recv_wqe& receive, ibv_wc_opcode opcode) {
  ibv_wc wc = make_wc(receive.wr_id, IBV_WC_SUCCESS, r.pub.qp_num);
  wc.opcode = opcode;
  wc.byte_len = static_cast<uint32_t>(wqe.length);
  wc.src_qp = qp.pub.qp_num;
  wc.slid = local_endpoint(qp).port->attr.lid;
  const bool with_imm =
      wqe.opcode == IBV_WR_SEND_WITH_IMM || wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (with_imm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = wqe.imm_data;
  }
  uint32_t* slots = r.srq ? &r.srq->slots : &r.rq_slots;
  f.push_cqe(*r.recv_cq, wc, slots, 1, (wqe.flags & IBV_SEND_SOLICITED) != 0);
}

/// The responder has no receive posted: an RNR answer, retried after its min_rnr_timer.
result receiver_not_ready(fabric& f, qp_obj& qp, send_wqe& wqe, const qp_obj& r,
                          clock::time_point now) {
  ++wqe.rnr_naks;
  ++f.stats.rnr_naks;
  if (qp.attr.rnr_retry != 7 && wqe.rnr_naks > qp.attr.rnr_retry) {
    return failure(IBV_WC_RNR_RETRY_EXC_ERR);
  }
  wqe.not_before = now + rnr_delay(r.attr.min_rnr_timer);
  return reached(outcome::blocked);
}

/// A SEND to a QP on a TM-SRQ: matched against its tagged buffers or landing in an ordinary one
/// (testdev_tm.cpp).
result deliver_tagged(fabric& f, qp_obj& qp, send_wqe& wqe, qp_obj& r,
                      const std::vector<span>& source, clock::time_point now) {
  std::vector<uint8_t> bytes(wqe.length);
  if (!bytes.empty()) copy_spans(source, {span{bytes.data(), bytes.size()}}, wqe.length);
  switch (tm_deliver(f, qp, r, wqe, bytes)) {
    case tm_outcome::delivered:
      return reached(outcome::done);
    case tm_outcome::not_ready:
      return receiver_not_ready(f, qp, wqe, r, now);
    default:
      return failure(IBV_WC_REM_OP_ERR, &r);
  }
}

result deliver_send(fabric& f, qp_obj& qp, send_wqe& wqe, qp_obj& r,
                    const std::vector<span>& source, clock::time_point now) {
  if (r.srq != nullptr && r.srq->tm) return deliver_tagged(f, qp, wqe, r, source, now);
  if (receives_of(r).empty()) return receiver_not_ready(f, qp, wqe, r, now);
  const recv_wqe receive = take_receive(f, r);
  uint32_t* slots = r.srq ? &r.srq->slots : &r.rq_slots;
  const pd_obj& receive_pd = r.srq ? *r.srq->pd : *r.pd;
  std::vector<span> target;
  if (!resolve_local(f, receive_pd, receive.sge, IBV_ACCESS_LOCAL_WRITE, target)) {
    f.push_cqe(*r.recv_cq, make_wc(receive.wr_id, IBV_WC_LOC_PROT_ERR, r.pub.qp_num), slots, 1,
               false);
    return failure(IBV_WC_REM_OP_ERR, &r);
  }
  if (wqe.length > capacity(target)) {
    f.push_cqe(*r.recv_cq, make_wc(receive.wr_id, IBV_WC_LOC_LEN_ERR, r.pub.qp_num), slots, 1,
               false);
    return failure(IBV_WC_REM_INV_REQ_ERR, &r);
  }
  copy_spans(source, target, wqe.length);
  complete_receive(f, r, qp, wqe, receive, IBV_WC_RECV);
  return reached(outcome::done);
}

result deliver_write(fabric& f, qp_obj& qp, send_wqe& wqe, qp_obj& r,
                     const std::vector<span>& source, clock::time_point now) {
  if ((r.attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) == 0) {
    return failure(IBV_WC_REM_INV_REQ_ERR, &r, IBV_EVENT_QP_REQ_ERR);
  }
  const bool with_imm = wqe.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (with_imm && receives_of(r).empty()) return receiver_not_ready(f, qp, wqe, r, now);
  span target{};
  const bool allowed =
      wqe.length == 0 || resolve_remote(f, *r.pd, wqe.remote_addr, wqe.rkey, wqe.length,
                                        IBV_ACCESS_REMOTE_WRITE, target);
  if (!allowed) return failure(IBV_WC_REM_ACCESS_ERR, &r, IBV_EVENT_QP_ACCESS_ERR);
  if (wqe.length != 0) copy_spans(source, {target}, wqe.length);
  if (with_imm) complete_receive(f, r, qp, wqe, take_receive(f, r), IBV_WC_RECV_RDMA_WITH_IMM);
  return reached(outcome::done);
}

result issue_read(fabric& f, qp_obj& qp, send_wqe& wqe, qp_obj& r, clock::time_point now) {
  const bool readable = (r.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ) != 0;
  if (!readable || qp.reads_in_flight + 1u > r.attr.max_dest_rd_atomic) {
    return failure(IBV_WC_REM_INV_REQ_ERR, &r, IBV_EVENT_QP_REQ_ERR);
  }
  span source{};
  const bool allowed =
      wqe.length == 0 || resolve_remote(f, *r.pd, wqe.remote_addr, wqe.rkey, wqe.length,
                                        IBV_ACCESS_REMOTE_READ, source);
  if (!allowed) return failure(IBV_WC_REM_ACCESS_ERR, &r, IBV_EVENT_QP_ACCESS_ERR);
  ++qp.reads_in_flight;
  wqe.where = stage::read_in_flight;
  wqe.response_due = now;
  return reached(outcome::issued);
}

// -- the requester's side --

/// The local memory of a request: its inline copy, its gather list, or a READ's scatter list.
bool local_memory(fabric& f, qp_obj& qp, send_wqe& wqe, std::vector<span>& out) {
  if (!wqe.inline_data.empty()) {
    out.push_back(span{wqe.inline_data.data(), wqe.inline_data.size()});
    return true;
  }
  const int access = wqe.opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;
  return resolve_local(f, *qp.pd, wqe.sge, access, out);
}

/// One attempt at a queued send work request.
result execute(fabric& f, qp_obj& qp, send_wqe& wqe, clock::time_point now) {
  if (retries_spent(f, qp, wqe)) return failure(IBV_WC_RETRY_EXC_ERR);
  if (qp.injected) {
    const ibv_wc_status status = *qp.injected;
    qp.injected.reset();
    return failure(status);
  }
  std::vector<span> local;
  if (!local_memory(f, qp, wqe, local)) return failure(IBV_WC_LOC_PROT_ERR);
  if (wqe.length > local_endpoint(qp).port->attr.max_msg_sz) return failure(IBV_WC_LOC_LEN_ERR);
  qp_obj* r = responder(f, qp);
  if (r == nullptr) return no_answer(qp, wqe, now, wqe.not_before);
  switch (wqe.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return deliver_send(f, qp, wqe, *r, local, now);
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return deliver_write(f, qp, wqe, *r, local, now);
    default:
      return issue_read(f, qp, wqe, *r, now);
  }
}

/// The response to an in-flight READ arrives (or does not: the responder is gone).
result answer_read(fabric& f, qp_obj& qp, send_wqe& wqe, clock::time_point now) {
  if (retries_spent(f, qp, wqe)) return failure(IBV_WC_RETRY_EXC_ERR);
  qp_obj* r = responder(f, qp);
  if (r == nullptr) return no_answer(qp, wqe, now, wqe.response_due);
  span source{};
  const bool allowed =
      wqe.length == 0 || resolve_remote(f, *r->pd, wqe.remote_addr, wqe.rkey, wqe.length,
                                        IBV_ACCESS_REMOTE_READ, source);
  if (!allowed) return failure(IBV_WC_REM_ACCESS_ERR, r, IBV_EVENT_QP_ACCESS_ERR);
  std::vector<span> target;
  if (!resolve_local(f, *qp.pd, wqe.sge, IBV_ACCESS_LOCAL_WRITE, target)) {
    return failure(IBV_WC_LOC_PROT_ERR);
  }
  if (wqe.length != 0) copy_spans({source}, target, wqe.length);
  wqe.where = stage::done;
  --qp.reads_in_flight;
  ++f.stats.read_responses;
  return reached(outcome::done);
}

/// The request at `index` failed: READs before it that are in flight answer first (one of them
/// may fail instead); then it completes with its status, the QP goes to error and flushes the
/// rest, and a responder that detected the failure goes to error too.
void fail_request(fabric& f, qp_obj& qp, size_t index, result why, clock::time_point now) {
  for (size_t i = 0; i < index; ++i) {
    send_wqe& earlier = qp.sq[i];
    if (earlier.where != stage::read_in_flight) continue;
    earlier.awaiting_answer = false;
    const result answer = answer_read(f, qp, earlier, now);
    if (answer.what == outcome::done) continue;
    why = answer.what == outcome::failed ? answer : failure(IBV_WC_RETRY_EXC_ERR);
    index = i;
    break;
  }
  send_wqe& wqe = qp.sq[index];
  wqe.where = stage::done;
  wqe.status = why.status;
  COMM_LOG(debug, log_name, "QP 0x%x: work request %llu failed: %s", qp.pub.qp_num,
           static_cast<unsigned long long>(wqe.wr_id), ibv_wc_status_str(why.status));
  f.to_error(qp);
  if (why.responder == nullptr) return;
  if (why.responder_event)
    f.raise_async(*why.responder->pd->ctx, *why.responder_event, why.responder);
  f.to_error(*why.responder);
}

/// Delivers the READ responses that are due, in order. False when the QP failed.
bool deliver_responses(fabric& f, qp_obj& qp, clock::time_point now) {
  for (size_t i = 0; i < qp.executed; ++i) {
    send_wqe& wqe = qp.sq[i];
    if (wqe.where != stage::read_in_flight) continue;
    if (f.reads_held || wqe.response_due > now) return true;
    const result answer = answer_read(f, qp, wqe, now);
    if (answer.what == outcome::blocked) return true;
    if (answer.what == outcome::failed) {
      fail_request(f, qp, i, answer, now);
      return false;
    }
  }
  return true;
}

/// Executes queued requests in order while nothing holds them back.
void execute_queued(fabric& f, qp_obj& qp, clock::time_point now) {
  while (qp.executed < qp.sq.size()) {
    send_wqe& wqe = qp.sq[qp.executed];
    if (now < wqe.not_before) return;
    if ((wqe.flags & IBV_SEND_FENCE) != 0 && qp.reads_in_flight != 0) return;
    // max_rd_atomic 0 still lets one READ out, as mlx5 does; the responder then decides
    const unsigned reads_allowed = std::max<unsigned>(1, qp.attr.max_rd_atomic);
    if (wqe.opcode == IBV_WR_RDMA_READ && qp.reads_in_flight >= reads_allowed) return;
    const result attempt = execute(f, qp, wqe, now);
    if (attempt.what == outcome::blocked) return;
    if (attempt.what == outcome::failed) {
      fail_request(f, qp, qp.executed, attempt, now);
      return;
    }
    if (attempt.what == outcome::done) wqe.where = stage::done;
    ++qp.executed;
  }
}

/// Sets when the QP next needs the fabric: its first READ response or its next retry.
void reschedule(fabric& f, qp_obj& qp, clock::time_point now) {
  clock::time_point wake = never;
  for (size_t i = 0; i < qp.executed && !f.reads_held; ++i) {
    if (qp.sq[i].where != stage::read_in_flight) continue;
    wake = qp.sq[i].response_due;
    break;
  }
  if (qp.executed < qp.sq.size() && qp.sq[qp.executed].not_before > now) {
    wake = std::min(wake, qp.sq[qp.executed].not_before);
  }
  qp.wake_at = wake;
  if (wake == never) {
    f.timed.erase(&qp);
    return;
  }
  f.timed.insert(&qp);
  f.engine_wake.notify_one();
}

ibv_wc_opcode completion_opcode(ibv_wr_opcode opcode) {
  switch (opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    default:
      return IBV_WC_SEND;
  }
}

}  // namespace

void fabric::pump(qp_obj& qp, clock::time_point now) {
  if (dead(qp) || qp.attr.qp_state != IBV_QPS_RTS) {
    timed.erase(&qp);
    qp.wake_at = never;
    return;
  }
  if (deliver_responses(*this, qp, now)) execute_queued(*this, qp, now);
  complete_in_order(qp);
  if (qp.attr.qp_state == IBV_QPS_RTS) reschedule(*this, qp, now);
}

void fabric::complete_in_order(qp_obj& qp) {
  while (!qp.sq.empty() && qp.sq.front().where == stage::done) {
    const send_wqe& wqe = qp.sq.front();
    const bool ok = wqe.status == IBV_WC_SUCCESS;
    if (wqe.internal) {
      // Sent by the device itself (a TM rendezvous FIN): no completion, no slot.
    } else if (!ok || qp.sig_all || (wqe.flags & IBV_SEND_SIGNALED) != 0) {
      ibv_wc wc = make_wc(wqe.wr_id, wqe.status, qp.pub.qp_num);
      if (ok) wc.opcode = completion_opcode(wqe.opcode);
      if (ok && wqe.opcode == IBV_WR_RDMA_READ) wc.byte_len = static_cast<uint32_t>(wqe.length);
      push_cqe(*qp.send_cq, wc, &qp.sq_slots, qp.uncovered + 1, false);
      qp.uncovered = 0;
      ++qp.send_cqes;
    } else {
      ++qp.uncovered;
    }
    qp.sq.pop_front();
    if (qp.executed > 0) --qp.executed;
  }
}

namespace {

/// ibv_post_send's checks of one request: 0 or an errno value.
int check_send(const qp_obj& qp, const ibv_send_wr& wr) {
  switch (wr.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      break;
    default:
      return EINVAL;  // atomics and the rest are not modelled
  }
  if (wr.num_sge < 0 || (wr.num_sge > 0 && wr.sg_list == nullptr)) return EINVAL;
  if (static_cast<uint32_t>(wr.num_sge) > qp.cap.max_send_sge) return EINVAL;
  const bool read = wr.opcode == IBV_WR_RDMA_READ;
  if (read && wr.num_sge > qp.pd->ctx->dev->limits.max_sge_rd) return EINVAL;
  if ((wr.send_flags & IBV_SEND_INLINE) != 0) {
    uint64_t total = 0;
    for (int i = 0; i < wr.num_sge; ++i) total += wr.sg_list[i].length;
    if (read || total > qp.cap.max_inline_data) return EINVAL;
  }
  return qp.sq_slots >= qp.cap.max_send_wr ? ENOMEM : 0;
}

send_wqe copy_send(const ibv_send_wr& wr) {
  send_wqe wqe;
  wqe.wr_id = wr.wr_id;
  wqe.opcode = wr.opcode;
  wqe.flags = wr.send_flags;
  wqe.imm_data = wr.imm_data;
  wqe.remote_addr = wr.wr.rdma.remote_addr;
  wqe.rkey = wr.wr.rdma.rkey;
  wqe.sge.assign(wr.sg_list, wr.sg_list + wr.num_sge);
  for (const ibv_sge& sge : wqe.sge) wqe.length += sge.length;
  if ((wr.send_flags & IBV_SEND_INLINE) != 0) {
    for (const ibv_sge& sge : wqe.sge) {
      const auto* data = reinterpret_cast<const uint8_t*>(sge.addr);
      wqe.inline_data.insert(wqe.inline_data.end(), data, data + sge.length);
    }
  }
  return wqe;
}

int post_send(ibv_qp* handle, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  int error = qp == nullptr ? EINVAL : dead(*qp) ? EIO : 0;
  const ibv_qp_state state = qp ? qp->attr.qp_state : IBV_QPS_RESET;
  if (error == 0 && state != IBV_QPS_RTS && state != IBV_QPS_ERR) error = EINVAL;
  for (; error == 0 && wr != nullptr; wr = wr->next) {
    error = check_send(*qp, *wr);
    if (error != 0) break;
    qp->sq.push_back(copy_send(*wr));
    ++qp->sq_slots;
  }
  if (error != 0 && bad_wr != nullptr) *bad_wr = wr;
  if (qp == nullptr || dead(*qp)) return error;
  if (state == IBV_QPS_ERR) {
    f->flush_queues(*qp);
  } else {
    f->pump(*qp, clock::now());
  }
  return error;
}

int post_recv(ibv_qp* handle, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  int error = qp == nullptr ? EINVAL : dead(*qp) ? EIO : 0;
  if (error == 0 && (qp->attr.qp_state == IBV_QPS_RESET || qp->srq != nullptr)) error = EINVAL;
  for (; error == 0 && wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || (wr->num_sge > 0 && wr->sg_list == nullptr) ||
        static_cast<uint32_t>(wr->num_sge) > qp->cap.max_recv_sge) {
      error = EINVAL;
    } else if (qp->rq_slots >= qp->cap.max_recv_wr) {
      error = ENOMEM;
    } else {
      qp->rq.push_back(recv_wqe{wr->wr_id, {wr->sg_list, wr->sg_list + wr->num_sge}});
      ++qp->rq_slots;
    }
    if (error != 0) break;
  }
  if (error != 0 && bad_wr != nullptr) *bad_wr = wr;
  if (qp != nullptr && !dead(*qp) && qp->attr.qp_state == IBV_QPS_ERR) f->flush_queues(*qp);
  return error;
}

}  // namespace

void fill_wire(api& t) {
  t.post_send = post_send;
  t.post_recv = post_recv;
}

}  // namespace comm::verbs::testdev::detail
