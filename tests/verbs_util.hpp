// Helpers of the verbs suites: RC endpoints built, connected and torn down through a verbs table
// (comm::verbs::api), so the same code runs on the verbs test device and on a real device.
// Every wait is bounded in iterations and time; nothing asserts on timing.
#pragma once

#include "verbs/verbs_api.hpp"
#include "verbs/verbs_device.hpp"

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace comm::test::verbs {

using comm::verbs::api;
using namespace std::chrono_literals;

/// Calls `done` until it is true: at most 2 million rounds and `limit` of time.
template <class Done>
bool eventually(Done done, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int round = 0; round < 2'000'000; ++round) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (round > 1000) std::this_thread::sleep_for(50us);
  }
  return false;
}

/// True when `fd` becomes readable within `timeout_ms` (0: now).
inline bool readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1;
}

/// Polls `cq` until `n` completions arrived (or the time is up); returns what arrived.
inline std::vector<ibv_wc> poll_n(const api& t, ibv_cq* cq, size_t n,
                                  std::chrono::milliseconds limit = 10s) {
  std::vector<ibv_wc> got;
  eventually(
      [&] {
        ibv_wc wc[16];
        const int k = t.poll_cq(cq, 16, wc);
        for (int i = 0; i < k; ++i) got.push_back(wc[i]);
        return k < 0 || got.size() >= n;
      },
      limit);
  return got;
}

/// Polls `cq` for `span` and returns every completion that arrived meanwhile.
inline std::vector<ibv_wc> poll_for(const api& t, ibv_cq* cq, std::chrono::milliseconds span) {
  std::vector<ibv_wc> got;
  eventually(
      [&] {
        ibv_wc wc[16];
        const int k = t.poll_cq(cq, 16, wc);
        for (int i = 0; i < k; ++i) got.push_back(wc[i]);
        return false;
      },
      span);
  return got;
}

/// Opens the device called `name` (verbs_device.hpp's lookup); throws when it cannot.
inline ibv_context* open_device(const api& t, const std::string& name) {
  ibv_context* ctx = comm::verbs::open_device_named(t, name);
  if (ctx == nullptr) throw std::runtime_error("cannot open " + name);
  return ctx;
}

/// A port's attributes and the GID its connections use, chosen as the transport chooses it
/// (comm::verbs::choose_gid).
struct address {
  ibv_port_attr port{};
  int gid_index = -1;
  ibv_gid gid{};
};

inline address port_address(const api& t, ibv_context* ctx, uint8_t port_num) {
  address a;
  if (t.query_port(ctx, port_num, &a.port) != 0) throw std::runtime_error("query_port failed");
  const comm::verbs::gid_choice chosen = comm::verbs::choose_gid(t, ctx, port_num, a.port);
  a.gid_index = chosen.index;
  a.gid = chosen.gid;
  return a;
}

/// Queue sizes and connection attributes of a test QP.
struct qp_options {
  uint32_t max_send_wr = 64;
  uint32_t max_recv_wr = 64;
  uint32_t max_sge = 4;
  uint32_t max_inline = 64;
  bool sig_all = true;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;  // 10 us
  int cqe = 256;
  uint8_t port = 1;
};

/// A registered buffer.
struct buffer {
  std::vector<uint8_t> bytes;
  ibv_mr* mr = nullptr;
  /// Its address as a work request carries it.
  uint64_t addr(size_t offset = 0) const {
    return reinterpret_cast<uint64_t>(bytes.data() + offset);
  }
  /// One scatter/gather entry over [offset, offset + length).
  ibv_sge sge(size_t offset, uint32_t length) const {
    return ibv_sge{addr(offset), length, mr ? mr->lkey : 0};
  }
};

/// Registers `size` bytes with `access`; throws on failure.
inline buffer make_buffer(const api& t, ibv_pd* pd, size_t size, int access) {
  buffer b;
  b.bytes.assign(size, 0);
  b.mr = t.reg_mr(pd, b.bytes.data(), size, access);
  if (b.mr == nullptr) throw std::runtime_error("reg_mr failed");
  return b;
}

/// One side of an RC connection and everything it owns. The destructor releases it all.
struct endpoint {
  const api* t = nullptr;
  ibv_context* ctx = nullptr;
  bool own_ctx = true;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* send_cq = nullptr;
  ibv_cq* recv_cq = nullptr;
  ibv_srq* srq = nullptr;  ///< not owned
  ibv_qp* qp = nullptr;
  buffer buf;
  qp_options options;

  endpoint() = default;
  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;
  ~endpoint() { release(); }

  /// Destroys the QP, buffer, CQs, channel and PD (and closes the context it owns).
  void release() {
    if (t == nullptr) return;
    if (qp != nullptr) t->destroy_qp(qp);
    if (buf.mr != nullptr) t->dereg_mr(buf.mr);
    if (send_cq != nullptr) t->destroy_cq(send_cq);
    if (recv_cq != nullptr) t->destroy_cq(recv_cq);
    if (channel != nullptr) t->destroy_comp_channel(channel);
    if (pd != nullptr) t->dealloc_pd(pd);
    if (own_ctx && ctx != nullptr) t->close_device(ctx);
    t = nullptr;
  }
};

/// Builds an endpoint on `ctx`: PD (or `pd`), channel, two CQs, a 64 KiB buffer, and an RC QP.
inline void build(const api& t, endpoint& e, ibv_context* ctx, const qp_options& o = {},
                  ibv_srq* srq = nullptr, ibv_pd* pd = nullptr) {
  e.t = &t;
  e.ctx = ctx;
  e.options = o;
  e.own_ctx = false;
  e.pd = pd != nullptr ? nullptr : t.alloc_pd(ctx);  // a PD given is not ours to free
  ibv_pd* use_pd = pd != nullptr ? pd : e.pd;
  e.channel = t.create_comp_channel(ctx);
  e.send_cq = t.create_cq(ctx, o.cqe, &e, e.channel, 0);
  e.recv_cq = t.create_cq(ctx, o.cqe, &e, e.channel, 0);
  e.srq = srq;
  e.buf = make_buffer(t, use_pd, 64 * 1024,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_qp_init_attr init{};
  init.send_cq = e.send_cq;
  init.recv_cq = e.recv_cq;
  init.srq = srq;
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = o.sig_all ? 1 : 0;
  init.cap.max_send_wr = o.max_send_wr;
  init.cap.max_recv_wr = srq ? 0 : o.max_recv_wr;
  init.cap.max_send_sge = o.max_sge;
  init.cap.max_recv_sge = srq ? 0 : o.max_sge;
  init.cap.max_inline_data = o.max_inline;
  e.qp = t.create_qp(use_pd, &init);
  if (e.qp == nullptr) throw std::runtime_error("create_qp failed");
}

/// RESET to INIT with the endpoint's port and access flags.
inline int to_init(const api& t, endpoint& e) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = e.options.port;
  a.pkey_index = 0;
  a.qp_access_flags = e.options.access;
  return t.modify_qp(e.qp, &a,
                     IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS);
}

/// INIT to RTR towards `peer`'s QP and port (LID on InfiniBand, GRH with its chosen GID on RoCE).
inline int to_rtr(const api& t, endpoint& e, const endpoint& peer, uint32_t rq_psn = 0) {
  const address local = port_address(t, e.ctx, e.options.port);
  const address remote = port_address(t, peer.ctx, peer.options.port);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(local.port.active_mtu, remote.port.active_mtu);
  a.dest_qp_num = peer.qp->qp_num;
  a.rq_psn = rq_psn;
  a.max_dest_rd_atomic = e.options.max_dest_rd_atomic;
  a.min_rnr_timer = e.options.min_rnr_timer;
  a.ah_attr.port_num = e.options.port;
  if (local.port.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    a.ah_attr.dlid = remote.port.lid;
  } else {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = remote.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(local.gid_index);
    a.ah_attr.grh.hop_limit = 64;
  }
  return t.modify_qp(e.qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

/// RTR to RTS with the endpoint's timers and READ depth.
inline int to_rts(const api& t, endpoint& e, uint32_t sq_psn = 0) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = sq_psn;
  a.timeout = e.options.timeout;
  a.retry_cnt = e.options.retry_cnt;
  a.rnr_retry = e.options.rnr_retry;
  a.max_rd_atomic = e.options.max_rd_atomic;
  return t.modify_qp(e.qp, &a,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

/// Connects two endpoints' QPs to each other (both to RTS); 0 or the first error.
inline int connect(const api& t, endpoint& a, endpoint& b) {
  int error = to_init(t, a);
  if (error == 0) error = to_init(t, b);
  if (error == 0) error = to_rtr(t, a, b);
  if (error == 0) error = to_rtr(t, b, a);
  if (error == 0) error = to_rts(t, a);
  if (error == 0) error = to_rts(t, b);
  return error;
}

/// Posts one send work request; returns post_send's answer.
inline int post(const api& t, ibv_qp* qp, ibv_wr_opcode opcode, std::vector<ibv_sge> sges,
                uint64_t wr_id, unsigned flags = 0, uint64_t remote_addr = 0, uint32_t rkey = 0,
                uint32_t imm = 0) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = opcode;
  wr.send_flags = flags;
  wr.sg_list = sges.data();
  wr.num_sge = static_cast<int>(sges.size());
  wr.imm_data = imm;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return t.post_send(qp, &wr, &bad);
}

/// Posts one receive of [offset, offset + length) of the endpoint's buffer.
inline int post_receive(const api& t, endpoint& e, size_t offset, uint32_t length, uint64_t wr_id) {
  ibv_sge sge = e.buf.sge(offset, length);
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return e.srq != nullptr ? t.post_srq_recv(e.srq, &wr, &bad) : t.post_recv(e.qp, &wr, &bad);
}

/// The QP's current state.
inline ibv_qp_state state_of(const api& t, ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  t.query_qp(qp, &a, IBV_QP_STATE, &init);
  return a.qp_state;
}

/// Fills `n` bytes at `p` with a pattern from `seed`.
inline void fill(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
}

/// True when `n` bytes at `p` hold the pattern from `seed`.
inline bool holds(const uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<uint8_t>(seed + i * 7)) return false;
  }
  return true;
}

/// What a loopback RC exchange on one device found wrong ("" when nothing): two QPs on one
/// context connected to each other, a SEND into a posted receive, an RDMA WRITE and an RDMA READ,
/// each checked byte for byte. It runs on the verbs test device and, where one exists, on a real
/// device.
inline std::string loopback_exchange(const api& t, const std::string& device) {
  ibv_context* ctx = open_device(t, device);
  std::string problem;
  {
    endpoint a, b;
    build(t, a, ctx);
    build(t, b, ctx);
    if (connect(t, a, b) != 0) problem = "connect failed";
    fill(a.buf.bytes.data(), 4096, 1);
    if (problem.empty() && post_receive(t, b, 0, 4096, 7) != 0) problem = "post_recv failed";
    if (problem.empty() && post(t, a.qp, IBV_WR_SEND, {a.buf.sge(0, 4096)}, 1) != 0) {
      problem = "post_send failed";
    }
    if (problem.empty() &&
        (poll_n(t, b.recv_cq, 1).size() != 1 || !holds(b.buf.bytes.data(), 4096, 1))) {
      problem = "SEND did not arrive intact";
    }
    fill(a.buf.bytes.data() + 8192, 1000, 2);
    if (problem.empty() &&
        (post(t, a.qp, IBV_WR_RDMA_WRITE, {a.buf.sge(8192, 1000)}, 2, IBV_SEND_SIGNALED,
              b.buf.addr(16384), b.buf.mr->rkey) != 0 ||
         poll_n(t, a.send_cq, 2).size() != 2 || !holds(b.buf.bytes.data() + 16384, 1000, 2))) {
      problem = "RDMA WRITE did not land intact";
    }
    fill(b.buf.bytes.data() + 32768, 3000, 3);
    if (problem.empty() &&
        (post(t, a.qp, IBV_WR_RDMA_READ, {a.buf.sge(40000, 3000)}, 3, IBV_SEND_SIGNALED,
              b.buf.addr(32768), b.buf.mr->rkey) != 0 ||
         poll_n(t, a.send_cq, 1).size() != 1 || !holds(a.buf.bytes.data() + 40000, 3000, 3))) {
      problem = "RDMA READ did not return the remote bytes";
    }
  }
  t.close_device(ctx);
  return problem;
}

}  // namespace comm::test::verbs
