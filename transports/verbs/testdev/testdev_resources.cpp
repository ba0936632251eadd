// The verbs test device's resources: device list, contexts, queries, async events, protection
// domains, memory regions, completion channels, completion queues and shared receive queues.
// Where the real thing would block forever (destroying a CQ or an SRQ whose events were not
// acknowledged) the test device refuses with EBUSY instead, so the mistake fails a test rather
// than hanging it.
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace comm::verbs::testdev::detail {

// -- fabric helpers --

void fabric::raise_async(context_obj& ctx, ibv_event_type type, void* element) {
  if (ctx.dead) return;
  ibv_async_event event{};
  switch (type) {
    case IBV_EVENT_CQ_ERR:
      event.element.cq = &static_cast<cq_obj*>(element)->pub;
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      event.element.srq = &static_cast<srq_obj*>(element)->pub;
      break;
    default:
      event.element.qp = &static_cast<qp_obj*>(element)->pub;
      break;
  }
  event.event_type = type;
  ctx.async.push(event);
}

void fabric::overrun(cq_obj& cq) {
  if (cq.overrun) return;
  cq.overrun = true;
  COMM_LOG(debug, log_name, "CQ %u overran (%zu entries)", cq.pub.handle, cq.capacity);
  raise_async(*cq.ctx, IBV_EVENT_CQ_ERR, &cq);
  for (auto& [handle, qp] : qps) {
    if (qp->send_cq == &cq || qp->recv_cq == &cq) overrun_victims.push_back(qp.get());
  }
}

void fabric::push_cqe(cq_obj& cq, const ibv_wc& wc, uint32_t* slots, uint32_t covers,
                      bool solicited, ibv_wc_tm_info tm) {
  if (cq.overrun || cq.ctx->dead) return;
  if (cq.entries.size() >= cq.capacity) {
    overrun(cq);
    return;
  }
  cq.entries.push_back(cqe{wc, slots, covers, tm});
  const bool wanted = !cq.solicited_only || solicited || wc.status != IBV_WC_SUCCESS;
  if (cq.armed && wanted) {
    cq.armed = false;
    if (cq.channel != nullptr) cq.channel->events.push(&cq);
  }
}

context_obj& fabric::rdmacm_context(device_obj& dev) {
  if (dev.cm_context != nullptr) return *dev.cm_context;
  auto ctx = std::make_unique<context_obj>();
  ctx->dev = &dev;
  ctx->for_rdmacm = true;
  ctx->pub.device = &dev.pub;
  ctx->pub.async_fd = ctx->async.fd();
  ctx->pub.cmd_fd = -1;
  ctx->pub.num_comp_vectors = 1;
  dev.cm_context = ctx.get();
  contexts[&ctx->pub] = std::move(ctx);
  return *dev.cm_context;
}

const void* element_of(const ibv_async_event& event) {
  switch (event.event_type) {
    case IBV_EVENT_CQ_ERR:
      return event.element.cq;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return event.element.srq;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      return nullptr;
    default:
      return event.element.qp;
  }
}

void drop_async_events(context_obj& ctx, const void* element) {
  ctx.async.remove_if([element](const ibv_async_event& e) { return element_of(e) == element; });
}

mr_obj* fabric::find_mr(uint32_t key) {
  const auto it = mr_by_key.find(key);
  return it == mr_by_key.end() ? nullptr : it->second;
}

namespace {

/// How many objects of a map belong to `dev` (for the device's max_* limits).
template <class Map, class Owner>
int count_on(const Map& map, Owner owner_of, const device_obj* dev) {
  int n = 0;
  for (const auto& [handle, obj] : map) n += owner_of(*obj) == dev ? 1 : 0;
  return n;
}

// -- devices and contexts --

ibv_device** get_device_list(int* num_devices) {
  locked_fabric f;
  if (!f) return fail_null<ibv_device*>(ENOSYS);  // no fabric: like a kernel without RDMA
  const size_t n = f->devices.size();
  auto list = std::make_unique<ibv_device*[]>(n + 1);
  for (size_t i = 0; i < n; ++i) list[i] = &f->devices[i]->pub;
  list[n] = nullptr;
  ibv_device** handle = list.get();
  f->device_lists[handle] = std::move(list);
  if (num_devices != nullptr) *num_devices = static_cast<int>(n);
  return handle;
}

void free_device_list(ibv_device** list) {
  locked_fabric f;
  if (f) f->device_lists.erase(list);
}

/// The fabric's device behind `device`, or null.
device_obj* device_of(fabric& f, const ibv_device* device) {
  for (auto& d : f.devices) {
    if (&d->pub == device) return d.get();
  }
  return nullptr;
}

const char* get_device_name(ibv_device* device) {
  locked_fabric f;
  device_obj* dev = f ? device_of(*f, device) : nullptr;
  return dev != nullptr ? dev->pub.name : nullptr;
}

ibv_context* open_device(ibv_device* device) {
  locked_fabric f;
  if (!f) return nullptr;
  device_obj* dev = device_of(*f, device);
  if (dev == nullptr) return fail_null<ibv_context>(ENODEV);
  auto ctx = std::make_unique<context_obj>();
  if (ctx->async.fd() < 0) return fail_null<ibv_context>(EMFILE);
  ctx->dev = dev;
  ctx->pub.device = device;
  ctx->pub.async_fd = ctx->async.fd();
  ctx->pub.cmd_fd = -1;
  ctx->pub.num_comp_vectors = 1;
  ibv_context* handle = &ctx->pub;
  f->contexts[handle] = std::move(ctx);
  return handle;
}

int close_device(ibv_context* handle) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr || ctx->for_rdmacm) return fail_minus_one(EINVAL);
  if (ctx->children != 0) {
    COMM_LOG(debug, log_name, "close_device: %zu PDs, CQs or channels still open", ctx->children);
    return fail_minus_one(EBUSY);
  }
  f->contexts.erase(handle);
  return 0;
}

ibv_device_attr device_attributes(const device_obj& dev) {
  const device_limits& l = dev.limits;
  ibv_device_attr attr{};
  std::snprintf(attr.fw_ver, sizeof(attr.fw_ver), "verbs test device 1.0");
  attr.node_guid = dev.guid;
  attr.sys_image_guid = dev.guid;
  attr.max_mr_size = l.max_mr_size;
  attr.page_size_cap = 0xfffff000;
  attr.max_qp = l.max_qp;
  attr.max_qp_wr = l.max_qp_wr;
  attr.device_cap_flags =
      IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID;
  attr.max_sge = l.max_sge;
  attr.max_sge_rd = l.max_sge_rd;
  attr.max_cq = l.max_cq;
  attr.max_cqe = l.max_cqe;
  attr.max_mr = l.max_mr;
  attr.max_pd = l.max_pd;
  attr.max_qp_rd_atom = l.max_qp_rd_atom;
  attr.max_res_rd_atom = l.max_qp_rd_atom * l.max_qp;
  attr.max_qp_init_rd_atom = l.max_qp_init_rd_atom;
  attr.atomic_cap = IBV_ATOMIC_NONE;
  attr.max_srq = l.max_srq;
  attr.max_srq_wr = l.max_srq_wr;
  attr.max_srq_sge = l.max_srq_sge;
  attr.max_pkeys = 1;
  attr.local_ca_ack_delay = 16;
  attr.phys_port_cnt = static_cast<uint8_t>(dev.ports.size());
  return attr;
}

int query_device(ibv_context* handle, ibv_device_attr* attr) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr || attr == nullptr) return EINVAL;
  if (ctx->dead) return EIO;
  *attr = device_attributes(*ctx->dev);
  return 0;
}

/// The extended attributes: the basic ones, and the tag matching the device was given
/// (device_limits::tm; all zero, the default: none).
int query_device_ex(ibv_context* handle, const ibv_query_device_ex_input* input,
                    ibv_device_attr_ex* attr) {
  if (attr == nullptr || (input != nullptr && input->comp_mask != 0)) return EINVAL;
  *attr = ibv_device_attr_ex{};
  const int error = query_device(handle, &attr->orig_attr);
  if (error != 0) return error;
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr) return EINVAL;
  attr->tm_caps = ctx->dev->limits.tm;
  if (attr->tm_caps.max_num_tags != 0) attr->tm_caps.flags |= IBV_TM_CAP_RC;
  return 0;
}

int query_port(ibv_context* handle, uint8_t port_num, ibv_port_attr* attr) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  port_obj* port = ctx ? port_of(*ctx->dev, port_num) : nullptr;
  if (port == nullptr || attr == nullptr) return EINVAL;
  if (ctx->dead) return EIO;
  *attr = port->attr;
  return 0;
}

const ibv_gid_entry* gid_entry(fabric& f, ibv_context* handle, uint32_t port_num, uint32_t index) {
  context_obj* ctx = find(f.contexts, handle);
  port_obj* port = ctx ? port_of(*ctx->dev, port_num) : nullptr;
  if (port == nullptr || index >= port->gids.size()) return nullptr;
  return &port->gids[index];
}

int query_gid(ibv_context* handle, uint8_t port_num, int index, ibv_gid* gid) {
  locked_fabric f;
  const ibv_gid_entry* entry =
      f && index >= 0 ? gid_entry(*f, handle, port_num, static_cast<uint32_t>(index)) : nullptr;
  if (entry == nullptr || gid == nullptr) return fail_minus_one(EINVAL);
  *gid = entry->gid;
  return 0;
}

int query_gid_ex(ibv_context* handle, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                 uint32_t flags) {
  locked_fabric f;
  const ibv_gid_entry* found = f ? gid_entry(*f, handle, port_num, gid_index) : nullptr;
  if (found == nullptr || entry == nullptr || flags != 0) return EINVAL;
  *entry = *found;
  return 0;
}

// -- async events --

event_count* async_counter(fabric& f, const ibv_async_event& event) {
  if (element_of(event) == nullptr) return nullptr;
  if (event.event_type == IBV_EVENT_CQ_ERR) {
    cq_obj* cq = find(f.cqs, event.element.cq);
    return cq ? &cq->async_events : nullptr;
  }
  if (event.event_type == IBV_EVENT_SRQ_ERR || event.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
    srq_obj* srq = find(f.srqs, event.element.srq);
    return srq ? &srq->async_events : nullptr;
  }
  qp_obj* qp = find(f.qps, event.element.qp);
  return qp ? &qp->async_events : nullptr;
}

int get_async_event(ibv_context* handle, ibv_async_event* event) {
  for (;;) {
    int fd = -1;
    {
      locked_fabric f;
      context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
      if (ctx == nullptr || event == nullptr) return fail_minus_one(EINVAL);
      if (ctx->async.pop(*event)) {
        if (event_count* count = async_counter(*f, *event)) ++count->got;
        return 0;
      }
      fd = ctx->async.fd();
    }
    if (!wait_readable(fd)) return -1;
  }
}

void ack_async_event(ibv_async_event* event) {
  locked_fabric f;
  if (!f || event == nullptr) return;
  if (event_count* count = async_counter(*f, *event)) ++count->acked;
}

// -- protection domains and memory regions --

ibv_pd* alloc_pd(ibv_context* handle) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr) return fail_null<ibv_pd>(EINVAL);
  if (ctx->dead) return fail_null<ibv_pd>(EIO);
  const auto dev_of = [](const pd_obj& pd) { return pd.ctx->dev; };
  if (count_on(f->pds, dev_of, ctx->dev) >= ctx->dev->limits.max_pd)
    return fail_null<ibv_pd>(ENOMEM);
  auto pd = std::make_unique<pd_obj>();
  pd->ctx = ctx;
  pd->pub.context = handle;
  pd->pub.handle = f->next_key++;
  ++ctx->children;
  ibv_pd* pub = &pd->pub;
  f->pds[pub] = std::move(pd);
  return pub;
}

int dealloc_pd(ibv_pd* handle) {
  locked_fabric f;
  pd_obj* pd = f ? find(f->pds, handle) : nullptr;
  if (pd == nullptr) return EINVAL;
  if (pd->children != 0) return EBUSY;
  --pd->ctx->children;
  f->pds.erase(handle);
  return 0;
}

constexpr int known_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                             IBV_ACCESS_RELAXED_ORDERING;

/// ibv_reg_mr's argument checks: 0 or an errno value.
int check_registration(const pd_obj& pd, const void* addr, size_t length, int access,
                       int registered) {
  const device_limits& limits = pd.ctx->dev->limits;
  if ((access & ~known_access) != 0) return EINVAL;
  const bool remote_write = (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  if (remote_write && (access & IBV_ACCESS_LOCAL_WRITE) == 0) return EINVAL;
  if (addr == nullptr && length != 0) return EINVAL;
  if (length > limits.max_mr_size) return EINVAL;
  if (registered >= limits.max_mr) return ENOMEM;
  return 0;
}

ibv_mr* reg_mr(ibv_pd* handle, void* addr, size_t length, int access) {
  locked_fabric f;
  pd_obj* pd = f ? find(f->pds, handle) : nullptr;
  if (pd == nullptr) return fail_null<ibv_mr>(EINVAL);
  if (pd->ctx->dead) return fail_null<ibv_mr>(EIO);
  const auto dev_of = [](const mr_obj& mr) { return mr.pd->ctx->dev; };
  const int error =
      check_registration(*pd, addr, length, access, count_on(f->mrs, dev_of, pd->ctx->dev));
  if (error != 0) return fail_null<ibv_mr>(error);
  auto mr = std::make_unique<mr_obj>();
  mr->pd = pd;
  mr->access = access;
  mr->pub.context = pd->pub.context;
  mr->pub.pd = handle;
  mr->pub.addr = addr;
  mr->pub.length = length;
  mr->pub.handle = f->next_key;
  mr->pub.lkey = mr->pub.rkey = f->next_key;
  f->next_key += 0x101;  // never reused: a stale key finds nothing
  ++pd->children;
  f->mr_by_key[mr->pub.lkey] = mr.get();
  ibv_mr* pub = &mr->pub;
  f->mrs[pub] = std::move(mr);
  return pub;
}

int dereg_mr(ibv_mr* handle) {
  locked_fabric f;
  mr_obj* mr = f ? find(f->mrs, handle) : nullptr;
  if (mr == nullptr) return EINVAL;
  f->mr_by_key.erase(mr->pub.lkey);
  --mr->pd->children;
  f->mrs.erase(handle);
  return 0;
}

// -- completion channels and completion queues --

ibv_comp_channel* create_comp_channel(ibv_context* handle) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr) return fail_null<ibv_comp_channel>(EINVAL);
  if (ctx->dead) return fail_null<ibv_comp_channel>(EIO);
  auto channel = std::make_unique<channel_obj>();
  if (channel->events.fd() < 0) return fail_null<ibv_comp_channel>(EMFILE);
  channel->ctx = ctx;
  channel->pub.context = handle;
  channel->pub.fd = channel->events.fd();
  ++ctx->children;
  ibv_comp_channel* pub = &channel->pub;
  f->channels[pub] = std::move(channel);
  return pub;
}

int destroy_comp_channel(ibv_comp_channel* handle) {
  locked_fabric f;
  channel_obj* channel = f ? find(f->channels, handle) : nullptr;
  if (channel == nullptr) return EINVAL;
  if (channel->cqs != 0) return EBUSY;
  --channel->ctx->children;
  f->channels.erase(handle);
  return 0;
}

ibv_cq* create_cq(ibv_context* handle, int cqe, void* cq_context, ibv_comp_channel* channel_handle,
                  int comp_vector) {
  locked_fabric f;
  context_obj* ctx = f ? find(f->contexts, handle) : nullptr;
  if (ctx == nullptr) return fail_null<ibv_cq>(EINVAL);
  if (ctx->dead) return fail_null<ibv_cq>(EIO);
  channel_obj* channel = channel_handle ? find(f->channels, channel_handle) : nullptr;
  const device_limits& limits = ctx->dev->limits;
  if (cqe < 1 || cqe > limits.max_cqe || comp_vector != 0) return fail_null<ibv_cq>(EINVAL);
  if (channel_handle != nullptr && (channel == nullptr || channel->ctx != ctx)) {
    return fail_null<ibv_cq>(EINVAL);
  }
  const auto dev_of = [](const cq_obj& cq) { return cq.ctx->dev; };
  if (count_on(f->cqs, dev_of, ctx->dev) >= limits.max_cq) return fail_null<ibv_cq>(ENOMEM);
  auto cq = std::make_unique<cq_obj>();
  cq->ctx = ctx;
  cq->channel = channel;
  cq->capacity = static_cast<size_t>(cqe);
  cq->pub.context = handle;
  cq->pub.channel = channel_handle;
  cq->pub.cq_context = cq_context;
  cq->pub.handle = f->next_key++;
  cq->pub.cqe = cqe;
  if (channel != nullptr) ++channel->cqs;
  ++ctx->children;
  ibv_cq* pub = &cq->pub;
  f->cqs[pub] = std::move(cq);
  return pub;
}

int destroy_cq(ibv_cq* handle) {
  locked_fabric f;
  cq_obj* cq = f ? find(f->cqs, handle) : nullptr;
  if (cq == nullptr) return EINVAL;
  if (cq->qps != 0) return EBUSY;
  if (!cq->ctx->dead && (cq->comp_events.unacked() || cq->async_events.unacked())) {
    COMM_LOG(debug, log_name, "destroy_cq: events not acknowledged (rdma-core would block)");
    return EBUSY;
  }
  if (cq->channel != nullptr) {
    cq->channel->events.remove_if([cq](const cq_obj* c) { return c == cq; });
    --cq->channel->cqs;
  }
  drop_async_events(*cq->ctx, handle);
  --cq->ctx->children;
  f->cqs.erase(handle);
  return 0;
}

int req_notify_cq(ibv_cq* handle, int solicited_only) {
  locked_fabric f;
  cq_obj* cq = f ? find(f->cqs, handle) : nullptr;
  if (cq == nullptr) return EINVAL;
  if (cq->ctx->dead) return EIO;
  cq->armed = true;
  cq->solicited_only = solicited_only != 0;
  return 0;
}

int poll_cq(ibv_cq* handle, int num_entries, ibv_wc* wc) {
  locked_fabric f;
  cq_obj* cq = f ? find(f->cqs, handle) : nullptr;
  if (cq == nullptr || num_entries < 0 || (num_entries > 0 && wc == nullptr)) return -EINVAL;
  if (cq->ctx->dead) return -EIO;
  f->run_due(clock::now());
  int n = 0;
  while (n < num_entries && !cq->entries.empty()) {
    const cqe& entry = cq->entries.front();
    if (entry.slots != nullptr) *entry.slots -= entry.covers;
    wc[n++] = entry.wc;
    cq->entries.pop_front();
  }
  return n;
}

int get_cq_event(ibv_comp_channel* handle, ibv_cq** cq_out, void** cq_context) {
  for (;;) {
    int fd = -1;
    {
      locked_fabric f;
      channel_obj* channel = f ? find(f->channels, handle) : nullptr;
      if (channel == nullptr || cq_out == nullptr) return fail_minus_one(EINVAL);
      cq_obj* cq = nullptr;
      if (channel->events.pop(cq)) {
        ++cq->comp_events.got;
        *cq_out = cq->handle();
        if (cq_context != nullptr) *cq_context = cq->pub.cq_context;
        return 0;
      }
      fd = channel->events.fd();
    }
    if (!wait_readable(fd)) return -1;
  }
}

void ack_cq_events(ibv_cq* handle, unsigned int nevents) {
  locked_fabric f;
  cq_obj* cq = f ? find(f->cqs, handle) : nullptr;
  if (cq != nullptr) cq->comp_events.acked += nevents;
}

// -- shared receive queues --

ibv_srq* create_srq(ibv_pd* handle, ibv_srq_init_attr* init) {
  locked_fabric f;
  pd_obj* pd = f ? find(f->pds, handle) : nullptr;
  if (pd == nullptr || init == nullptr) return fail_null<ibv_srq>(EINVAL);
  if (pd->ctx->dead) return fail_null<ibv_srq>(EIO);
  const device_limits& limits = pd->ctx->dev->limits;
  const ibv_srq_attr& want = init->attr;
  if (want.max_wr < 1 || want.max_wr > static_cast<uint32_t>(limits.max_srq_wr) ||
      want.max_sge < 1 || want.max_sge > static_cast<uint32_t>(limits.max_srq_sge)) {
    return fail_null<ibv_srq>(EINVAL);
  }
  const auto dev_of = [](const srq_obj& srq) { return srq.pd->ctx->dev; };
  if (count_on(f->srqs, dev_of, pd->ctx->dev) >= limits.max_srq) return fail_null<ibv_srq>(ENOMEM);
  auto srq = std::make_unique<srq_obj>();
  srq->pd = pd;
  srq->max_wr = want.max_wr;
  srq->max_sge = want.max_sge;
  srq->pub.context = pd->pub.context;
  srq->pub.srq_context = init->srq_context;
  srq->pub.pd = handle;
  srq->pub.handle = f->next_key++;
  init->attr.srq_limit = 0;
  ++pd->children;
  ibv_srq* pub = &srq->pub;
  f->srqs[pub] = std::move(srq);
  return pub;
}

int modify_srq(ibv_srq* handle, ibv_srq_attr* attr, int attr_mask) {
  locked_fabric f;
  srq_obj* srq = f ? find(f->srqs, handle) : nullptr;
  if (srq == nullptr || attr == nullptr) return EINVAL;
  if (srq->pd->ctx->dead) return EIO;
  if ((attr_mask & IBV_SRQ_MAX_WR) != 0) return EINVAL;  // no IBV_DEVICE_SRQ_RESIZE
  if ((attr_mask & IBV_SRQ_LIMIT) != 0) {
    if (attr->srq_limit > srq->max_wr) return EINVAL;
    srq->limit = attr->srq_limit;
  }
  return 0;
}

int destroy_srq(ibv_srq* handle) {
  locked_fabric f;
  srq_obj* srq = f ? find(f->srqs, handle) : nullptr;
  if (srq == nullptr) return EINVAL;
  if (srq->qps != 0) return EBUSY;
  if (!srq->pd->ctx->dead && srq->async_events.unacked()) return EBUSY;
  if (srq->tm_cq != nullptr) --srq->tm_cq->qps;
  drop_async_events(*srq->pd->ctx, handle);
  --srq->pd->children;
  f->srqs.erase(handle);
  return 0;
}

int post_srq_recv(ibv_srq* handle, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  locked_fabric f;
  srq_obj* srq = f ? find(f->srqs, handle) : nullptr;
  for (; wr != nullptr; wr = wr->next) {
    int error = 0;
    if (srq == nullptr || wr->num_sge < 0 || (wr->num_sge > 0 && wr->sg_list == nullptr)) {
      error = EINVAL;
    } else if (srq->pd->ctx->dead) {
      error = EIO;
    } else if (static_cast<uint32_t>(wr->num_sge) > srq->max_sge) {
      error = EINVAL;
    } else if (srq->slots >= srq->max_wr) {
      error = ENOMEM;
    }
    if (error != 0) {
      if (bad_wr != nullptr) *bad_wr = wr;
      return error;
    }
    srq->wqes.push_back(recv_wqe{wr->wr_id, {wr->sg_list, wr->sg_list + wr->num_sge}});
    ++srq->slots;
  }
  return 0;
}

}  // namespace

void fill_resources(api& t) {
  t.get_device_list = get_device_list;
  t.free_device_list = free_device_list;
  t.get_device_name = get_device_name;
  t.open_device = open_device;
  t.close_device = close_device;
  t.query_device = query_device;
  t.query_device_ex = query_device_ex;
  t.query_port = query_port;
  t.query_gid = query_gid;
  t.query_gid_ex = query_gid_ex;
  t.get_async_event = get_async_event;
  t.ack_async_event = ack_async_event;
  t.alloc_pd = alloc_pd;
  t.dealloc_pd = dealloc_pd;
  t.reg_mr = reg_mr;
  t.dereg_mr = dereg_mr;
  t.create_comp_channel = create_comp_channel;
  t.destroy_comp_channel = destroy_comp_channel;
  t.create_cq = create_cq;
  t.destroy_cq = destroy_cq;
  t.req_notify_cq = req_notify_cq;
  t.poll_cq = poll_cq;
  t.get_cq_event = get_cq_event;
  t.ack_cq_events = ack_cq_events;
  t.create_srq = create_srq;
  t.modify_srq = modify_srq;
  t.destroy_srq = destroy_srq;
  t.post_srq_recv = post_srq_recv;
}

}  // namespace comm::verbs::testdev::detail
