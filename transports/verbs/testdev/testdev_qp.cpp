// The verbs test device's queue pairs: creation with capacity checks, the RC state machine of
// ibv_modify_qp (RESET, INIT, RTR, RTS, ERR; each transition's required and optional attributes,
// as the ibv_modify_qp man page lists them), query, destruction, and the move to the error state
// that flushes every outstanding work request.
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <cerrno>
#include <cstring>

namespace comm::verbs::testdev::detail {
namespace {

/// A legal RC transition and the attributes it requires and allows.
struct transition {
  ibv_qp_state from;
  ibv_qp_state to;
  int required;
  int optional;
};

const transition rc_transitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER},
};

/// The transition from `from` to `to`, or null when RC has none (SQD and SQE are not modelled).
const transition* find_transition(ibv_qp_state from, ibv_qp_state to) {
  static const transition to_reset{IBV_QPS_RESET, IBV_QPS_RESET, 0, 0};
  static const transition to_error{IBV_QPS_ERR, IBV_QPS_ERR, 0, 0};
  const bool modelled = from <= IBV_QPS_RTS || from == IBV_QPS_ERR;
  if (!modelled) return nullptr;
  if (to == IBV_QPS_RESET) return &to_reset;
  if (to == IBV_QPS_ERR) return &to_error;
  for (const transition& t : rc_transitions) {
    if (t.from == from && t.to == to) return &t;
  }
  return nullptr;
}

constexpr int qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

/// The address vector check: a RoCE port needs a GRH with a valid source GID index.
int check_address_vector(const qp_obj& qp, const ibv_qp_attr& attr, int mask) {
  device_obj& dev = *qp.pd->ctx->dev;
  const uint32_t port_num = (mask & IBV_QP_PORT) != 0 ? attr.port_num : qp.attr.port_num;
  const port_obj* port = port_of(dev, port_num);
  if (port == nullptr) return EINVAL;
  const ibv_ah_attr& ah = attr.ah_attr;
  if (ah.port_num != 0 && ah.port_num != port_num) return EINVAL;
  const bool roce = port->attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (roce && !ah.is_global) return EINVAL;
  if (ah.is_global && ah.grh.sgid_index >= port->gids.size()) return EINVAL;
  return 0;
}

/// Range checks of the attributes in `mask`: 0 or EINVAL.
int check_attributes(const qp_obj& qp, const ibv_qp_attr& attr, int mask) {
  const device_limits& limits = qp.pd->ctx->dev->limits;
  const auto has = [mask](int bit) { return (mask & bit) != 0; };
  const bool bad =
      (has(IBV_QP_PORT) && port_of(*qp.pd->ctx->dev, attr.port_num) == nullptr) ||
      (has(IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) ||
      (has(IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~qp_access_flags) != 0) ||
      (has(IBV_QP_PATH_MTU) && (attr.path_mtu < IBV_MTU_256 || attr.path_mtu > IBV_MTU_4096)) ||
      (has(IBV_QP_DEST_QPN) && attr.dest_qp_num > 0xffffff) ||
      (has(IBV_QP_RQ_PSN) && attr.rq_psn > 0xffffff) ||
      (has(IBV_QP_SQ_PSN) && attr.sq_psn > 0xffffff) ||
      (has(IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > limits.max_qp_rd_atom) ||
      (has(IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > limits.max_qp_init_rd_atom) ||
      (has(IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > 31) ||
      (has(IBV_QP_TIMEOUT) && attr.timeout > 31) || (has(IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) ||
      (has(IBV_QP_RNR_RETRY) && attr.rnr_retry > 7);
  if (bad) return EINVAL;
  return has(IBV_QP_AV) ? check_address_vector(qp, attr, mask) : 0;
}

/// Copies the attributes in `mask` into the QP.
void apply_attributes(qp_obj& qp, const ibv_qp_attr& attr, int mask) {
  ibv_qp_attr& a = qp.attr;
  const auto has = [mask](int bit) { return (mask & bit) != 0; };
  if (has(IBV_QP_PORT)) a.port_num = attr.port_num;
  if (has(IBV_QP_PKEY_INDEX)) a.pkey_index = attr.pkey_index;
  if (has(IBV_QP_ACCESS_FLAGS)) a.qp_access_flags = attr.qp_access_flags;
  if (has(IBV_QP_AV)) a.ah_attr = attr.ah_attr;
  if (has(IBV_QP_PATH_MTU)) a.path_mtu = attr.path_mtu;
  if (has(IBV_QP_DEST_QPN)) a.dest_qp_num = attr.dest_qp_num;
  if (has(IBV_QP_RQ_PSN)) a.rq_psn = attr.rq_psn;
  if (has(IBV_QP_SQ_PSN)) a.sq_psn = attr.sq_psn;
  if (has(IBV_QP_MAX_DEST_RD_ATOMIC)) a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (has(IBV_QP_MAX_QP_RD_ATOMIC)) a.max_rd_atomic = attr.max_rd_atomic;
  if (has(IBV_QP_MIN_RNR_TIMER)) a.min_rnr_timer = attr.min_rnr_timer;
  if (has(IBV_QP_TIMEOUT)) a.timeout = attr.timeout;
  if (has(IBV_QP_RETRY_CNT)) a.retry_cnt = attr.retry_cnt;
  if (has(IBV_QP_RNR_RETRY)) a.rnr_retry = attr.rnr_retry;
}

void set_state(qp_obj& qp, ibv_qp_state state) {
  qp.attr.qp_state = state;
  qp.attr.cur_qp_state = state;
  qp.pub.state = state;
}

}  // namespace

void fabric::purge_completions(qp_obj& qp) {
  const auto purge = [&qp](cq_obj& cq) {
    auto& entries = cq.entries;
    for (const cqe& entry : entries) {
      if (entry.wc.qp_num == qp.pub.qp_num && entry.slots != nullptr) *entry.slots -= entry.covers;
    }
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&qp](const cqe& e) { return e.wc.qp_num == qp.pub.qp_num; }),
                  entries.end());
  };
  purge(*qp.send_cq);
  if (qp.recv_cq != qp.send_cq) purge(*qp.recv_cq);
}

void fabric::to_error(qp_obj& qp) {
  if (qp.attr.qp_state == IBV_QPS_ERR) return;
  set_state(qp, IBV_QPS_ERR);
  timed.erase(&qp);
  qp.wake_at = never;
  flush_queues(qp);
  if (qp.srq != nullptr) raise_async(*qp.pd->ctx, IBV_EVENT_QP_LAST_WQE_REACHED, &qp);
}

void fabric::flush_queues(qp_obj& qp) {
  qp.reads_in_flight = 0;
  for (send_wqe& wqe : qp.sq) {
    if (wqe.where == stage::done) continue;
    wqe.where = stage::done;
    wqe.status = IBV_WC_WR_FLUSH_ERR;
  }
  qp.executed = qp.sq.size();
  complete_in_order(qp);
  for (const recv_wqe& wqe : qp.rq) {
    push_cqe(*qp.recv_cq, make_wc(wqe.wr_id, IBV_WC_WR_FLUSH_ERR, qp.pub.qp_num), &qp.rq_slots, 1,
             false);
  }
  qp.rq.clear();
}

namespace {

/// Back to RESET: the queues empty without completions, and the QP's completions leave its CQs.
void reset(fabric& f, qp_obj& qp) {
  f.timed.erase(&qp);
  qp.wake_at = never;
  f.purge_completions(qp);
  qp.sq.clear();
  qp.rq.clear();
  qp.executed = 0;
  qp.sq_slots = qp.rq_slots = qp.uncovered = 0;
  qp.reads_in_flight = 0;
  qp.injected.reset();
  set_state(qp, IBV_QPS_RESET);
}

}  // namespace

int fabric::modify_qp(qp_obj& qp, const ibv_qp_attr& attr, int mask) {
  const ibv_qp_state current = qp.attr.qp_state;
  const ibv_qp_state next = (mask & IBV_QP_STATE) != 0 ? attr.qp_state : current;
  if ((mask & IBV_QP_CUR_STATE) != 0 && attr.cur_qp_state != current) return EINVAL;
  const transition* t = find_transition(current, next);
  if (t == nullptr) return EINVAL;
  const int given = mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
  if ((given & t->required) != t->required || (given & ~(t->required | t->optional)) != 0) {
    COMM_LOG(debug, log_name, "modify_qp 0x%x: %d -> %d with mask 0x%x refused", qp.pub.qp_num,
             current, next, mask);
    return EINVAL;
  }
  if (const int error = check_attributes(qp, attr, mask)) return error;
  apply_attributes(qp, attr, mask);
  if (next == IBV_QPS_RESET) {
    reset(*this, qp);
  } else if (next == IBV_QPS_ERR) {
    to_error(qp);
  } else {
    set_state(qp, next);
  }
  return 0;
}

namespace {

/// ibv_create_qp's capacity checks: 0 or an errno value.
int check_capacities(const ibv_qp_init_attr& init, const device_limits& limits) {
  const ibv_qp_cap& cap = init.cap;
  const bool with_rq = init.srq == nullptr;
  const bool bad = cap.max_send_wr < 1 ||
                   cap.max_send_wr > static_cast<uint32_t>(limits.max_qp_wr) ||
                   cap.max_send_sge > static_cast<uint32_t>(limits.max_sge) ||
                   cap.max_inline_data > limits.max_inline_data ||
                   (with_rq && (cap.max_recv_wr > static_cast<uint32_t>(limits.max_qp_wr) ||
                                cap.max_recv_sge > static_cast<uint32_t>(limits.max_sge)));
  return bad ? EINVAL : 0;
}

}  // namespace

namespace {

/// A new QP with the attributes of `init`, in RESET, numbered `qp_num`.
std::unique_ptr<qp_obj> make_qp(pd_obj& pd, const ibv_qp_init_attr& init, cq_obj& send_cq,
                                cq_obj& recv_cq, srq_obj* srq, uint32_t qp_num, uint32_t handle) {
  auto qp = std::make_unique<qp_obj>();
  qp->pd = &pd;
  qp->send_cq = &send_cq;
  qp->recv_cq = &recv_cq;
  qp->srq = srq;
  qp->cap = init.cap;
  if (srq != nullptr) qp->cap.max_recv_wr = qp->cap.max_recv_sge = 0;
  qp->sig_all = init.sq_sig_all != 0;
  qp->attr.cap = qp->cap;
  ibv_qp& pub = qp->pub;
  pub.context = pd.pub.context;
  pub.qp_context = init.qp_context;
  pub.pd = &pd.pub;
  pub.send_cq = init.send_cq;
  pub.recv_cq = init.recv_cq;
  pub.srq = init.srq;
  pub.handle = handle;
  pub.qp_num = qp_num;
  pub.qp_type = IBV_QPT_RC;
  set_state(*qp, IBV_QPS_RESET);
  return qp;
}

}  // namespace

qp_obj* fabric::create_qp(pd_obj& pd, ibv_qp_init_attr& init, int& error) {
  cq_obj* send_cq = find(cqs, init.send_cq);
  cq_obj* recv_cq = find(cqs, init.recv_cq);
  srq_obj* srq = init.srq ? find(srqs, init.srq) : nullptr;
  const bool cqs_ok = send_cq && recv_cq && send_cq->ctx == pd.ctx && recv_cq->ctx == pd.ctx;
  int on_device = 0;
  for (const auto& [h, other] : qps) on_device += other->pd->ctx->dev == pd.ctx->dev ? 1 : 0;
  const device_limits& limits = pd.ctx->dev->limits;
  error = init.qp_type != IBV_QPT_RC                 ? EOPNOTSUPP
          : !cqs_ok || (init.srq != nullptr && !srq) ? EINVAL
          : check_capacities(init, limits) != 0      ? EINVAL
          : on_device >= limits.max_qp               ? ENOMEM
                                                     : 0;
  if (error != 0) {
    COMM_LOG(debug, log_name, "create_qp refused: %s", std::strerror(error));
    return nullptr;
  }
  auto qp = make_qp(pd, init, *send_cq, *recv_cq, srq, next_qp_num++ & 0xffffff, next_key++);
  init.cap = qp->cap;
  ++send_cq->qps;
  ++recv_cq->qps;
  if (srq != nullptr) ++srq->qps;
  ++pd.children;
  qp_obj* created = qp.get();
  qp_by_num[created->pub.qp_num] = created;
  qps[&created->pub] = std::move(qp);
  return created;
}

int fabric::destroy_qp(qp_obj& qp) {
  if (!dead(qp) && qp.async_events.unacked()) {
    COMM_LOG(debug, log_name, "destroy_qp: async events not acknowledged (rdma-core would block)");
    return EBUSY;
  }
  drop_async_events(*qp.pd->ctx, &qp.pub);
  purge_completions(qp);
  timed.erase(&qp);
  overrun_victims.erase(std::remove(overrun_victims.begin(), overrun_victims.end(), &qp),
                        overrun_victims.end());
  qp_by_num.erase(qp.pub.qp_num);
  --qp.send_cq->qps;
  --qp.recv_cq->qps;
  if (qp.srq != nullptr) --qp.srq->qps;
  --qp.pd->children;
  if (qp.cm_id != nullptr) qp.cm_id->pub.qp = nullptr;
  qps.erase(&qp.pub);
  return 0;
}

namespace {

ibv_qp* create_qp(ibv_pd* handle, ibv_qp_init_attr* init) {
  locked_fabric f;
  pd_obj* pd = f ? find(f->pds, handle) : nullptr;
  if (pd == nullptr || init == nullptr) return fail_null<ibv_qp>(EINVAL);
  if (pd->ctx->dead) return fail_null<ibv_qp>(EIO);
  int error = 0;
  qp_obj* qp = f->create_qp(*pd, *init, error);
  return qp != nullptr ? &qp->pub : fail_null<ibv_qp>(error);
}

int modify_qp(ibv_qp* handle, ibv_qp_attr* attr, int attr_mask) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  if (qp == nullptr || attr == nullptr) return EINVAL;
  if (dead(*qp)) return EIO;
  return f->modify_qp(*qp, *attr, attr_mask);
}

int query_qp(ibv_qp* handle, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  if (qp == nullptr || attr == nullptr || init == nullptr) return EINVAL;
  if (dead(*qp)) return EIO;
  *attr = qp->attr;
  attr->cap = qp->cap;
  *init = ibv_qp_init_attr{};
  init->qp_context = qp->pub.qp_context;
  init->send_cq = qp->pub.send_cq;
  init->recv_cq = qp->pub.recv_cq;
  init->srq = qp->pub.srq;
  init->cap = qp->cap;
  init->qp_type = IBV_QPT_RC;
  init->sq_sig_all = qp->sig_all ? 1 : 0;
  return 0;
}

int destroy_qp(ibv_qp* handle) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  return qp == nullptr ? EINVAL : f->destroy_qp(*qp);
}

}  // namespace

void fill_qp(api& t) {
  t.create_qp = create_qp;
  t.modify_qp = modify_qp;
  t.query_qp = query_qp;
  t.destroy_qp = destroy_qp;
}

}  // namespace comm::verbs::testdev::detail
