// The verbs test device's fabric: install and uninstall, the devices with their ports and GIDs,
// the progress thread, the lock every entry takes, and the injected faults.
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace comm::verbs::testdev {
namespace detail {
namespace {

std::atomic<fabric*> installed{nullptr};

sockaddr_storage parse_address(const std::string& text) {
  sockaddr_storage storage{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (::inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (::inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  } else {
    throw std::invalid_argument("verbs test device: not an IP address: " + text);
  }
  return storage;
}

}  // namespace

ibv_gid gid_of(const sockaddr_storage& address) {
  ibv_gid gid{};
  if (address.ss_family == AF_INET) {
    gid.raw[10] = 0xff;
    gid.raw[11] = 0xff;
    std::memcpy(&gid.raw[12], &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr, 4);
  } else {
    std::memcpy(gid.raw, &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr, 16);
  }
  return gid;
}

namespace {

/// A link-local GID fe80::<interface id>.
ibv_gid link_local_gid(uint64_t interface_id) {
  ibv_gid gid{};
  gid.raw[0] = 0xfe;
  gid.raw[1] = 0x80;
  for (int i = 0; i < 8; ++i) gid.raw[8 + i] = static_cast<uint8_t>(interface_id >> (56 - 8 * i));
  return gid;
}

void add_gid(port_obj& port, uint32_t port_num, const ibv_gid& gid, uint32_t type,
             uint32_t ifindex) {
  ibv_gid_entry entry{};
  entry.gid = gid;
  entry.gid_index = static_cast<uint32_t>(port.gids.size());
  entry.port_num = port_num;
  entry.gid_type = type;
  entry.ndev_ifindex = ifindex;
  port.gids.push_back(entry);
}

/// RoCE: a link-local v1/v2 pair, then a v1/v2 pair per address (the layout mlx5 shows).
/// InfiniBand: one GID, subnet prefix fe80:: and the port GUID.
void fill_gids(port_obj& port, uint32_t port_num, uint64_t port_guid, uint32_t ifindex) {
  if (port.attr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    add_gid(port, port_num, link_local_gid(port_guid), IBV_GID_TYPE_IB, 0);
    return;
  }
  add_gid(port, port_num, link_local_gid(port_guid), IBV_GID_TYPE_ROCE_V1, ifindex);
  add_gid(port, port_num, link_local_gid(port_guid), IBV_GID_TYPE_ROCE_V2, ifindex);
  for (const sockaddr_storage& address : port.addresses) {
    add_gid(port, port_num, gid_of(address), IBV_GID_TYPE_ROCE_V1, ifindex);
    add_gid(port, port_num, gid_of(address), IBV_GID_TYPE_ROCE_V2, ifindex);
  }
}

ibv_port_attr port_attributes(const port_spec& spec, const device_limits& limits, uint16_t lid) {
  ibv_port_attr attr{};
  attr.state = IBV_PORT_ACTIVE;
  attr.max_mtu = spec.mtu;
  attr.active_mtu = spec.mtu;
  attr.max_msg_sz = limits.max_msg_sz;
  attr.pkey_tbl_len = 1;
  attr.lid = lid;
  attr.sm_lid = lid != 0 ? 1 : 0;
  attr.max_vl_num = 1;
  attr.active_width = 2;   // 4x
  attr.active_speed = 32;  // EDR
  attr.phys_state = 5;     // LinkUp
  attr.link_layer = spec.link_layer;
  return attr;
}

void name_device(ibv_device& pub, const std::string& name, size_t index) {
  if (name.empty() || name.size() >= sizeof(pub.name)) {
    throw std::invalid_argument("verbs test device: bad device name '" + name + "'");
  }
  std::snprintf(pub.name, sizeof(pub.name), "%s", name.c_str());
  std::snprintf(pub.dev_name, sizeof(pub.dev_name), "uverbs%zu", index);
  std::snprintf(pub.dev_path, sizeof(pub.dev_path), "/sys/class/infiniband_verbs/uverbs%zu", index);
  std::snprintf(pub.ibdev_path, sizeof(pub.ibdev_path), "/sys/class/infiniband/%s", pub.name);
  pub.node_type = IBV_NODE_CA;
  pub.transport_type = IBV_TRANSPORT_IB;
}

std::unique_ptr<device_obj> make_device(const device_spec& spec, size_t index, uint16_t& next_lid) {
  auto dev = std::make_unique<device_obj>();
  name_device(dev->pub, spec.name, index);
  dev->limits = spec.limits;
  dev->guid = 0x0002c90300a00000ull + (index << 8);
  for (size_t p = 0; p < spec.ports.size(); ++p) {
    const port_spec& ps = spec.ports[p];
    const bool ib = ps.link_layer == IBV_LINK_LAYER_INFINIBAND;
    port_obj port;
    port.attr = port_attributes(ps, spec.limits, ib ? next_lid++ : 0);
    for (const std::string& text : ps.addresses) port.addresses.push_back(parse_address(text));
    const auto port_num = static_cast<uint32_t>(p + 1);
    fill_gids(port, port_num, dev->guid + port_num, static_cast<uint32_t>(10 + index * 4 + p));
    port.attr.gid_tbl_len = static_cast<int>(port.gids.size());
    dev->ports.push_back(std::move(port));
  }
  return dev;
}

}  // namespace

bool wait_readable(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) != 0) {
    errno = EAGAIN;
    return false;
  }
  pollfd pfd{fd, POLLIN, 0};
  while (::poll(&pfd, 1, -1) < 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

fabric::fabric(const std::vector<device_spec>& specs) {
  uint16_t next_lid = 1;
  for (size_t i = 0; i < specs.size(); ++i) devices.push_back(make_device(specs[i], i, next_lid));
  engine_ = std::thread([this] { engine_loop(); });
}

fabric::~fabric() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping_ = true;
  }
  engine_wake.notify_all();
  engine_.join();
}

void fabric::engine_loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping_) {
    run_due(clock::now());
    settle();
    clock::time_point next = never;
    for (const qp_obj* qp : timed) next = std::min(next, qp->wake_at);
    if (next == never) {
      engine_wake.wait(lock);
    } else {
      engine_wake.wait_until(lock, next);
    }
  }
}

void fabric::run_due(clock::time_point now) {
  std::vector<qp_obj*> due;
  for (qp_obj* qp : timed) {
    if (qp->wake_at <= now) due.push_back(qp);
  }
  for (qp_obj* qp : due) {
    if (timed.count(qp) != 0) pump(*qp, now);
  }
}

void fabric::settle() {
  while (!overrun_victims.empty()) {
    qp_obj* qp = overrun_victims.back();
    overrun_victims.pop_back();
    if (qp->attr.qp_state == IBV_QPS_ERR || qp->attr.qp_state == IBV_QPS_RESET || dead(*qp))
      continue;
    COMM_LOG(debug, log_name, "QP 0x%x: its CQ overran, QP to error", qp->pub.qp_num);
    raise_async(*qp->pd->ctx, IBV_EVENT_QP_FATAL, qp);
    to_error(*qp);
  }
}

size_t fabric::live_objects() const {
  size_t n = device_lists.size() + pds.size() + mrs.size() + channels.size() + cqs.size() +
             srqs.size() + qps.size() + cm_ids.size();
  for (const auto& [handle, ctx] : contexts) n += ctx->for_rdmacm ? 0 : 1;
  for (const auto& [handle, channel] : cm_channels) n += channel->destroyed ? 0 : 1;
  for (const auto& [handle, event] : cm_events) n += event->delivered ? 1 : 0;
  return n;
}

locked_fabric::locked_fabric() : fabric_(installed.load()) {
  if (fabric_ == nullptr) {
    errno = ENODEV;
    return;
  }
  lock_ = std::unique_lock<std::mutex>(fabric_->mutex);
}

locked_fabric::~locked_fabric() {
  if (lock_.owns_lock()) fabric_->settle();
}

void locked_fabric::unlock() {
  fabric_->settle();
  lock_.unlock();
}

}  // namespace detail

using namespace detail;

namespace {

device_spec one_port_device(const std::string& name, uint8_t link_layer, ibv_mtu mtu,
                            const std::string& address) {
  device_spec spec;
  spec.name = name;
  port_spec port;
  port.link_layer = link_layer;
  port.mtu = mtu;
  port.addresses = {address};
  spec.ports = {port};
  return spec;
}

}  // namespace

device_spec roce_device(const std::string& name, const std::string& address) {
  return one_port_device(name, IBV_LINK_LAYER_ETHERNET, IBV_MTU_1024, address);
}

device_spec ib_device(const std::string& name, const std::string& address) {
  return one_port_device(name, IBV_LINK_LAYER_INFINIBAND, IBV_MTU_4096, address);
}

device_spec with_tag_matching(device_spec spec, uint32_t max_num_tags, uint32_t max_sge,
                              uint32_t max_rndv_hdr_size) {
  ibv_tm_caps& tm = spec.limits.tm;
  tm.max_num_tags = max_num_tags;
  tm.max_ops = 64;
  tm.max_sge = max_sge;
  tm.max_rndv_hdr_size = max_rndv_hdr_size;
  tm.flags = IBV_TM_CAP_RC;
  return spec;
}

void install(const std::vector<device_spec>& devices) {
  auto created = std::make_unique<fabric>(devices);
  fabric* expected = nullptr;
  if (!installed.compare_exchange_strong(expected, created.get())) {
    throw std::logic_error("verbs test device: a fabric is installed already");
  }
  created.release();
  COMM_LOG(debug, log_name, "installed with %zu devices", devices.size());
}

size_t uninstall() {
  std::unique_ptr<fabric> gone(installed.exchange(nullptr));
  if (!gone) return 0;
  size_t leaked = 0;
  {
    std::lock_guard<std::mutex> lock(gone->mutex);
    leaked = gone->live_objects();
  }
  if (leaked != 0) COMM_LOG(warn, log_name, "uninstalled with %zu objects not released", leaked);
  return leaked;
}

size_t live_objects() {
  locked_fabric f;
  return f ? f->live_objects() : 0;
}

counters stats() {
  locked_fabric f;
  return f ? f->stats : counters{};
}

uint64_t send_completions(ibv_qp* handle) {
  locked_fabric f;
  const qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  return qp != nullptr ? qp->send_cqes : 0;
}

int fail_next_send(ibv_qp* handle, ibv_wc_status status) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  if (qp == nullptr) return EINVAL;
  qp->injected = status;
  return 0;
}

int fail_qp(ibv_qp* handle) {
  locked_fabric f;
  qp_obj* qp = f ? find(f->qps, handle) : nullptr;
  if (qp == nullptr) return EINVAL;
  f->raise_async(*qp->pd->ctx, IBV_EVENT_QP_FATAL, qp);
  f->to_error(*qp);
  return 0;
}

int overrun_cq(ibv_cq* handle) {
  locked_fabric f;
  cq_obj* cq = f ? find(f->cqs, handle) : nullptr;
  if (cq == nullptr) return EINVAL;
  f->overrun(*cq);
  return 0;
}

namespace {

device_obj* device_named(fabric& f, const std::string& name) {
  for (auto& dev : f.devices) {
    if (name == dev->pub.name) return dev.get();
  }
  return nullptr;
}

}  // namespace

int peer_gone(const std::string& device, peer_failure how) {
  locked_fabric f;
  device_obj* dev = f ? device_named(*f, device) : nullptr;
  if (dev == nullptr) return ENODEV;
  for (auto& [handle, ctx] : f->contexts) {
    if (ctx->dev == dev) ctx->dead = true;
  }
  for (auto& [handle, qp] : f->qps) {
    if (!dead(*qp)) continue;
    f->timed.erase(qp.get());
    qp->wake_at = never;
  }
  f->cm_peer_gone(*dev, how);
  dev->cm_context = nullptr;
  COMM_LOG(debug, log_name, "%s: peer gone (%s)", device.c_str(),
           how == peer_failure::process_exit ? "process exit" : "host lost");
  return 0;
}

int set_port_state(const std::string& device, uint8_t port_num, ibv_port_state state) {
  locked_fabric f;
  device_obj* dev = f ? device_named(*f, device) : nullptr;
  port_obj* port = dev ? port_of(*dev, port_num) : nullptr;
  if (port == nullptr) return ENODEV;
  if (state != IBV_PORT_ACTIVE && state != IBV_PORT_DOWN) return EINVAL;
  port->attr.state = state;
  port->attr.phys_state = state == IBV_PORT_ACTIVE ? 5 : 3;  // LinkUp or Disabled
  const auto type = state == IBV_PORT_ACTIVE ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
  for (auto& [handle, ctx] : f->contexts) {
    if (ctx->dev != dev) continue;
    ibv_async_event event{};
    event.element.port_num = port_num;
    event.event_type = type;
    if (!ctx->dead) ctx->async.push(event);
  }
  return 0;
}

void hold_read_responses(bool hold) {
  locked_fabric f;
  if (!f) return;
  f->reads_held = hold;
  if (hold) return;
  const auto now = clock::now();
  for (auto& [handle, qp] : f->qps) {
    if (qp->reads_in_flight != 0 && !dead(*qp)) f->pump(*qp, now);
  }
  f->engine_wake.notify_one();
}

}  // namespace comm::verbs::testdev
