// The verbs test device's rdmacm: event channels, ids, addresses on the devices' ports,
// listen/connect/accept/reject/establish/disconnect with private data, and a QP on an id moved
// through INIT, RTR and RTS by the connection, as librdmacm and the kernel's IB CM do:
//   - private data is at most 56 bytes in a connect, 196 in an accept and 148 in a reject, and
//     the receiver sees the whole field of its message (zero padded), not the length sent;
//   - CONNECT_REQUEST swaps responder_resources and initiator_depth into the server's view;
//   - a connect nobody listens to is REJECTED with status 8 (invalid service id), a consumer's
//     reject (and an overflowing backlog) with status 28; a client that gives up before the answer
//     leaves the server's id REJECTED with status 4 (timeout); a REJECTED client's QP goes to ERR;
//   - QPs of connections get REMOTE_WRITE (and REMOTE_READ when responder_resources is not 0),
//     min_rnr_timer 0 (655 ms) and an ACK timeout of 19 unless set_option(ACK_TIMEOUT) says else;
//   - rdma_disconnect moves the id's QP to ERR and both sides get DISCONNECTED once.
// Events are queued in order on the id's channel; a connection request counts as an event of its
// listener (the new id may be destroyed before the request is acknowledged).
#include "verbs/testdev/fabric.hpp"

#include <comm/log.hpp>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace comm::verbs::testdev::detail {
namespace {

constexpr size_t connect_data_size = 56;
constexpr size_t accept_data_size = 196;
constexpr size_t reject_data_size = 148;
constexpr int reject_timeout = 4;
constexpr int reject_invalid_service_id = 8;
constexpr int reject_consumer = 28;

// -- addresses --

sockaddr_storage& source(cm_id_obj& id) { return id.pub.route.addr.src_storage; }
sockaddr_storage& destination(cm_id_obj& id) { return id.pub.route.addr.dst_storage; }

uint16_t port_be(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in&>(a).sin_port;
  if (a.ss_family == AF_INET6) return reinterpret_cast<const sockaddr_in6&>(a).sin6_port;
  return 0;
}

void set_port_be(sockaddr_storage& a, uint16_t port) {
  if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(a).sin_port = port;
  if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = port;
}

bool is_any(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr == htonl(INADDR_ANY);
  }
  const in6_addr& ip = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return std::memcmp(&ip, &in6addr_any, sizeof(ip)) == 0;
}

bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  }
  return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                     &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
}

/// Copies a user's IPv4/IPv6 address; false for another family.
bool copy_address(const sockaddr* from, sockaddr_storage& to) {
  if (from == nullptr) return false;
  to = sockaddr_storage{};
  if (from->sa_family == AF_INET) {
    std::memcpy(&to, from, sizeof(sockaddr_in));
  } else if (from->sa_family == AF_INET6) {
    std::memcpy(&to, from, sizeof(sockaddr_in6));
  } else {
    return false;
  }
  return true;
}

/// The port that owns IP address `ip`.
struct owner {
  device_obj* dev = nullptr;
  uint8_t port_num = 0;
};

owner owner_of(fabric& f, const sockaddr_storage& ip) {
  for (auto& dev : f.devices) {
    for (size_t p = 0; p < dev->ports.size(); ++p) {
      for (const sockaddr_storage& a : dev->ports[p].addresses) {
        if (same_ip(a, ip)) return owner{dev.get(), static_cast<uint8_t>(p + 1)};
      }
    }
  }
  return {};
}

bool port_taken(fabric& f, const sockaddr_storage& address) {
  for (const auto& [handle, id] : f.cm_ids) {
    if (!id->holds_port || port_be(source(*id)) != port_be(address)) continue;
    if (is_any(source(*id)) || is_any(address) || same_ip(source(*id), address)) return true;
  }
  return false;
}

/// Reserves the address's port for `id` (an ephemeral one when it is 0); 0 or an errno value.
int reserve_port(fabric& f, cm_id_obj& id, sockaddr_storage address) {
  if (port_be(address) == 0) {
    for (int tries = 0; tries < 25000 && port_be(address) == 0; ++tries) {
      set_port_be(address, htons(f.next_cm_port));
      f.next_cm_port = f.next_cm_port >= 64999 ? 40000 : f.next_cm_port + 1;
      if (port_taken(f, address)) set_port_be(address, 0);
    }
    if (port_be(address) == 0) return EADDRINUSE;
  } else if (port_taken(f, address)) {
    return EADDRINUSE;
  }
  source(id) = address;
  id.holds_port = true;
  return 0;
}

/// Places `id` on the port that owns its source address (rdmacm's id->verbs and port_num).
void attach(fabric& f, cm_id_obj& id, const owner& where) {
  id.dev = where.dev;
  id.pub.port_num = where.port_num;
  id.pub.verbs = &f.rdmacm_context(*where.dev).pub;
}

// -- events --

/// Queues an event for `id` (dropped when the id or its channel is gone).
cm_event_obj* post_event(fabric& f, cm_id_obj& id, rdma_cm_event_type type, int status = 0,
                         cm_id_obj* counted_on = nullptr) {
  if (id.dead || id.channel->destroyed) return nullptr;
  auto event = std::make_unique<cm_event_obj>();
  event->pub.id = &id.pub;
  event->pub.event = type;
  event->pub.status = status;
  event->counted_on = counted_on != nullptr ? counted_on : &id;
  cm_event_obj* queued = event.get();
  id.channel->queue.push(queued);
  f.cm_events[&event->pub] = std::move(event);
  return queued;
}

/// Gives an event the private data of its message: `wire_size` bytes, `data` then zeros.
void attach_private_data(cm_event_obj* event, const void* data, size_t length, size_t wire_size) {
  if (event == nullptr) return;
  event->private_data.assign(wire_size, 0);
  if (length != 0) std::memcpy(event->private_data.data(), data, length);
  event->pub.param.conn.private_data = event->private_data.data();
  event->pub.param.conn.private_data_len = static_cast<uint8_t>(wire_size);
}

/// The connection parameters the event shows `id` (its peer's, from its point of view).
void attach_conn_param(cm_event_obj* event, const cm_id_obj& id) {
  if (event == nullptr) return;
  rdma_conn_param& param = event->pub.param.conn;
  param.responder_resources = id.responder_resources;
  param.initiator_depth = id.initiator_depth;
  param.retry_count = id.retry_count;
  param.rnr_retry_count = id.rnr_retry_count;
  param.qp_num = id.remote_qp_num;
}

void reject_event(fabric& f, cm_id_obj& id, int reason, const void* data = nullptr,
                  size_t length = 0) {
  attach_private_data(post_event(f, id, RDMA_CM_EVENT_REJECTED, reason), data, length,
                      reject_data_size);
}

/// DISCONNECTED, once per id.
void disconnected_event(fabric& f, cm_id_obj& id) {
  if (id.disconnect_seen) return;
  id.disconnect_seen = true;
  id.state = cm_state::disconnected;
  post_event(f, id, RDMA_CM_EVENT_DISCONNECTED);
}

// -- queue pair attributes of a connection --

/// The GID index of `gid` (of `type`) on a port, or -1.
int gid_index(const port_obj& port, const ibv_gid& gid, uint32_t type) {
  for (const ibv_gid_entry& e : port.gids) {
    if (e.gid_type == type && std::memcmp(e.gid.raw, gid.raw, sizeof(gid.raw)) == 0) {
      return static_cast<int>(e.gid_index);
    }
  }
  return -1;
}

/// The address vector from `id`'s port to its peer's: a LID on InfiniBand, a RoCE v2 GRH else.
bool address_vector(cm_id_obj& id, ibv_ah_attr& ah) {
  const port_obj* local = port_of(*id.dev, id.pub.port_num);
  const port_obj* remote = port_of(*id.remote_dev, id.remote_port);
  if (local == nullptr || remote == nullptr) return false;
  ah = ibv_ah_attr{};
  ah.port_num = id.pub.port_num;
  if (local->attr.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    ah.dlid = remote->attr.lid;
    return true;
  }
  const int sgid = gid_index(*local, gid_of(source(id)), IBV_GID_TYPE_ROCE_V2);
  if (sgid < 0) return false;
  ah.is_global = 1;
  ah.grh.dgid = gid_of(destination(id));
  ah.grh.sgid_index = static_cast<uint8_t>(sgid);
  ah.grh.hop_limit = 64;
  return true;
}

int init_attributes(cm_id_obj& id, ibv_qp_attr& attr, int& mask) {
  if (id.dev == nullptr) return EINVAL;
  attr.port_num = id.pub.port_num;
  attr.pkey_index = 0;
  attr.qp_access_flags = 0;
  if (id.remote_known) {
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (id.responder_resources != 0) {
      attr.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    }
  }
  mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  return 0;
}

int rtr_attributes(cm_id_obj& id, ibv_qp_attr& attr, int& mask) {
  if (!id.remote_known || !address_vector(id, attr.ah_attr)) return EINVAL;
  const port_obj* local = port_of(*id.dev, id.pub.port_num);
  const port_obj* remote = port_of(*id.remote_dev, id.remote_port);
  attr.path_mtu = std::min(local->attr.active_mtu, remote->attr.active_mtu);
  attr.dest_qp_num = id.remote_qp_num;
  attr.rq_psn = id.remote_psn;
  attr.max_dest_rd_atomic = id.responder_resources;
  attr.min_rnr_timer = 0;
  mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return 0;
}

int rts_attributes(cm_id_obj& id, ibv_qp_attr& attr, int& mask) {
  if (!id.remote_known) return EINVAL;
  attr.sq_psn = id.psn;
  attr.timeout = id.ack_timeout;
  attr.retry_cnt = id.retry_count;
  attr.rnr_retry = id.rnr_retry_count;
  attr.max_rd_atomic = id.initiator_depth;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
         IBV_QP_MAX_QP_RD_ATOMIC;
  return 0;
}

/// rdma_init_qp_attr: the attributes that move the id's QP to attr.qp_state.
int qp_attributes(cm_id_obj& id, ibv_qp_attr& attr, int& mask) {
  switch (attr.qp_state) {
    case IBV_QPS_INIT:
      return init_attributes(id, attr, mask);
    case IBV_QPS_RTR:
      return rtr_attributes(id, attr, mask);
    case IBV_QPS_RTS:
      return rts_attributes(id, attr, mask);
    default:
      return EINVAL;
  }
}

/// Moves the id's QP to `state` with the connection's attributes; 0 or an errno value.
int move_qp(fabric& f, cm_id_obj& id, ibv_qp_state state) {
  qp_obj* qp = find(f.qps, id.pub.qp);
  if (qp == nullptr) return EINVAL;
  ibv_qp_attr attr{};
  attr.qp_state = state;
  int mask = 0;
  const int error = qp_attributes(id, attr, mask);
  return error != 0 ? error : f.modify_qp(*qp, attr, mask);
}

/// INIT (again, now with the access the connection grants), RTR, RTS.
int connect_qp(fabric& f, cm_id_obj& id) {
  for (const ibv_qp_state state : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
    if (const int error = move_qp(f, id, state)) return error;
  }
  return 0;
}

void qp_to_error(fabric& f, cm_id_obj& id) {
  if (qp_obj* qp = find(f.qps, id.pub.qp)) f.to_error(*qp);
}

// -- connection parameters --

/// ibv's 0xFF ("as many as the device allows") or a checked count; false when too many.
bool resolve_depth(uint8_t wanted, int device_max, uint8_t& out) {
  if (wanted == RDMA_MAX_RESP_RES) {
    out = static_cast<uint8_t>(device_max);
    return true;
  }
  out = wanted;
  return wanted <= device_max;
}

/// Takes the connection parameters `id` offers; false when they exceed the device or the size.
bool take_params(cm_id_obj& id, const rdma_conn_param* param, size_t data_max) {
  const device_limits& limits = id.dev->limits;
  rdma_conn_param defaults{};
  defaults.responder_resources = RDMA_MAX_RESP_RES;
  defaults.initiator_depth = RDMA_MAX_INIT_DEPTH;
  defaults.retry_count = 7;
  defaults.rnr_retry_count = 7;
  const rdma_conn_param& p = param != nullptr ? *param : defaults;
  if (p.private_data_len > data_max || (p.private_data_len != 0 && p.private_data == nullptr)) {
    return false;
  }
  if (!resolve_depth(p.responder_resources, limits.max_qp_rd_atom, id.responder_resources) ||
      !resolve_depth(p.initiator_depth, limits.max_qp_init_rd_atom, id.initiator_depth)) {
    return false;
  }
  id.retry_count = std::min<uint8_t>(p.retry_count, 7);
  id.rnr_retry_count = std::min<uint8_t>(p.rnr_retry_count, 7);
  id.qp_num = id.pub.qp != nullptr ? id.pub.qp->qp_num : p.qp_num;
  return true;
}

/// Each side learns the other's QP, PSN and port.
void learn_remote(cm_id_obj& id, const cm_id_obj& peer) {
  id.remote_known = true;
  id.remote_qp_num = peer.qp_num;
  id.remote_psn = peer.psn;
  id.remote_dev = peer.dev;
  id.remote_port = peer.pub.port_num;
}

// -- entries: channels and ids --

rdma_event_channel* create_event_channel() {
  locked_fabric f;
  if (!f) return nullptr;  // errno ENODEV, as librdmacm without an RDMA device
  auto channel = std::make_unique<cm_channel_obj>();
  if (channel->queue.fd() < 0) return fail_null<rdma_event_channel>(EMFILE);
  channel->pub.fd = channel->queue.fd();
  rdma_event_channel* handle = &channel->pub;
  f->cm_channels[handle] = std::move(channel);
  return handle;
}

void destroy_event_channel(rdma_event_channel* handle) {
  locked_fabric f;
  cm_channel_obj* channel = f ? find(f->cm_channels, handle) : nullptr;
  if (channel == nullptr) return;
  if (channel->ids != 0) {
    COMM_LOG(debug, log_name, "destroy_event_channel: %zu ids still on it", channel->ids);
    channel->destroyed = true;
    return;
  }
  f->cm_channels.erase(handle);
}

int create_id(rdma_event_channel* channel_handle, rdma_cm_id** id_out, void* context,
              rdma_port_space ps) {
  locked_fabric f;
  cm_channel_obj* channel = f ? find(f->cm_channels, channel_handle) : nullptr;
  if (channel == nullptr || channel->destroyed || id_out == nullptr) return fail_minus_one(EINVAL);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_IB) return fail_minus_one(EPROTONOSUPPORT);
  auto id = std::make_unique<cm_id_obj>();
  id->channel = channel;
  id->pub.channel = channel_handle;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = IBV_QPT_RC;
  id->psn = f->next_psn++ & 0xffffff;
  ++channel->ids;
  *id_out = &id->pub;
  f->cm_ids[&id->pub] = std::move(id);
  return 0;
}

int set_option(rdma_cm_id* handle, int level, int optname, void* optval, size_t optlen) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr || optval == nullptr) return fail_minus_one(EINVAL);
  if (level != RDMA_OPTION_ID) return fail_minus_one(ENOSYS);
  switch (optname) {
    case RDMA_OPTION_ID_ACK_TIMEOUT: {
      if (optlen != sizeof(uint8_t)) return fail_minus_one(EINVAL);
      const uint8_t timeout = *static_cast<const uint8_t*>(optval);
      if (timeout > 31) return fail_minus_one(EINVAL);
      id->ack_timeout = timeout;
      return 0;
    }
    case RDMA_OPTION_ID_TOS:
    case RDMA_OPTION_ID_REUSEADDR:
    case RDMA_OPTION_ID_AFONLY:
      return 0;
    default:
      return fail_minus_one(ENOSYS);
  }
}

int bind_id(fabric& f, cm_id_obj& id, const sockaddr* addr) {
  sockaddr_storage address;
  if (!copy_address(addr, address)) return EAFNOSUPPORT;
  if (id.state != cm_state::idle) return EINVAL;
  const owner where = owner_of(f, address);
  if (!is_any(address) && where.dev == nullptr) return EADDRNOTAVAIL;
  if (const int error = reserve_port(f, id, address)) return error;
  if (where.dev != nullptr) attach(f, id, where);
  id.state = cm_state::bound;
  return 0;
}

int bind_addr(rdma_cm_id* handle, sockaddr* addr) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr) return fail_minus_one(EINVAL);
  const int error = bind_id(*f, *id, addr);
  return error != 0 ? fail_minus_one(error) : 0;
}

int listen(rdma_cm_id* handle, int backlog) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr || id->state != cm_state::bound) return fail_minus_one(EINVAL);
  if (id->dead) return fail_minus_one(EIO);
  id->backlog = backlog > 0 ? backlog : 1024;
  id->state = cm_state::listening;
  return 0;
}

/// The source of a connection to `target`: the id's own port, or (unbound) the target's device,
/// as a connection to a local address runs over the device that owns it.
int choose_source(fabric& f, cm_id_obj& id, const owner& target,
                  const sockaddr_storage& target_address) {
  if (id.dev == nullptr) attach(f, id, target);
  const port_obj* port = port_of(*id.dev, id.pub.port_num);
  const port_obj* remote = port_of(*target.dev, target.port_num);
  if (port->attr.link_layer != remote->attr.link_layer) return EHOSTUNREACH;
  sockaddr_storage address = source(id);
  if (id.state == cm_state::idle || is_any(address)) {
    const sockaddr_storage* ip = nullptr;
    for (const sockaddr_storage& a : port->addresses) {
      if (ip == nullptr && a.ss_family == target_address.ss_family) ip = &a;
    }
    if (ip == nullptr) return EHOSTUNREACH;
    const uint16_t port_number = port_be(address);
    address = *ip;
    set_port_be(address, port_number);
  }
  if (id.holds_port) {
    source(id) = address;
    return 0;
  }
  return reserve_port(f, id, address);
}

int resolve_addr(rdma_cm_id* handle, sockaddr* src_addr, sockaddr* dst_addr, int) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  sockaddr_storage target{};
  if (id == nullptr || !copy_address(dst_addr, target)) return fail_minus_one(EINVAL);
  if (id->dead) return fail_minus_one(EIO);
  if (src_addr != nullptr && id->state == cm_state::idle) {
    if (const int error = bind_id(*f, *id, src_addr)) return fail_minus_one(error);
  }
  if (id->state != cm_state::idle && id->state != cm_state::bound) return fail_minus_one(EINVAL);
  const owner where = owner_of(*f, target);
  const int error = where.dev != nullptr ? choose_source(*f, *id, where, target) : EHOSTUNREACH;
  if (error != 0) {
    post_event(*f, *id, RDMA_CM_EVENT_ADDR_ERROR, -error);
    return 0;
  }
  destination(*id) = target;
  id->pub.route.addr.addr.ibaddr.sgid = gid_of(source(*id));
  id->pub.route.addr.addr.ibaddr.dgid = gid_of(target);
  id->pub.route.addr.addr.ibaddr.pkey = htons(0xffff);
  id->state = cm_state::addr_resolved;
  post_event(*f, *id, RDMA_CM_EVENT_ADDR_RESOLVED);
  return 0;
}

/// The path record rdmacm shows after ROUTE_RESOLVED.
ibv_sa_path_rec path_record(cm_id_obj& id, const port_obj& local, const port_obj& remote) {
  ibv_sa_path_rec path{};
  path.sgid = gid_of(source(id));
  path.dgid = gid_of(destination(id));
  path.slid = htons(local.attr.lid);
  path.dlid = htons(remote.attr.lid);
  path.reversible = 1;
  path.numb_path = 1;
  path.pkey = htons(0xffff);
  path.mtu = std::min(local.attr.active_mtu, remote.attr.active_mtu);
  path.packet_life_time = 18;
  return path;
}

int resolve_route(rdma_cm_id* handle, int) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr || id->state != cm_state::addr_resolved) return fail_minus_one(EINVAL);
  if (id->dead) return fail_minus_one(EIO);
  const owner target = owner_of(*f, destination(*id));
  if (target.dev == nullptr) {
    post_event(*f, *id, RDMA_CM_EVENT_ROUTE_ERROR, -EHOSTUNREACH);
    return 0;
  }
  id->path = std::make_unique<ibv_sa_path_rec>(path_record(
      *id, *port_of(*id->dev, id->pub.port_num), *port_of(*target.dev, target.port_num)));
  id->pub.route.path_rec = id->path.get();
  id->pub.route.num_paths = 1;
  id->state = cm_state::route_resolved;
  post_event(*f, *id, RDMA_CM_EVENT_ROUTE_RESOLVED);
  return 0;
}

uint16_t get_src_port(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  return id != nullptr ? port_be(source(*id)) : 0;
}

uint16_t get_dst_port(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  return id != nullptr ? port_be(destination(*id)) : 0;
}

// -- entries: QP on an id --

int create_qp_on_id(rdma_cm_id* handle, ibv_pd* pd_handle, ibv_qp_init_attr* init) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  pd_obj* pd = f ? find(f->pds, pd_handle) : nullptr;
  if (id == nullptr || pd == nullptr || init == nullptr || id->pub.qp != nullptr) {
    return fail_minus_one(EINVAL);
  }
  if (id->dead || pd->ctx->dead) return fail_minus_one(EIO);
  if (id->pub.verbs == nullptr || &pd->ctx->pub != id->pub.verbs) return fail_minus_one(EINVAL);
  int error = 0;
  qp_obj* qp = f->create_qp(*pd, *init, error);
  if (qp == nullptr) return fail_minus_one(error);
  qp->cm_id = id;
  id->pub.qp = &qp->pub;
  id->pub.send_cq = init->send_cq;
  id->pub.recv_cq = init->recv_cq;
  id->pub.srq = init->srq;
  error = move_qp(*f, *id, IBV_QPS_INIT);
  if (error != 0) {
    f->destroy_qp(*qp);
    return fail_minus_one(error);
  }
  return 0;
}

void destroy_qp_on_id(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  qp_obj* qp = id ? find(f->qps, id->pub.qp) : nullptr;
  if (qp != nullptr) f->destroy_qp(*qp);
}

int init_qp_attr(rdma_cm_id* handle, ibv_qp_attr* attr, int* attr_mask) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr || attr == nullptr || attr_mask == nullptr) return fail_minus_one(EINVAL);
  const int error = qp_attributes(*id, *attr, *attr_mask);
  return error != 0 ? fail_minus_one(error) : 0;
}

// -- entries: connection --

/// The listener a connect to `target` reaches: one on that address, else a wildcard one.
cm_id_obj* find_listener(fabric& f, const sockaddr_storage& target) {
  cm_id_obj* wildcard = nullptr;
  for (const auto& [handle, id] : f.cm_ids) {
    if (id->state != cm_state::listening || id->dead) continue;
    const sockaddr_storage& bound = source(*id);
    if (port_be(bound) != port_be(target)) continue;
    if (same_ip(bound, target)) return id.get();
    const bool family_ok = bound.ss_family == AF_INET6 || bound.ss_family == target.ss_family;
    if (is_any(bound) && family_ok) wildcard = id.get();
  }
  return wildcard;
}

/// The server's new id for a connection request from `client` to `listener`.
cm_id_obj& make_passive_id(fabric& f, cm_id_obj& listener, cm_id_obj& client) {
  auto created = std::make_unique<cm_id_obj>();
  cm_id_obj& id = *created;
  id.channel = listener.channel;
  id.pub.channel = listener.pub.channel;
  id.pub.context = listener.pub.context;
  id.pub.ps = listener.pub.ps;
  id.pub.qp_type = IBV_QPT_RC;
  id.psn = f.next_psn++ & 0xffffff;
  attach(f, id, owner_of(f, destination(client)));
  source(id) = destination(client);
  destination(id) = source(client);
  id.state = cm_state::request_received;
  id.listener = &listener;
  id.peer = &client;
  client.peer = &id;
  id.responder_resources = client.initiator_depth;
  id.initiator_depth = client.responder_resources;
  id.retry_count = client.retry_count;
  id.rnr_retry_count = client.rnr_retry_count;
  learn_remote(id, client);
  ++listener.pending;
  ++listener.channel->ids;
  f.cm_ids[&id.pub] = std::move(created);
  return id;
}

/// The client's connect meets no listener, or a full backlog: REJECTED.
void refuse(fabric& f, cm_id_obj& client, int reason) {
  client.state = cm_state::failed;
  qp_to_error(f, client);
  reject_event(f, client, reason);
}

int connect(rdma_cm_id* handle, rdma_conn_param* param) {
  locked_fabric f;
  cm_id_obj* client = f ? find(f->cm_ids, handle) : nullptr;
  if (client == nullptr || client->state != cm_state::route_resolved) return fail_minus_one(EINVAL);
  if (client->dead) return fail_minus_one(EIO);
  if (!take_params(*client, param, connect_data_size)) return fail_minus_one(EINVAL);
  client->state = cm_state::connecting;
  cm_id_obj* listener = find_listener(*f, destination(*client));
  if (listener == nullptr) {
    refuse(*f, *client, reject_invalid_service_id);
    return 0;
  }
  if (listener->pending >= static_cast<size_t>(listener->backlog)) {
    refuse(*f, *client, reject_consumer);
    return 0;
  }
  cm_id_obj& server = make_passive_id(*f, *listener, *client);
  cm_event_obj* request = post_event(*f, server, RDMA_CM_EVENT_CONNECT_REQUEST, 0, listener);
  if (request != nullptr) request->pub.listen_id = &listener->pub;
  attach_conn_param(request, server);
  const void* data = param ? param->private_data : nullptr;
  attach_private_data(request, data, param ? param->private_data_len : 0, connect_data_size);
  return 0;
}

/// The request is answered: the listener's backlog frees a place.
void leave_listener(cm_id_obj& server) {
  if (server.listener != nullptr) --server.listener->pending;
  server.listener = nullptr;
}

/// The client learns the server's answer: its QP connects (ESTABLISHED) or, without a QP on its
/// id, it gets CONNECT_RESPONSE and connects with establish().
void answer_client(fabric& f, cm_id_obj& server, cm_id_obj& client, const rdma_conn_param* param) {
  client.responder_resources = server.initiator_depth;
  client.initiator_depth = server.responder_resources;
  learn_remote(client, server);
  const bool with_qp = client.pub.qp != nullptr;
  if (with_qp && connect_qp(f, client) != 0) {
    client.state = cm_state::failed;
    post_event(f, client, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
    reject_event(f, server, reject_consumer);
    server.state = cm_state::failed;
    return;
  }
  client.state = with_qp ? cm_state::established : cm_state::connect_response;
  cm_event_obj* event =
      post_event(f, client, with_qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE);
  attach_conn_param(event, client);
  attach_private_data(event, param ? param->private_data : nullptr,
                      param ? param->private_data_len : 0, accept_data_size);
  if (with_qp) {
    server.state = cm_state::established;
    post_event(f, server, RDMA_CM_EVENT_ESTABLISHED);
  }
}

int accept_request(fabric& f, cm_id_obj& server, const rdma_conn_param* param) {
  if (server.state != cm_state::request_received) return EINVAL;
  if (!take_params(server, param, accept_data_size)) return EINVAL;
  cm_id_obj* client = server.peer;
  if (server.pub.qp != nullptr) {
    if (const int error = connect_qp(f, server)) return error;
  }
  leave_listener(server);
  server.state = cm_state::accepted;
  if (client == nullptr || client->dead) {
    server.state = cm_state::failed;
    post_event(f, server, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    return 0;
  }
  answer_client(f, server, *client, param);
  return 0;
}

int accept(rdma_cm_id* handle, rdma_conn_param* param) {
  locked_fabric f;
  cm_id_obj* server = f ? find(f->cm_ids, handle) : nullptr;
  if (server == nullptr) return fail_minus_one(EINVAL);
  if (server->dead) return fail_minus_one(EIO);
  const int error = accept_request(*f, *server, param);
  return error != 0 ? fail_minus_one(error) : 0;
}

int establish(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* client = f ? find(f->cm_ids, handle) : nullptr;
  if (client == nullptr || client->state != cm_state::connect_response)
    return fail_minus_one(EINVAL);
  if (client->dead) return fail_minus_one(EIO);
  client->state = cm_state::established;
  cm_id_obj* server = client->peer;
  if (server != nullptr && server->state == cm_state::accepted) {
    server->state = cm_state::established;
    post_event(*f, *server, RDMA_CM_EVENT_ESTABLISHED);
  }
  return 0;
}

int reject(rdma_cm_id* handle, const void* private_data, uint8_t private_data_len) {
  locked_fabric f;
  cm_id_obj* server = f ? find(f->cm_ids, handle) : nullptr;
  if (server == nullptr || server->state != cm_state::request_received)
    return fail_minus_one(EINVAL);
  if (server->dead) return fail_minus_one(EIO);
  if (private_data_len > reject_data_size || (private_data_len != 0 && private_data == nullptr)) {
    return fail_minus_one(EINVAL);
  }
  leave_listener(*server);
  server->state = cm_state::failed;
  if (cm_id_obj* client = server->peer) {
    client->state = cm_state::failed;
    qp_to_error(*f, *client);
    reject_event(*f, *client, reject_consumer, private_data, private_data_len);
  }
  return 0;
}

int disconnect(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr) return fail_minus_one(EINVAL);
  if (id->dead) return fail_minus_one(EIO);
  const cm_state s = id->state;
  const bool connected = s == cm_state::established || s == cm_state::accepted ||
                         s == cm_state::connect_response || s == cm_state::disconnected;
  if (!connected) return fail_minus_one(EINVAL);
  qp_to_error(*f, *id);
  if (s == cm_state::disconnected) return 0;  // the peer's DREQ came first: only the QP moves
  disconnected_event(*f, *id);
  if (id->peer != nullptr && !id->peer->dead) disconnected_event(*f, *id->peer);
  return 0;
}

// -- entries: events --

int get_cm_event(rdma_event_channel* handle, rdma_cm_event** event) {
  for (;;) {
    int fd = -1;
    {
      locked_fabric f;
      cm_channel_obj* channel = f ? find(f->cm_channels, handle) : nullptr;
      if (channel == nullptr || event == nullptr) return fail_minus_one(EINVAL);
      cm_event_obj* next = nullptr;
      if (channel->queue.pop(next)) {
        next->delivered = true;
        if (next->counted_on != nullptr) ++next->counted_on->events.got;
        *event = &next->pub;
        return 0;
      }
      fd = channel->queue.fd();
    }
    if (!wait_readable(fd)) return -1;
  }
}

int ack_cm_event(rdma_cm_event* handle) {
  locked_fabric f;
  cm_event_obj* event = f ? find(f->cm_events, handle) : nullptr;
  if (event == nullptr || !event->delivered) return fail_minus_one(EINVAL);
  if (event->counted_on != nullptr) ++event->counted_on->events.acked;
  f->cm_events.erase(handle);
  return 0;
}

// -- destroying an id --

void erase_id(fabric& f, cm_id_obj& id);

/// What the other side sees when `id` goes away (as the kernel closing it would show).
void announce_departure(fabric& f, cm_id_obj& id, bool process_exit) {
  cm_id_obj* peer = id.peer;
  if (peer == nullptr || peer->dead) return;
  switch (id.state) {
    case cm_state::request_received:  // the server never answered
      peer->state = cm_state::failed;
      qp_to_error(f, *peer);
      if (process_exit) {
        reject_event(f, *peer, reject_consumer);
      } else {
        post_event(f, *peer, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      }
      break;
    case cm_state::connecting:  // the client gave up
      if (process_exit && peer->state == cm_state::request_received) {
        peer->state = cm_state::failed;
        reject_event(f, *peer, reject_timeout);
      }
      break;
    case cm_state::established:
    case cm_state::accepted:
    case cm_state::connect_response:
    case cm_state::disconnected:
      if (process_exit) disconnected_event(f, *peer);
      break;
    default:
      break;
  }
}

/// Drops the events still queued for `id`; a listener's queued requests take their new ids along.
void drop_queued_events(fabric& f, cm_id_obj& id) {
  std::vector<cm_id_obj*> orphans;
  id.channel->queue.remove_if([&](cm_event_obj* event) {
    const bool mine = event->counted_on == &id || event->pub.id == &id.pub;
    if (!mine) return false;
    if (event->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST && event->pub.id != &id.pub) {
      orphans.push_back(find(f.cm_ids, event->pub.id));
    }
    f.cm_events.erase(&event->pub);
    return true;
  });
  for (cm_id_obj* orphan : orphans) {
    if (orphan != nullptr) erase_id(f, *orphan);
  }
}

/// Removes `id` from the fabric and everything that points at it.
void erase_id(fabric& f, cm_id_obj& id) {
  drop_queued_events(f, id);
  if (!id.dead) announce_departure(f, id, true);
  for (auto& [handle, event] : f.cm_events) {
    if (event->counted_on == &id) event->counted_on = nullptr;
  }
  leave_listener(id);
  for (auto& [handle, other] : f.cm_ids) {
    if (other->listener == &id) other->listener = nullptr;
  }
  if (id.peer != nullptr) id.peer->peer = nullptr;
  if (qp_obj* qp = find(f.qps, id.pub.qp)) qp->cm_id = nullptr;
  cm_channel_obj* channel = id.channel;
  f.cm_ids.erase(&id.pub);
  if (--channel->ids == 0 && channel->destroyed) f.cm_channels.erase(&channel->pub);
}

int destroy_id(rdma_cm_id* handle) {
  locked_fabric f;
  cm_id_obj* id = f ? find(f->cm_ids, handle) : nullptr;
  if (id == nullptr) return fail_minus_one(EINVAL);
  if (!id->dead && id->events.unacked()) {
    COMM_LOG(debug, log_name, "destroy_id: events not acknowledged (librdmacm would block)");
    return fail_minus_one(EBUSY);
  }
  erase_id(*f, *id);
  return 0;
}

}  // namespace

void fabric::cm_peer_gone(device_obj& dev, peer_failure how) {
  std::vector<cm_id_obj*> gone;
  for (auto& [handle, id] : cm_ids) {
    if (id->dev == &dev && !id->dead) gone.push_back(id.get());
  }
  for (cm_id_obj* id : gone) id->dead = true;
  for (cm_id_obj* id : gone) announce_departure(*this, *id, how == peer_failure::process_exit);
}

void fill_cm(api& t) {
  t.create_event_channel = create_event_channel;
  t.destroy_event_channel = destroy_event_channel;
  t.create_id = create_id;
  t.destroy_id = destroy_id;
  t.set_option = set_option;
  t.bind_addr = bind_addr;
  t.listen = listen;
  t.resolve_addr = resolve_addr;
  t.resolve_route = resolve_route;
  t.get_src_port = get_src_port;
  t.get_dst_port = get_dst_port;
  t.create_qp_on_id = create_qp_on_id;
  t.destroy_qp_on_id = destroy_qp_on_id;
  t.init_qp_attr = init_qp_attr;
  t.connect = connect;
  t.establish = establish;
  t.accept = accept;
  t.reject = reject;
  t.disconnect = disconnect;
  t.get_cm_event = get_cm_event;
  t.ack_cm_event = ack_cm_event;
}

}  // namespace comm::verbs::testdev::detail
