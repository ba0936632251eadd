// The verbs test device's model of tag matching: extended CQs (ibv_create_cq_ex and the
// start/next/end_poll interface, with the TMH's tag and app_ctx readable through read_tm_info)
// and tag-matching SRQs (IBV_SRQT_TM). It is a software stand-in written from rdma-core's
// documentation (Documentation/tag_matching.md, verbs.h, tm_types.h), not a copy of any device:
//   - the list: ibv_post_srq_ops ADD puts a tagged buffer (tag, mask, scatter list, recv_wr_id)
//     on a list of max_num_tags entries (ENOMEM when full) and writes its handle back; DEL takes
//     it off (IBV_WC_TM_ERR when it is no longer there: matched, or never added); SYNC reports the
//     unexpected count. At most max_ops operations whose completions are not polled yet (ENOMEM);
//     unsignaled ones complete only when they fail. Operations execute when they are posted.
//   - matching: a SEND reaching a QP on the TM-SRQ starts with a TMH. EAGER and RNDV messages are
//     matched in arrival order against the list in the order the buffers were added, a buffer
//     taking a tag equal to its own in the bits of its mask; only while the software is in
//     synch (the count of the latest ADD/DEL carrying IBV_OPS_TM_SYNC, or SYNC, equals the
//     device's unexpected count) and, for RNDV, when the message is at most max_rndv_hdr_size.
//   - a match: EAGER scatters the payload after the TMH into the tagged buffer (as far as it
//     holds: the rest is dropped), RNDV reads the sender's buffer named by the RVH (as far as the
//     tagged buffer holds) with an RDMA READ checked like any READ, then sends the sender a FIN
//     (a TMH with the request's app_ctx) from the responder's QP. Either completes on the
//     TM-SRQ's CQ as IBV_WC_TM_RECV (wr_id the ADD's recv_wr_id, byte_len the message's length:
//     the payload's, or the RVH's, wc_flags IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID, the TMH's tag
//     and app_ctx as tm_info, imm_data with IBV_WC_WITH_IMM, the QP number of the connection).
//     A READ the sender's memory refuses fails the sender's SEND (IBV_WC_REM_OP_ERR) and both QPs
//     go to error; the tagged buffer stays on the list.
//   - a TMH whose reserved bytes are not zero, of an unknown opcode, or too short is matched
//     against nothing and counts as nothing.
//   - no match: the whole message, TMH included, lands in an ordinary buffer of the SRQ
//     (IBV_WC_TM_NO_TAG for NO_TAG messages, IBV_WC_RECV otherwise); EAGER and RNDV ones count as
//     unexpected, and carry IBV_WC_TM_SYNC_REQ when the list is not empty (the device stops
//     matching until the software reports the new count). No ordinary buffer: RNR, as for any
//     SEND.
// Real devices differ in details this model picks (what a tagged buffer too short for a message
// does, whether matches and data complete in one CQE, where a FIN lands); the verbs transport
// relies only on what is written here and in transports/verbs/README.md.
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <endian.h>

#include <cerrno>
#include <cstring>

namespace comm::verbs::testdev::detail {
namespace {

// -- extended completion queues --

cq_obj* cq_of(fabric& f, ibv_cq_ex* ex) {
  cq_obj* cq = find(f.cqs, reinterpret_cast<ibv_cq*>(ex));
  return cq != nullptr && cq->extended ? cq : nullptr;
}

/// Makes the next entry of `cq` current; ENOENT when there is none.
int advance(cq_obj& cq, ibv_cq_ex* ex) {
  cq.current.reset();
  if (cq.entries.empty()) return ENOENT;
  cq.current = cq.entries.front();
  cq.entries.pop_front();
  if (cq.current->slots != nullptr) *cq.current->slots -= cq.current->covers;
  ex->wr_id = cq.current->wc.wr_id;
  ex->status = cq.current->wc.status;
  return 0;
}

int start_poll(ibv_cq_ex* ex, ibv_poll_cq_attr* attr) {
  locked_fabric f;
  cq_obj* cq = f ? cq_of(*f, ex) : nullptr;
  if (cq == nullptr || attr == nullptr || attr->comp_mask != 0) return EINVAL;
  if (cq->ctx->dead) return EIO;
  f->run_due(clock::now());
  return advance(*cq, ex);
}

int next_poll(ibv_cq_ex* ex) {
  locked_fabric f;
  cq_obj* cq = f ? cq_of(*f, ex) : nullptr;
  if (cq == nullptr || !cq->current) return EINVAL;
  return advance(*cq, ex);
}

void end_poll(ibv_cq_ex* ex) {
  locked_fabric f;
  if (cq_obj* cq = f ? cq_of(*f, ex) : nullptr) cq->current.reset();
}

/// The current completion of `ex` (a zeroed one outside a poll: reading it then is a bug).
cqe current_of(ibv_cq_ex* ex) {
  locked_fabric f;
  cq_obj* cq = f ? cq_of(*f, ex) : nullptr;
  return cq != nullptr && cq->current ? *cq->current : cqe{};
}

ibv_wc_opcode read_opcode(ibv_cq_ex* ex) { return current_of(ex).wc.opcode; }
uint32_t read_byte_len(ibv_cq_ex* ex) { return current_of(ex).wc.byte_len; }
__be32 read_imm_data(ibv_cq_ex* ex) { return current_of(ex).wc.imm_data; }
uint32_t read_qp_num(ibv_cq_ex* ex) { return current_of(ex).wc.qp_num; }
uint32_t read_src_qp(ibv_cq_ex* ex) { return current_of(ex).wc.src_qp; }
unsigned int read_wc_flags(ibv_cq_ex* ex) { return current_of(ex).wc.wc_flags; }
uint32_t read_slid(ibv_cq_ex* ex) { return current_of(ex).wc.slid; }
uint8_t read_sl(ibv_cq_ex* ex) { return current_of(ex).wc.sl; }
uint8_t read_dlid_path_bits(ibv_cq_ex* ex) { return current_of(ex).wc.dlid_path_bits; }
uint32_t read_vendor_err(ibv_cq_ex* ex) { return current_of(ex).wc.vendor_err; }
void read_tm_info(ibv_cq_ex* ex, ibv_wc_tm_info* info) {
  if (info != nullptr) *info = current_of(ex).tm;
}

constexpr uint64_t supported_wc_flags =
    uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};

/// The provider ops of an extended CQ, so rdma-core's inline ibv_start_poll & co work too.
void fill_cq_ops(ibv_cq_ex& ex) {
  ex.start_poll = start_poll;
  ex.next_poll = next_poll;
  ex.end_poll = end_poll;
  ex.read_opcode = read_opcode;
  ex.read_vendor_err = read_vendor_err;
  ex.read_byte_len = read_byte_len;
  ex.read_imm_data = read_imm_data;
  ex.read_qp_num = read_qp_num;
  ex.read_src_qp = read_src_qp;
  ex.read_wc_flags = read_wc_flags;
  ex.read_slid = read_slid;
  ex.read_sl = read_sl;
  ex.read_dlid_path_bits = read_dlid_path_bits;
  ex.read_tm_info = read_tm_info;
}

ibv_cq_ex* create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (attr == nullptr || attr->comp_mask != 0 || (attr->wc_flags & ~supported_wc_flags) != 0) {
    errno = attr == nullptr ? EINVAL : EOPNOTSUPP;
    return nullptr;
  }
  const api& t = table();
  ibv_cq* plain = t.create_cq(context, static_cast<int>(attr->cqe), attr->cq_context,
                              attr->channel, static_cast<int>(attr->comp_vector));
  if (plain == nullptr) return nullptr;
  locked_fabric f;
  auto node = f->cqs.extract(plain);
  cq_obj& cq = *node.mapped();
  cq.extended = true;
  cq.ex.context = cq.pub.context;
  cq.ex.channel = cq.pub.channel;
  cq.ex.cq_context = cq.pub.cq_context;
  cq.ex.handle = cq.pub.handle;
  cq.ex.cqe = cq.pub.cqe;
  fill_cq_ops(cq.ex);
  node.key() = cq.handle();
  f->cqs.insert(std::move(node));
  return &cq.ex;
}

// -- tag-matching shared receive queues --

constexpr uint32_t srq_ex_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
                                 IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;

/// ibv_create_srq_ex's checks of a TM-SRQ against the device: 0 or an errno value.
int check_tm_srq(fabric& f, ibv_context* context, const ibv_srq_init_attr_ex& a) {
  context_obj* ctx = find(f.contexts, context);
  if (ctx == nullptr || (a.comp_mask & ~srq_ex_mask) != 0) return EINVAL;
  const ibv_tm_caps& caps = ctx->dev->limits.tm;
  if (caps.max_num_tags == 0) return EOPNOTSUPP;
  const uint32_t needed = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  if ((a.comp_mask & needed) != needed) return EINVAL;
  cq_obj* cq = find(f.cqs, a.cq);
  pd_obj* pd = find(f.pds, a.pd);
  if (cq == nullptr || pd == nullptr || cq->ctx != ctx || pd->ctx != ctx) return EINVAL;
  if (a.tm_cap.max_num_tags == 0 || a.tm_cap.max_num_tags > caps.max_num_tags ||
      a.tm_cap.max_ops == 0 || a.tm_cap.max_ops > caps.max_ops) {
    return EINVAL;
  }
  return 0;
}

ibv_srq* create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  if (attr == nullptr || (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) == 0 ||
      attr->srq_type == IBV_SRQT_XRC) {
    errno = attr == nullptr || (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) == 0 ? EINVAL
                                                                              : EOPNOTSUPP;
    return nullptr;
  }
  if (attr->srq_type == IBV_SRQT_TM) {
    locked_fabric f;
    const int error = f ? check_tm_srq(*f, context, *attr) : ENODEV;
    if (error != 0) return fail_null<ibv_srq>(error);
  } else if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) == 0) {
    return fail_null<ibv_srq>(EINVAL);
  }
  ibv_srq_init_attr basic{};
  basic.srq_context = attr->srq_context;
  basic.attr = attr->attr;
  ibv_srq* srq = table().create_srq(attr->pd, &basic);
  if (srq == nullptr) return nullptr;
  attr->attr = basic.attr;
  if (attr->srq_type != IBV_SRQT_TM) return srq;
  locked_fabric f;
  srq_obj& s = *find(f->srqs, srq);
  s.tm = true;
  s.tm_cq = find(f->cqs, attr->cq);
  ++s.tm_cq->qps;  // the CQ stays while the SRQ completes into it
  s.tags.resize(attr->tm_cap.max_num_tags);
  s.max_ops = attr->tm_cap.max_ops;
  s.max_rndv_hdr = s.pd->ctx->dev->limits.tm.max_rndv_hdr_size;
  return srq;
}

/// Completes a list operation on the TM-SRQ's CQ (when signaled or failed).
void complete_op(fabric& f, srq_obj& srq, const ibv_ops_wr& op, ibv_wc_opcode opcode,
                 ibv_wc_status status) {
  if ((op.flags & IBV_OPS_SIGNALED) == 0 && status == IBV_WC_SUCCESS) return;
  ibv_wc wc = make_wc(op.wr_id, status, 0);
  if (status == IBV_WC_SUCCESS) wc.opcode = opcode;
  ++srq.ops;
  f.push_cqe(*srq.tm_cq, wc, &srq.ops, 1, false);
}

/// One ADD: 0, or an errno value (no free entry: ENOMEM).
int add_tag(fabric& f, srq_obj& srq, ibv_ops_wr& op) {
  const uint32_t max_sge = srq.pd->ctx->dev->limits.tm.max_sge;
  if (op.tm.add.num_sge < 0 || static_cast<uint32_t>(op.tm.add.num_sge) > max_sge ||
      (op.tm.add.num_sge > 0 && op.tm.add.sg_list == nullptr)) {
    return EINVAL;
  }
  for (uint32_t i = 0; i < srq.tags.size(); ++i) {
    tag_entry& e = srq.tags[i];
    if (e.used) continue;
    e.used = true;
    e.tag = op.tm.add.tag;
    e.mask = op.tm.add.mask;
    e.recv_wr_id = op.tm.add.recv_wr_id;
    e.sge.assign(op.tm.add.sg_list, op.tm.add.sg_list + op.tm.add.num_sge);
    e.order = srq.next_order++;
    op.tm.handle = i;
    complete_op(f, srq, op, IBV_WC_TM_ADD, IBV_WC_SUCCESS);
    return 0;
  }
  return ENOMEM;
}

void del_tag(fabric& f, srq_obj& srq, const ibv_ops_wr& op) {
  const bool listed = op.tm.handle < srq.tags.size() && srq.tags[op.tm.handle].used;
  if (listed) srq.tags[op.tm.handle] = tag_entry{};
  complete_op(f, srq, op, IBV_WC_TM_DEL, listed ? IBV_WC_SUCCESS : IBV_WC_TM_ERR);
}

int post_srq_ops(ibv_srq* handle, ibv_ops_wr* op, ibv_ops_wr** bad_op) {
  locked_fabric f;
  srq_obj* srq = f ? find(f->srqs, handle) : nullptr;
  int error = srq == nullptr || !srq->tm ? EINVAL : srq->pd->ctx->dead ? EIO : 0;
  for (; error == 0 && op != nullptr; op = op->next) {
    if (srq->ops >= srq->max_ops) {
      error = ENOMEM;
      break;
    }
    const bool syncs = op->opcode == IBV_WR_TAG_SYNC || (op->flags & IBV_OPS_TM_SYNC) != 0;
    switch (op->opcode) {
      case IBV_WR_TAG_ADD:
        error = add_tag(*f, *srq, *op);
        break;
      case IBV_WR_TAG_DEL:
        del_tag(*f, *srq, *op);
        break;
      case IBV_WR_TAG_SYNC:
        complete_op(*f, *srq, *op, IBV_WC_TM_SYNC, IBV_WC_SUCCESS);
        break;
      default:
        error = EINVAL;
        break;
    }
    if (error == 0 && syncs) srq->sw_unexpected = op->tm.unexpected_cnt;
  }
  if (error != 0 && bad_op != nullptr) *bad_op = op;
  return error;
}

// -- delivery --

/// The TMH at the start of a message.
struct tmh_view {
  uint8_t opcode = IBV_TMH_NO_TAG;
  uint32_t app_ctx = 0;
  uint64_t tag = 0;
  bool valid = false;  ///< long enough, reserved bytes zero
};

tmh_view read_tmh(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < sizeof(ibv_tmh)) return tmh_view{};
  ibv_tmh h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  const bool reserved_zero = h.reserved[0] == 0 && h.reserved[1] == 0 && h.reserved[2] == 0;
  return tmh_view{h.opcode, be32toh(h.app_ctx), be64toh(h.tag), reserved_zero};
}

/// The earliest tagged buffer (in the order they were added) whose tag takes `tag`, or -1.
int find_match(const srq_obj& srq, uint64_t tag) {
  int best = -1;
  for (size_t i = 0; i < srq.tags.size(); ++i) {
    const tag_entry& e = srq.tags[i];
    if (!e.used || ((e.tag ^ tag) & e.mask) != 0) continue;
    if (best < 0 || e.order < srq.tags[static_cast<size_t>(best)].order) best = static_cast<int>(i);
  }
  return best;
}

bool any_tag(const srq_obj& srq) {
  for (const tag_entry& e : srq.tags) {
    if (e.used) return true;
  }
  return false;
}

/// Copies up to `length` bytes from `from` into the local scatter list `sge` (registered memory
/// of `pd` with local write); false when an entry is not. Returns the bytes copied in `*copied`.
bool scatter(fabric& f, const pd_obj& pd, const std::vector<ibv_sge>& sge, const uint8_t* from,
             uint64_t length, uint64_t* copied) {
  *copied = 0;
  for (const ibv_sge& s : sge) {
    if (*copied == length) break;
    if (s.length == 0) continue;
    const mr_obj* mr = f.find_mr(s.lkey);
    const auto start = mr ? reinterpret_cast<uint64_t>(mr->pub.addr) : 0;
    if (mr == nullptr || mr->pd != &pd || (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0 ||
        s.addr < start || s.addr - start > mr->pub.length ||
        s.length > mr->pub.length - (s.addr - start)) {
      return false;
    }
    const uint64_t n = std::min<uint64_t>(s.length, length - *copied);
    std::memcpy(reinterpret_cast<void*>(s.addr), from + *copied, n);
    *copied += n;
  }
  return true;
}

/// The matched tagged buffer completes on the TM-SRQ's CQ.
void complete_match(fabric& f, srq_obj& srq, qp_obj& r, const tag_entry& e, const tmh_view& h,
                    uint32_t length, const send_wqe& wqe, ibv_wc_status status) {
  ibv_wc wc = make_wc(e.recv_wr_id, status, r.pub.qp_num);
  wc.opcode = IBV_WC_TM_RECV;
  wc.byte_len = length;
  wc.wc_flags = IBV_WC_TM_MATCH | IBV_WC_TM_DATA_VALID;
  if (wqe.opcode == IBV_WR_SEND_WITH_IMM) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = wqe.imm_data;
  }
  f.push_cqe(*srq.tm_cq, wc, nullptr, 0, false, ibv_wc_tm_info{h.tag, h.app_ctx});
  ++f.stats.tm_matched;
}

/// The device sends the rendezvous requester a FIN from `r` (a TMH with the request's app_ctx).
void send_fin(fabric& f, qp_obj& r, uint32_t app_ctx) {
  ibv_tmh fin{};
  fin.opcode = IBV_TMH_FIN;
  fin.app_ctx = htobe32(app_ctx);
  send_wqe wqe;
  wqe.opcode = IBV_WR_SEND;
  wqe.internal = true;
  const auto* bytes = reinterpret_cast<const uint8_t*>(&fin);
  wqe.inline_data.assign(bytes, bytes + sizeof(fin));
  wqe.length = sizeof(fin);
  r.sq.push_back(std::move(wqe));
  r.wake_at = clock::now();
  f.timed.insert(&r);
  f.engine_wake.notify_one();
  ++f.stats.tm_fins;
}

/// A matched RNDV: the READ of the sender's buffer into the tagged buffer, then the FIN.
tm_outcome match_rndv(fabric& f, qp_obj& qp, qp_obj& r, srq_obj& srq, tag_entry& e,
                      const tmh_view& h, const std::vector<uint8_t>& bytes, const send_wqe& wqe) {
  ibv_rvh rvh{};
  std::memcpy(&rvh, bytes.data() + sizeof(ibv_tmh), sizeof(rvh));
  const uint64_t va = be64toh(rvh.va);
  const uint32_t rkey = be32toh(rvh.rkey);
  const uint32_t len = be32toh(rvh.len);
  const mr_obj* mr = f.find_mr(rkey);
  const auto start = mr ? reinterpret_cast<uint64_t>(mr->pub.addr) : 0;
  const bool readable = (qp.attr.qp_access_flags & IBV_ACCESS_REMOTE_READ) != 0 &&
                        (len == 0 || (mr != nullptr && mr->pd == qp.pd &&
                                      (mr->access & IBV_ACCESS_REMOTE_READ) != 0 &&
                                      va >= start && va - start <= mr->pub.length &&
                                      len <= mr->pub.length - (va - start)));
  if (!readable) return tm_outcome::failed;
  uint64_t copied = 0;
  const pd_obj& pd = *srq.pd;
  if (!scatter(f, pd, e.sge, reinterpret_cast<const uint8_t*>(va), len, &copied)) {
    return tm_outcome::failed;
  }
  const tag_entry matched = e;
  e = tag_entry{};
  complete_match(f, srq, r, matched, h, len, wqe, IBV_WC_SUCCESS);
  send_fin(f, r, h.app_ctx);
  return tm_outcome::delivered;
}

/// The message lands in an ordinary buffer of the SRQ, TMH included.
tm_outcome land_unexpected(fabric& f, qp_obj& qp, qp_obj& r, srq_obj& srq, const tmh_view& h,
                           const std::vector<uint8_t>& bytes, const send_wqe& wqe) {
  if (srq.wqes.empty()) return tm_outcome::not_ready;
  const recv_wqe receive = std::move(srq.wqes.front());
  srq.wqes.pop_front();
  uint64_t copied = 0;
  const bool tagged = h.valid && (h.opcode == IBV_TMH_EAGER || h.opcode == IBV_TMH_RNDV);
  ibv_wc wc = make_wc(receive.wr_id, IBV_WC_SUCCESS, r.pub.qp_num);
  if (!scatter(f, *srq.pd, receive.sge, bytes.data(), bytes.size(), &copied) ||
      copied < bytes.size()) {
    wc.status = copied < bytes.size() ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR;
    f.push_cqe(*r.recv_cq, wc, &srq.slots, 1, false);
    return tm_outcome::failed;
  }
  wc.opcode = h.valid && h.opcode == IBV_TMH_NO_TAG ? IBV_WC_TM_NO_TAG : IBV_WC_RECV;
  wc.byte_len = static_cast<uint32_t>(bytes.size());
  wc.src_qp = qp.pub.qp_num;
  if (wqe.opcode == IBV_WR_SEND_WITH_IMM) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = wqe.imm_data;
  }
  if (tagged) {
    ++srq.hw_unexpected;
    ++f.stats.tm_unexpected;
    if (any_tag(srq)) wc.wc_flags |= IBV_WC_TM_SYNC_REQ;
  }
  f.push_cqe(*r.recv_cq, wc, &srq.slots, 1, (wqe.flags & IBV_SEND_SOLICITED) != 0);
  return tm_outcome::delivered;
}

}  // namespace

tm_outcome tm_deliver(fabric& f, qp_obj& qp, qp_obj& r, const send_wqe& wqe,
                      const std::vector<uint8_t>& bytes) {
  srq_obj& srq = *r.srq;
  const tmh_view h = read_tmh(bytes);
  const bool in_synch = srq.sw_unexpected == srq.hw_unexpected;
  const bool eager = h.valid && h.opcode == IBV_TMH_EAGER;
  const bool rndv = h.valid && h.opcode == IBV_TMH_RNDV &&
                    bytes.size() >= sizeof(ibv_tmh) + sizeof(ibv_rvh) &&
                    bytes.size() <= srq.max_rndv_hdr;
  const int found = in_synch && (eager || rndv) ? find_match(srq, h.tag) : -1;
  if (found < 0) return land_unexpected(f, qp, r, srq, h, bytes, wqe);
  tag_entry& e = srq.tags[static_cast<size_t>(found)];
  if (rndv) return match_rndv(f, qp, r, srq, e, h, bytes, wqe);
  const uint64_t length = bytes.size() - sizeof(ibv_tmh);
  uint64_t copied = 0;
  const tag_entry matched = e;
  e = tag_entry{};
  const bool ok = scatter(f, *srq.pd, matched.sge, bytes.data() + sizeof(ibv_tmh), length, &copied);
  complete_match(f, srq, r, matched, h, static_cast<uint32_t>(length), wqe,
                 ok ? IBV_WC_SUCCESS : IBV_WC_LOC_PROT_ERR);
  return tm_outcome::delivered;
}

void fill_tm(api& t) {
  t.create_cq_ex = create_cq_ex;
  t.start_poll = start_poll;
  t.next_poll = next_poll;
  t.end_poll = end_poll;
  t.wc_read_opcode = read_opcode;
  t.wc_read_byte_len = read_byte_len;
  t.wc_read_imm_data = read_imm_data;
  t.wc_read_qp_num = read_qp_num;
  t.wc_read_wc_flags = read_wc_flags;
  t.wc_read_tm_info = read_tm_info;
  t.create_srq_ex = create_srq_ex;
  t.post_srq_ops = post_srq_ops;
}

}  // namespace comm::verbs::testdev::detail
