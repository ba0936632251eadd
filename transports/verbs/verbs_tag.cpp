#include "verbs/verbs_tag.hpp"

#include "base/rkey.hpp"
#include "verbs/verbs_ep.hpp"
#include "verbs/verbs_iface.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

namespace comm::verbs {
namespace {

constexpr const char* log_name = "verbs";

/// Most iov entries of a posted receive.
constexpr size_t max_tag_iov = 8;

/// How long a cancel waits for its DEL's completion (the device answers in microseconds).
constexpr auto delete_wait = std::chrono::seconds(2);

/// The immediate value of a tagged eager message: the TMH's app_ctx is its high half, imm_data
/// its low half; without IBV_WC_WITH_IMM it is 0.
uint64_t immediate_of(const ibv_wc& wc, uint32_t app_ctx) {
  if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) return 0;
  return (uint64_t{app_ctx} << 32) | be32toh(wc.imm_data);
}

/// True for a software rendezvous request: an EAGER TMH with the reserved app_ctx and no
/// immediate value.
bool is_request(const ibv_wc& wc, uint32_t app_ctx) {
  return (wc.wc_flags & IBV_WC_WITH_IMM) == 0 && app_ctx == sw_rndv_app_ctx;
}

/// Copies `length` bytes at `data` into `iov` as far as it reaches.
void scatter(const std::vector<tl::iov>& iov, const uint8_t* data, size_t length) {
  size_t done = 0;
  for (const tl::iov& e : iov) {
    if (done == length) break;
    const size_t n = std::min(e.length, length - done);
    // A posted receive's iov is the receiver's memory to write (tl::iov holds it as const).
    if (n != 0) std::memcpy(const_cast<void*>(e.buffer), data + done, n);
    done += n;
  }
}

/// The first `length` bytes of `iov` (as far as it reaches), gathered.
std::vector<uint8_t> gather(const std::vector<tl::iov>& iov, size_t length) {
  std::vector<uint8_t> out;
  for (const tl::iov& e : iov) {
    if (out.size() == length) break;
    const size_t n = std::min(e.length, length - out.size());
    const auto* p = static_cast<const uint8_t*>(e.buffer);
    out.insert(out.end(), p, p + n);
  }
  return out;
}

/// The entries of `iov` that hold its first `length` bytes, the last one cut.
std::vector<tl::iov> clipped(const std::vector<tl::iov>& iov, size_t length) {
  std::vector<tl::iov> out;
  size_t done = 0;
  for (const tl::iov& e : iov) {
    if (done == length) break;
    const size_t n = std::min(e.length, length - done);
    if (n != 0) out.push_back(tl::iov{e.buffer, n});
    done += n;
  }
  return out;
}

status completion_status(size_t length, size_t capacity) {
  return length > capacity ? status::message_truncated : status::ok;
}

}  // namespace

/// A rendezvous taken in software: the RDMA READ of the sender's buffer into the receive's iov,
/// then an rndv_fin to the sender.
struct verbs_tags::fetch : tl::completion {
  verbs_tags* self = nullptr;
  verbs_conn* conn = nullptr;  ///< valid while the READ is outstanding on it
  tl::tag_context* ctx = nullptr;
  tl::tag_t tag = 0;
  std::vector<tl::iov> into;   ///< the receive's iov, cut to what is read
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;         ///< the sender's length
  size_t capacity = 0;         ///< the receive's
  uint32_t op_id = 0;          ///< the sender's operation
};

verbs_tags::verbs_tags(verbs_iface& owner, size_t max_outstanding, size_t max_iov,
                       uint32_t max_ops)
    : owner_(owner), max_iov_(max_iov), max_ops_(max_ops), entries_(max_outstanding) {
  for (size_t i = max_outstanding; i > 0; --i) free_.push_back(static_cast<uint32_t>(i - 1));
}

verbs_tags::~verbs_tags() {
  for (entry& e : entries_) {
    if (e.ctx != nullptr) owner_.md().unpin(e.pins);
  }
}

void verbs_tags::set_handlers(tl::tag_unexp_eager_fn eager, void* eager_arg,
                              tl::tag_unexp_rndv_fn rndv, void* rndv_arg) {
  eager_fn_ = eager;
  eager_arg_ = eager_arg;
  rndv_fn_ = rndv;
  rndv_arg_ = rndv_arg;
}

// -- the list -------------------------------------------------------------------------------------

uint32_t verbs_tags::find(const tl::tag_context* ctx) const {
  uint32_t index = 0;
  uint32_t generation = 0;
  std::memcpy(&index, ctx->priv, sizeof(index));
  std::memcpy(&generation, ctx->priv + sizeof(index), sizeof(generation));
  if (index == 0 || index > entries_.size()) return none;
  const entry& e = entries_[index - 1];
  return e.ctx == ctx && e.generation == generation ? index - 1 : none;
}

uint32_t verbs_tags::find_match(tl::tag_t stag) const {
  uint32_t best = none;
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    const entry& e = entries_[i];
    if (e.ctx == nullptr || ((e.tag ^ stag) & e.mask) != 0) continue;
    if (best == none || e.order < entries_[best].order) best = i;
  }
  return best;
}

verbs_tags::entry verbs_tags::take(uint32_t index) {
  entry& e = entries_[index];
  owner_.md().unpin(e.pins);
  if (!e.in_device) --software_only_;
  entry out = e;
  out.pins = pin_set{};
  e.ctx = nullptr;
  e.iov.clear();
  free_.push_back(index);
  --posted_;
  return out;
}

int verbs_tags::post_op(ibv_ops_wr& op) {
  if (ops_ >= max_ops_) owner_.stash_completions();  // reads the list operations that finished
  if (ops_ >= max_ops_) return ENOMEM;
  op.wr_id = wr_id_flag | op_flag | next_op_++;
  op.flags |= IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC;
  op.tm.unexpected_cnt = unexpected_;
  ibv_ops_wr* bad = nullptr;
  const int error = owner_.table().post_srq_ops(owner_.srq(), &op, &bad);
  if (error != 0) return error;
  ++ops_;
  sync_due_ = false;  // every operation reports the count
  return 0;
}

status verbs_tags::post(tl::tag_t tag, tl::tag_t mask, const tl::iov* entries, size_t count,
                        tl::tag_context* ctx) {
  size_t total = 0;
  if (ctx == nullptr || count > max_iov_ || count > max_zcopy_iov ||
      (count != 0 && entries == nullptr) || !tl::sum_iov(entries, count, &total) ||
      find(ctx) != none) {
    return status::invalid_param;
  }
  if (free_.empty()) return status::exceeds_limit;
  const uint32_t index = free_.back();
  entry& e = entries_[index];
  // One that would take an active message, and any posted after one the device does not hold,
  // stay in software.
  e.in_device = software_only_ == 0 && ((am_tag ^ tag) & mask) != 0;
  if (e.in_device) {
    const status st = add_to_device(index, tag, mask, entries, count);
    if (st != status::ok) return st;
  } else {
    ++software_only_;
  }
  free_.pop_back();
  e.ctx = ctx;
  e.tag = tag & mask;
  e.mask = mask;
  e.iov.assign(entries, entries + count);
  e.capacity = total;
  e.order = next_order_++;
  ++e.generation;
  const uint32_t named = index + 1;
  std::memcpy(ctx->priv, &named, sizeof(named));
  std::memcpy(ctx->priv + sizeof(named), &e.generation, sizeof(e.generation));
  ++posted_;
  return status::ok;
}

status verbs_tags::add_to_device(uint32_t index, tl::tag_t tag, tl::tag_t mask,
                                 const tl::iov* entries, size_t count) {
  entry& e = entries_[index];
  ibv_sge sges[max_zcopy_iov];
  if (count != 0 && owner_.md().local_sges(entries, count, sges, e.pins) != status::ok) {
    return status::io_error;
  }
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_ADD;
  op.tm.add.recv_wr_id = wr_id_flag | index;
  op.tm.add.sg_list = sges;
  op.tm.add.num_sge = static_cast<int>(count);
  op.tm.add.tag = tag & mask;
  op.tm.add.mask = mask;
  const int error = post_op(op);
  if (error != 0) {
    owner_.md().unpin(e.pins);
    COMM_LOG(debug, log_name, "tag ADD: %s", std::strerror(error));
    return error == ENOMEM ? status::exceeds_limit : status::io_error;
  }
  e.handle = op.tm.handle;
  return status::ok;
}

bool verbs_tags::delete_from_device(uint32_t handle, uint64_t* wr_id) {
  ibv_ops_wr op{};
  op.opcode = IBV_WR_TAG_DEL;
  op.tm.handle = handle;
  const int error = post_op(op);
  if (error != 0) {
    COMM_LOG(error, log_name, "tag DEL of handle %u: %s", handle, std::strerror(error));
    return false;
  }
  if (wr_id != nullptr) *wr_id = op.wr_id;
  return true;
}

status verbs_tags::cancel(tl::tag_context* ctx, bool force) {
  const uint32_t index = ctx != nullptr ? find(ctx) : none;
  if (index == none) return status::no_elem;
  if (entries_[index].in_device) {
    uint64_t wr_id = 0;
    if (!delete_from_device(entries_[index].handle, &wr_id) || !wait_for_delete(wr_id)) {
      // The device did not answer: the buffer stays its own until it does (never reused here).
      return status::io_error;
    }
    if (del_status_ != IBV_WC_SUCCESS) {
      // The device matched it before the DEL; its completion is in the stash now.
      work_completion* match = owner_.find_stashed(wr_id_flag | index);
      if (match == nullptr || !stage(entries_[index], *match)) {
        work_completion taken;
        if (match != nullptr && owner_.take_stashed(wr_id_flag | index, &taken)) {
          match_done(taken);
        }
        return status::no_elem;
      }
    }
  }
  take(index);
  ++canceled_;
  if (!force && ctx->completed != nullptr) ctx->completed(ctx, 0, 0, 0, status::canceled);
  return status::ok;
}

bool verbs_tags::wait_for_delete(uint64_t wr_id) {
  waited_del_ = wr_id;
  del_done_ = false;
  const auto deadline = std::chrono::steady_clock::now() + delete_wait;
  while (!del_done_ && std::chrono::steady_clock::now() < deadline) owner_.stash_completions();
  waited_del_ = 0;
  return del_done_;
}

bool verbs_tags::stage(const entry& e, work_completion& match) {
  const ibv_wc& wc = match.wc;
  // Only an eager message (an immediate value, or app_ctx 0) that fit can be handed on whole: a
  // rendezvous's sender is told already, a request's header and a truncated message's end are
  // not all there.
  const bool eager = (wc.wc_flags & IBV_WC_WITH_IMM) != 0 || match.tm.priv == 0;
  if (wc.status != IBV_WC_SUCCESS || wc.byte_len > e.capacity || !eager) return false;
  staged_message m;
  m.tag = match.tm.tag;
  m.imm = immediate_of(wc, match.tm.priv);
  m.data = gather(e.iov, wc.byte_len);
  const int64_t id = next_staged_++;
  staged_[id] = std::move(m);
  match.staged = id;
  ++raced_;
  if (verbs_conn* conn = owner_.conn_of_qp(wc.qp_num)) conn->receive_reposted();
  return true;
}

void verbs_tags::deliver_staged(int64_t id) {
  const auto found = staged_.find(id);
  if (found == staged_.end()) return;
  staged_message m = std::move(found->second);
  staged_.erase(found);
  ++unexpected_eager_;
  if (eager_fn_ == nullptr) {
    ++dropped_;
    return;
  }
  void* context = nullptr;
  eager_fn_(eager_arg_, m.data.data(), m.data.size(), tl::tag_flag_first, m.tag, m.imm, &context);
}

void verbs_tags::count_unexpected(const tagged_message& m) {
  if (m.opcode != IBV_TMH_EAGER && m.opcode != IBV_TMH_RNDV) return;
  ++unexpected_;
  sync_due_ = true;
}

bool verbs_tags::active_message(const tagged_message& m, const ibv_wc& wc) {
  if (m.opcode != IBV_TMH_EAGER || m.tag != am_tag || m.app_ctx != am_app_ctx ||
      (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    return false;
  }
  ++unexpected_;  // the device counted it
  sync_due_ = true;
  return true;
}

// -- completions of the device --------------------------------------------------------------------

bool verbs_tags::take_list_op(const work_completion& c) {
  if ((c.wc.wr_id & (wr_id_flag | op_flag)) != (wr_id_flag | op_flag)) return false;
  list_op_done(c);
  return true;
}

void verbs_tags::handle(const work_completion& c) {
  if ((c.wc.wr_id & op_flag) != 0) {
    list_op_done(c);
  } else {
    match_done(c);
  }
}

void verbs_tags::list_op_done(const work_completion& c) {
  if (ops_ > 0) --ops_;
  if (c.wc.wr_id == waited_del_) {
    del_done_ = true;
    del_status_ = c.wc.status;
    return;
  }
  if (c.wc.status != IBV_WC_SUCCESS && c.wc.status != IBV_WC_TM_ERR) {
    COMM_LOG(error, log_name, "a tag-matching list operation failed: %s",
             owner_.table().wc_status_str(c.wc.status));
  }
}

void verbs_tags::match_done(const work_completion& c) {
  const auto index = static_cast<uint32_t>(c.wc.wr_id & ~(wr_id_flag | op_flag));
  if (index >= entries_.size() || entries_[index].ctx == nullptr) {
    COMM_LOG(error, log_name, "a tagged-buffer completion for buffer %u, which is not posted",
             index);
    return;
  }
  const entry e = take(index);
  ++device_matched_;
  // The message used a credit of its sender but no receive buffer: the credit goes back.
  if (verbs_conn* conn = owner_.conn_of_qp(c.wc.qp_num)) conn->receive_reposted();
  tl::tag_context* ctx = e.ctx;
  if (ctx->tag_consumed != nullptr) ctx->tag_consumed(ctx);
  if (c.wc.status != IBV_WC_SUCCESS) {
    if (ctx->completed != nullptr) ctx->completed(ctx, c.tm.tag, 0, 0, status_of(c.wc.status));
    return;
  }
  if (is_request(c.wc, c.tm.priv)) {
    const std::vector<uint8_t> header = gather(e.iov, std::min<size_t>(c.wc.byte_len, e.capacity));
    if (ctx->rndv != nullptr) ctx->rndv(ctx, c.tm.tag, header.data(), header.size(), status::ok);
    return;
  }
  const uint64_t imm = immediate_of(c.wc, c.tm.priv);
  if (ctx->completed != nullptr) {
    ctx->completed(ctx, c.tm.tag, imm, c.wc.byte_len, completion_status(c.wc.byte_len, e.capacity));
  }
}

// -- what the device did not match ----------------------------------------------------------------

void verbs_tags::handle_tagged(verbs_conn& conn, uint32_t buffer, const tagged_message& m,
                               const work_completion& c) {
  if (m.opcode == IBV_TMH_FIN) {
    owner_.repost(buffer);  // sent by the peer's device: no credit was used
    if (conn.ep != nullptr) conn.ep->rndv_finished(m.app_ctx, status::ok);
    return;
  }
  ++unexpected_;
  sync_due_ = true;
  const uint32_t index = find_match(m.tag);
  if (index != none && entries_[index].in_device &&
      !delete_from_device(entries_[index].handle, nullptr)) {
    owner_.return_buffer(conn, buffer);
    conn.fail(status::io_error);
    return;
  }
  if (m.opcode == IBV_TMH_EAGER) {
    const uint64_t imm = immediate_of(c.wc, m.app_ctx);
    const bool request = is_request(c.wc, m.app_ctx);
    if (index == none) {
      unexpected_eager(conn, buffer, m, imm, request);
      return;
    }
    const entry e = take(index);
    ++software_matched_;
    deliver_eager(e, m.tag, imm, m.payload, m.payload_length, request);
    owner_.return_buffer(conn, buffer);
    return;
  }
  if (index == none) {
    unexpected_rndv(conn, m);
  } else {
    const entry e = take(index);
    ++software_matched_;
    start_fetch(conn, e, m);
  }
  owner_.return_buffer(conn, buffer);
}

void verbs_tags::deliver_eager(const entry& e, tl::tag_t stag, uint64_t imm, const uint8_t* data,
                               size_t length, bool request) {
  tl::tag_context* ctx = e.ctx;
  if (ctx->tag_consumed != nullptr) ctx->tag_consumed(ctx);
  if (request) {
    if (ctx->rndv != nullptr) ctx->rndv(ctx, stag, data, length, status::ok);
    return;
  }
  scatter(e.iov, data, std::min(length, e.capacity));
  if (ctx->completed != nullptr) {
    ctx->completed(ctx, stag, imm, length, completion_status(length, e.capacity));
  }
}

void verbs_tags::unexpected_eager(verbs_conn& conn, uint32_t buffer, const tagged_message& m,
                                  uint64_t imm, bool request) {
  if (request) {
    ++unexpected_rndv_;
    if (rndv_fn_ != nullptr) {
      rndv_fn_(rndv_arg_, 0, m.tag, m.payload, m.payload_length, 0, 0, nullptr, 0);
    } else {
      ++dropped_;
    }
    owner_.return_buffer(conn, buffer);
    return;
  }
  ++unexpected_eager_;
  if (eager_fn_ == nullptr) {
    ++dropped_;
    owner_.return_buffer(conn, buffer);
    return;
  }
  const unsigned flags = tl::tag_flag_first | (owner_.can_lend() ? tl::am_flag_desc : 0u);
  void* context = nullptr;
  auto* data = const_cast<uint8_t*>(m.payload);  // the receive buffer itself
  const status st = eager_fn_(eager_arg_, data, m.payload_length, flags, m.tag, imm, &context);
  if (st == status::in_progress && (flags & tl::am_flag_desc) != 0) {
    owner_.lend(conn, buffer);
  } else {
    owner_.return_buffer(conn, buffer);
  }
}

void verbs_tags::unexpected_rndv(verbs_conn& conn, const tagged_message& m) {
  ++unexpected_rndv_;
  if (rndv_fn_ == nullptr) {
    ++dropped_;
    return;
  }
  // The sender's buffer as a verbs key: its rkey as the index. The receiver does not know the
  // sender's process id, which verbs keys do not use; 1 stands for it.
  tl::packed_rkey key;
  key.magic = rkey_magic_verbs;
  key.pid = 1;
  key.index = m.rkey;
  key.iface_id = conn.peer_iface_id();
  key.generation = 1;
  key.base = m.address;
  key.length = m.length;
  std::vector<uint8_t> packed;
  tl::append_rkey(key, packed);
  rndv_fn_(rndv_arg_, 0, m.tag, m.payload, m.payload_length, m.address, m.length, packed.data(),
           packed.size());
}

void verbs_tags::start_fetch(verbs_conn& conn, const entry& e, const tagged_message& m) {
  tl::tag_context* ctx = e.ctx;
  if (ctx->tag_consumed != nullptr) ctx->tag_consumed(ctx);
  auto f = std::make_unique<fetch>();
  f->func = fetched;
  f->count = 1;
  f->self = this;
  f->conn = &conn;
  f->ctx = ctx;
  f->tag = m.tag;
  f->into = clipped(e.iov, std::min<size_t>(m.length, e.capacity));
  f->address = m.address;
  f->rkey = m.rkey;
  f->length = m.length;
  f->capacity = e.capacity;
  f->op_id = m.app_ctx;
  if (f->into.empty()) {
    fetched(f.release());  // nothing to read
    return;
  }
  if (!waiting_.empty() || !post_fetch(*f)) {
    waiting_.push_back(std::move(f));
    return;
  }
  f.release();  // owned by its completion
}

bool verbs_tags::post_fetch(fetch& f) {
  verbs_conn& conn = *f.conn;
  const status can = conn.can_post(false);
  if (can == status::no_resource || (can == status::ok && conn.reads_in_flight() >=
                                                               conn.max_reads())) {
    return false;
  }
  if (can != status::ok) {
    tl::complete(&f, can);
    return true;
  }
  ibv_sge sges[max_zcopy_iov];
  tx_request req;
  if (f.into.size() > max_zcopy_iov ||
      owner_.md().local_sges(f.into.data(), f.into.size(), sges, req.pins) != status::ok) {
    tl::complete(&f, status::io_error);
    return true;
  }
  req.wr.opcode = IBV_WR_RDMA_READ;
  req.wr.sg_list = sges;
  req.wr.num_sge = static_cast<int>(f.into.size());
  req.wr.wr.rdma.remote_addr = f.address;
  req.wr.wr.rdma.rkey = f.rkey;
  req.comp = &f;
  req.signal = true;
  const status posted = conn.post(req);
  if (posted != status::ok) tl::complete(&f, posted);
  return true;
}

void verbs_tags::fetched(tl::completion* comp) {
  std::unique_ptr<fetch> f(static_cast<fetch*>(comp));
  const status result = f->result;
  if (result == status::ok) f->conn->send_fin(f->op_id);
  tl::tag_context* ctx = f->ctx;
  if (ctx->completed != nullptr) {
    ctx->completed(ctx, f->tag, 0, f->length,
                   result == status::ok ? completion_status(f->length, f->capacity) : result);
  }
}

void verbs_tags::after_poll() {
  if (sync_due_ && posted_ > software_only_) {
    ibv_ops_wr op{};
    op.opcode = IBV_WR_TAG_SYNC;
    if (post_op(op) == 0) ++syncs_;
  }
  while (!waiting_.empty()) {
    if (!post_fetch(*waiting_.front())) break;
    waiting_.front().release();
    waiting_.pop_front();
  }
}

std::string verbs_tags::info() const {
  std::ostringstream out;
  out << "verbs: tag: " << posted_ << " of " << entries_.size() << " receives posted on the "
      << "tag-matching SRQ, " << device_matched_ << " matched by the device, " << software_matched_
      << " in software, " << unexpected_eager_ << " unexpected eager, " << unexpected_rndv_
      << " unexpected rendezvous, " << canceled_ << " canceled, " << dropped_
      << " without a handler, " << syncs_ << " syncs, " << ops_ << " list operations in flight\n";
  return out.str();
}

// -- the interface's tag operations ---------------------------------------------------------------

status verbs_iface::set_tag_handlers(tl::tag_unexp_eager_fn eager, void* eager_arg,
                                     tl::tag_unexp_rndv_fn rndv, void* rndv_arg) {
  if (tags_ == nullptr) return status::unsupported;
  tags_->set_handlers(eager, eager_arg, rndv, rndv_arg);
  return status::ok;
}

status verbs_iface::tag_recv_zcopy(tl::tag_t tag, tl::tag_t tag_mask, const tl::iov* entries,
                                   size_t count, tl::tag_context* ctx) {
  if (tags_ == nullptr) return status::unsupported;
  return tags_->post(tag, tag_mask, entries, count, ctx);
}

status verbs_iface::tag_recv_cancel(tl::tag_context* ctx, bool force) {
  if (tags_ == nullptr) return status::unsupported;
  return tags_->cancel(ctx, force);
}

ibv_srq* verbs_iface::create_tm_srq() {
  ibv_srq_init_attr_ex a{};
  a.attr.max_wr = static_cast<uint32_t>(config_.rx_buffers);
  a.attr.max_sge = 1;
  a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ |
                IBV_SRQ_INIT_ATTR_TM;
  a.srq_type = IBV_SRQT_TM;
  a.pd = pd_;
  a.cq = cq_;
  a.tm_cap.max_num_tags = std::min<uint32_t>(tm_caps_.max_num_tags, 4096);
  a.tm_cap.max_ops = tm_caps_.max_ops;
  ibv_srq* srq = t_.create_srq_ex(ctx_, &a);
  if (srq == nullptr) {
    COMM_LOG(error, log_name, "tag-matching SRQ (%u tags): %s", a.tm_cap.max_num_tags,
             std::strerror(errno));
    return nullptr;
  }
  const size_t max_iov = std::min<size_t>({tm_caps_.max_sge, max_zcopy_iov, max_tag_iov});
  tags_ = std::make_unique<verbs_tags>(*this, a.tm_cap.max_num_tags, max_iov, a.tm_cap.max_ops);
  return srq;
}

void verbs_iface::fill_tag_attr() {
  tl::iface_attr& a = attr_;
  tl::tag_limits& t = a.tag;
  a.caps |= tl::cap_tag_eager_short | tl::cap_tag_eager_bcopy | tl::cap_tag_eager_zcopy |
            tl::cap_tag_rndv_zcopy;
  t.eager.max_short = std::min<size_t>(seg_, 1024) - tmh_size;
  t.eager.max_bcopy = seg_ - tmh_size;
  t.eager.max_zcopy = seg_ - tmh_size;  // an unexpected one lands whole in a receive buffer
  t.eager.max_iov = a.max_iov;
  t.rndv.max_zcopy = std::min<size_t>(port_attr_.max_msg_sz, UINT32_MAX);
  t.rndv.max_hdr = std::min<size_t>(tm_caps_.max_rndv_hdr_size, seg_) - tmh_size - rvh_size;
  t.rndv.max_iov = 1;
  t.recv.max_zcopy = port_attr_.max_msg_sz;
  t.recv.max_iov = std::min<size_t>({tm_caps_.max_sge, max_zcopy_iov, max_tag_iov});
  t.recv.max_outstanding = tags_->max_outstanding();
}

void verbs_iface::close_tags() { tags_.reset(); }

work_completion* verbs_iface::find_stashed(uint64_t wr_id) {
  for (work_completion& c : stash_) {
    if (c.wc.wr_id == wr_id && c.staged < 0) return &c;
  }
  return nullptr;
}

bool verbs_iface::take_stashed(uint64_t wr_id, work_completion* out) {
  for (auto it = stash_.begin(); it != stash_.end(); ++it) {
    if (it->wc.wr_id != wr_id || it->staged >= 0) continue;
    *out = *it;
    stash_.erase(it);
    return true;
  }
  return false;
}

}  // namespace comm::verbs
