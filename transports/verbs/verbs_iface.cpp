#include "verbs/verbs_iface.hpp"

#include "verbs/verbs_ep.hpp"

#include <comm/log.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace comm::verbs {
namespace {

constexpr const char* log_name = "verbs";
/// wr_id bit of receive work requests (sends carry their sequence number).
constexpr uint64_t rx_flag = 1ull << 63;
/// wr_id bit of tag-matching list operations and of tagged buffers (verbs_tag.hpp).
constexpr uint64_t tm_flag = verbs_tags::wr_id_flag;
/// Completions taken from the CQ at once.
constexpr int poll_batch = 16;
/// Backlog of the connection listener.
constexpr int listen_backlog = 128;
/// Private data copied out of an rdmacm event before it is acknowledged.
constexpr size_t max_private_data = 256;

uint64_t random_id() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) id = ::getpid();
  }
  return id;
}

bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

/// Bytes per second of a port from its width and speed (ibv_port_attr encodings).
double port_bandwidth(const ibv_port_attr& port) {
  const int lanes = port.active_width == 2 ? 4 : port.active_width == 4 ? 8
                    : port.active_width == 8 ? 12 : port.active_width == 16 ? 2 : 1;
  double gbps = 2.5;
  switch (port.active_speed) {
    case 2: gbps = 5.0; break;
    case 4: case 8: gbps = 10.0; break;
    case 16: gbps = 14.0; break;
    case 32: gbps = 25.0; break;
    case 64: gbps = 50.0; break;
    case 128: gbps = 100.0; break;
    default: break;
  }
  return lanes * gbps * 1e9 / 8;
}

}  // namespace

/// An rdmacm event copied out of the library before it is acknowledged.
struct cm_event_copy {
  rdma_cm_event event{};                         ///< the event (private data pointer cleared)
  uint8_t private_data[max_private_data] = {};   ///< its private data
  size_t private_data_len = 0;                   ///< bytes of private data
};

namespace {

cm_event_copy copy_event(const rdma_cm_event& event) {
  cm_event_copy copy;
  copy.event = event;
  const rdma_conn_param& conn = event.param.conn;
  if (conn.private_data != nullptr) {
    copy.private_data_len = std::min<size_t>(conn.private_data_len, max_private_data);
    std::memcpy(copy.private_data, conn.private_data, copy.private_data_len);
  }
  copy.event.param.conn.private_data = nullptr;
  return copy;
}

}  // namespace

// -- opening and closing --------------------------------------------------------------------------

verbs_iface::verbs_iface(const api& table, const port_info& port, const verbs_config& config)
    : t_(table), port_(port), config_(config), iface_id_(random_id()) {
  seg_ = (config_.segment_size + 63) & ~size_t{63};
  const bool sane = seg_ >= 256 && config_.credits >= 2 && config_.tx_queue >= 4 &&
                    config_.tx_buffers >= 2 && config_.rx_buffers >= 2u * config_.credits;
  if (!sane) {
    COMM_LOG(error, log_name, "bad parameters: segment %zu (>= 256), credits %u (>= 2), "
             "rx_buffers %zu (>= 2 x credits), tx_queue %u (>= 4), tx_buffers %zu (>= 2)",
             config_.segment_size, config_.credits, config_.rx_buffers, config_.tx_queue,
             config_.tx_buffers);
    open_status_ = status::invalid_param;
    return;
  }
  if (!open_device() || !open_queues() || !open_buffers() || !open_listener() ||
      !open_event_fd()) {
    if (open_status_ == status::ok) open_status_ = status::io_error;
    close_everything();
    return;
  }
  fill_attr();
}

verbs_iface::~verbs_iface() { close_everything(); }

bool verbs_iface::open_device() {
  ctx_ = open_device_named(t_, port_.device);
  if (ctx_ == nullptr) {
    COMM_LOG(error, log_name, "open_device(%s): %s", port_.device.c_str(), std::strerror(errno));
    open_status_ = status::no_elem;
    return false;
  }
  if (t_.query_device(ctx_, &device_attr_) != 0 ||
      t_.query_port(ctx_, port_.port_num, &port_attr_) != 0) {
    COMM_LOG(error, log_name, "query_device/query_port(%s) failed", port_.name().c_str());
    return false;
  }
  gid_ = choose_gid(t_, ctx_, port_.port_num, port_attr_);
  if (gid_.index < 0) {
    COMM_LOG(error, log_name, "%s has no usable GID", port_.name().c_str());
    open_status_ = status::unreachable;
    return false;
  }
  max_rd_atom_ = static_cast<uint8_t>(std::clamp(device_attr_.max_qp_rd_atom, 1, 255));
  max_init_rd_atom_ = static_cast<uint8_t>(std::clamp(device_attr_.max_qp_init_rd_atom, 1, 255));
  // What tag matching the device offers (tag-matching SRQs): used when it covers RC QPs and the
  // table has the TM entry points.
  ibv_device_attr_ex extended{};
  if (provides(t_, &api::query_device_ex) && t_.query_device_ex(ctx_, nullptr, &extended) == 0) {
    tm_caps_ = extended.tm_caps;
  }
  tm_ = config_.tag_matching && tm_caps_.max_num_tags >= 2 && tm_caps_.max_ops >= 2 &&
        tm_caps_.max_sge >= 1 && (tm_caps_.flags & IBV_TM_CAP_RC) != 0 &&
        tm_caps_.max_rndv_hdr_size > tmh_size + rvh_size && provides(t_, &api::post_srq_ops);
  prefix_ = tm_ ? tmh_size : 0;
  return true;
}

size_t verbs_iface::max_connections() const {
  return std::max<size_t>(1, config_.rx_buffers / config_.credits - 1);
}

bool verbs_iface::open_queues() {
  pd_ = t_.alloc_pd(ctx_);
  comp_channel_ = pd_ != nullptr ? t_.create_comp_channel(ctx_) : nullptr;
  const size_t cqe = config_.rx_buffers + max_connections() * config_.tx_queue;
  const int cq_size = static_cast<int>(std::min<size_t>(cqe, device_attr_.max_cqe));
  if (tm_ && comp_channel_ != nullptr) {
    // Tag-matching completions carry the TMH's tag and app_ctx: an extended CQ reads them.
    ibv_cq_init_attr_ex cq_attr{};
    cq_attr.cqe = static_cast<uint32_t>(cq_size);
    cq_attr.cq_context = this;
    cq_attr.channel = comp_channel_;
    cq_attr.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | uint64_t{IBV_WC_EX_WITH_TM_INFO};
    cq_ex_ = t_.create_cq_ex(ctx_, &cq_attr);
    cq_ = cq_ex_ != nullptr ? ibv_cq_ex_to_cq(cq_ex_) : nullptr;
  } else if (comp_channel_ != nullptr) {
    cq_ = t_.create_cq(ctx_, cq_size, this, comp_channel_, 0);
  }
  if (cq_ == nullptr) {
    COMM_LOG(error, log_name, "PD, completion channel or CQ of %d entries: %s", cq_size,
             std::strerror(errno));
    return false;
  }
  srq_ = tm_ ? create_tm_srq() : nullptr;
  if (!tm_) {
    ibv_srq_init_attr srq_attr{};
    srq_attr.attr.max_wr = static_cast<uint32_t>(config_.rx_buffers);
    srq_attr.attr.max_sge = 1;
    srq_ = t_.create_srq(pd_, &srq_attr);
  }
  if (srq_ == nullptr) {
    COMM_LOG(error, log_name, "SRQ of %zu receives: %s", config_.rx_buffers, std::strerror(errno));
    return false;
  }
  ibv_qp* probe = create_qp();
  if (probe == nullptr) return false;
  t_.destroy_qp(probe);
  return true;
}

bool verbs_iface::open_buffers() {
  rx_pool_ = static_cast<uint8_t*>(std::aligned_alloc(4096, config_.rx_buffers * seg_));
  tx_pool_ = static_cast<uint8_t*>(std::aligned_alloc(4096, config_.tx_buffers * seg_));
  if (rx_pool_ == nullptr || tx_pool_ == nullptr) {
    open_status_ = status::no_memory;
    return false;
  }
  rx_mr_ = t_.reg_mr(pd_, rx_pool_, config_.rx_buffers * seg_, IBV_ACCESS_LOCAL_WRITE);
  tx_mr_ = t_.reg_mr(pd_, tx_pool_, config_.tx_buffers * seg_, IBV_ACCESS_LOCAL_WRITE);
  if (rx_mr_ == nullptr || tx_mr_ == nullptr) {
    COMM_LOG(error, log_name, "registering the buffer pools: %s", std::strerror(errno));
    return false;
  }
  rx_owner_.assign(config_.rx_buffers, 0);
  rx_lent_.assign(config_.rx_buffers, false);
  for (size_t i = 0; i < config_.rx_buffers; ++i) {
    if (!repost(static_cast<uint32_t>(i))) return false;
  }
  for (size_t i = config_.tx_buffers; i > 0; --i) free_tx_.push_back(static_cast<int32_t>(i - 1));
  md_ = std::make_unique<verbs_md>(t_, pd_, iface_id_, config_.reg_cache);
  return true;
}

bool verbs_iface::open_listener() {
  cm_channel_ = t_.create_event_channel();
  if (cm_channel_ == nullptr || !set_nonblocking(cm_channel_->fd)) return false;
  if (!port_ip_address(t_, port_, gid_, &listen_address_)) {
    COMM_LOG(error, log_name, "%s: no IP address rdmacm reaches it by", port_.name().c_str());
    open_status_ = status::unreachable;
    return false;
  }
  if (t_.create_id(cm_channel_, &listener_, this, RDMA_PS_TCP) != 0 ||
      t_.bind_addr(listener_, reinterpret_cast<sockaddr*>(&listen_address_)) != 0 ||
      t_.listen(listener_, listen_backlog) != 0) {
    COMM_LOG(error, log_name, "rdmacm listener on %s: %s", to_string(listen_address_).c_str(),
             std::strerror(errno));
    return false;
  }
  const uint16_t port_be = t_.get_src_port(listener_);
  if (listen_address_.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in&>(listen_address_).sin_port = port_be;
  } else {
    reinterpret_cast<sockaddr_in6&>(listen_address_).sin6_port = port_be;
  }
  return true;
}

bool verbs_iface::open_event_fd() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return false;
  for (int fd : {comp_channel_->fd, cm_channel_->fd, ctx_->async_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (!set_nonblocking(fd) || ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      COMM_LOG(error, log_name, "event fd %d: %s", fd, std::strerror(errno));
      return false;
    }
  }
  return true;
}

void verbs_iface::fill_attr() {
  tl::iface_attr& a = attr_;
  a.caps = tl::cap_am_bcopy | tl::cap_am_zcopy | tl::cap_put_zcopy | tl::cap_get_zcopy |
           tl::cap_pending | tl::cap_event_fd | tl::cap_connect_to_iface | tl::cap_peer_failure;
  if (max_inline_ > header_size()) {
    a.caps |= tl::cap_am_short;
    a.max_short = std::min<size_t>(max_inline_, 1024) - header_size();
  }
  a.max_bcopy = seg_ - header_size();
  a.max_hdr = 128;
  a.max_zcopy = seg_ - header_size() - a.max_hdr;
  const int sges = std::min(device_attr_.max_sge, static_cast<int>(max_zcopy_iov) + 1);
  a.max_iov = static_cast<size_t>(std::max(1, sges - 1));
  a.max_get_zcopy = port_attr_.max_msg_sz;
  a.max_put_zcopy = port_attr_.max_msg_sz;
  a.max_outstanding_reads = max_init_rd_atom_;
  a.max_am_descs = max_am_descs();
  a.latency_ns = port_.link_layer == IBV_LINK_LAYER_INFINIBAND ? 800 : 1300;
  a.bandwidth_bytes_per_s = port_bandwidth(port_attr_);
  a.priority = 1;
  if (tm_) fill_tag_attr();
}

void verbs_iface::close_everything() {
  while (!conns_.empty()) destroy_conn(*conns_.begin()->second);
  close_tags();
  if (listener_ != nullptr) t_.destroy_id(listener_);
  if (cm_channel_ != nullptr) t_.destroy_event_channel(cm_channel_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  md_.reset();
  if (rx_mr_ != nullptr) t_.dereg_mr(rx_mr_);
  if (tx_mr_ != nullptr) t_.dereg_mr(tx_mr_);
  std::free(rx_pool_);
  std::free(tx_pool_);
  if (srq_ != nullptr) t_.destroy_srq(srq_);
  if (cq_ != nullptr) t_.destroy_cq(cq_);
  if (comp_channel_ != nullptr) t_.destroy_comp_channel(comp_channel_);
  if (pd_ != nullptr) t_.dealloc_pd(pd_);
  if (ctx_ != nullptr) t_.close_device(ctx_);
  listener_ = nullptr;
  cm_channel_ = nullptr;
  epoll_fd_ = -1;
  rx_mr_ = tx_mr_ = nullptr;
  rx_pool_ = tx_pool_ = nullptr;
  srq_ = nullptr;
  cq_ = nullptr;
  comp_channel_ = nullptr;
  pd_ = nullptr;
  ctx_ = nullptr;
}

// -- queue pairs ---------------------------------------------------------------------------------

ibv_qp* verbs_iface::create_qp() {
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.srq = srq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = config_.tx_queue;
  init.cap.max_send_sge = static_cast<uint32_t>(
      std::min(device_attr_.max_sge, static_cast<int>(max_zcopy_iov) + 1));
  init.cap.max_inline_data = config_.inline_size;
  ibv_qp* qp = t_.create_qp(pd_, &init);
  if (qp == nullptr) {
    COMM_LOG(warn, log_name, "create_qp: %s", std::strerror(errno));
    return nullptr;
  }
  max_inline_ = init.cap.max_inline_data;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = port_.port_num;
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const int error = t_.modify_qp(
      qp, &attr, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS);
  if (error != 0) {
    COMM_LOG(warn, log_name, "QP to INIT: %s", std::strerror(error));
    t_.destroy_qp(qp);
    return nullptr;
  }
  return qp;
}

handshake verbs_iface::local_handshake(const ibv_qp* qp, uint32_t psn) const {
  handshake h;
  h.qp_num = qp->qp_num;
  h.psn = psn;
  h.lid = port_attr_.lid;
  h.rd_atom = max_rd_atom_;
  h.mtu = static_cast<uint8_t>(port_attr_.active_mtu);
  std::memcpy(h.gid, gid_.gid.raw, sizeof(h.gid));
  h.iface_id = iface_id_;
  h.credits = config_.credits;
  h.link_layer = port_.link_layer;
  return h;
}

int verbs_iface::connect_qp(ibv_qp* qp, uint32_t local_psn, const handshake& peer) {
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = std::min(port_attr_.active_mtu, static_cast<ibv_mtu>(peer.mtu));
  rtr.dest_qp_num = peer.qp_num;
  rtr.rq_psn = peer.psn;
  rtr.max_dest_rd_atomic = max_rd_atom_;
  rtr.min_rnr_timer = config_.min_rnr_timer;
  rtr.ah_attr.port_num = port_.port_num;
  if (port_.link_layer == IBV_LINK_LAYER_INFINIBAND) {
    rtr.ah_attr.dlid = peer.lid;
  } else {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, peer.gid, sizeof(peer.gid));
    rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_.index);
    rtr.ah_attr.grh.hop_limit = 64;
  }
  int error = t_.modify_qp(qp, &rtr,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                               IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (error != 0) return error;
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.sq_psn = local_psn;
  rts.timeout = config_.ack_timeout;
  rts.retry_cnt = config_.retry_count;
  rts.rnr_retry = config_.rnr_retry;
  rts.max_rd_atomic = std::min(max_init_rd_atom_, std::max<uint8_t>(peer.rd_atom, 1));
  error = t_.modify_qp(qp, &rts,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                           IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  return error;
}

// -- connections ---------------------------------------------------------------------------------

verbs_conn& verbs_iface::add_conn(std::unique_ptr<verbs_conn> c) {
  verbs_conn& added = *c;
  by_qp_[c->qp()->qp_num] = c.get();
  if (c->id() != nullptr) by_id_[c->id()] = c.get();
  conns_[c->serial()] = std::move(c);
  return added;
}

void verbs_iface::destroy_conn(verbs_conn& c) {
  by_qp_.erase(c.qp()->qp_num);
  if (c.id() != nullptr) by_id_.erase(c.id());
  if (c.ep != nullptr) c.ep->detach();
  conns_.erase(c.serial());
}

void verbs_iface::close_conn(verbs_conn& c) {
  COMM_LOG(debug, log_name, "connection %llu (qp %u): closed",
           static_cast<unsigned long long>(c.serial()), c.qp()->qp_num);
  c.ep = nullptr;
  if (in_progress_) {
    closing_.push_back(c.serial());
  } else {
    destroy_conn(c);
  }
}

void verbs_iface::release_conn(verbs_conn& c) {
  c.ep = nullptr;
  c.pending.purge(nullptr, nullptr);
  if (c.state() != conn_state::ready || c.peer_released() || c.holds_user_memory()) {
    close_conn(c);
    return;
  }
  COMM_LOG(debug, log_name, "connection %llu (qp %u): its endpoint left, the peer may still use it",
           static_cast<unsigned long long>(c.serial()), c.qp()->qp_num);
  c.release();
}

void verbs_iface::report_failure(verbs_conn& c) { failed_.push_back(c.serial()); }

verbs_conn* verbs_iface::conn_of_qp(uint32_t qp_num) {
  const auto found = by_qp_.find(qp_num);
  return found != by_qp_.end() ? found->second : nullptr;
}

verbs_conn* verbs_iface::conn_of_id(rdma_cm_id* id) {
  const auto found = by_id_.find(id);
  return found != by_id_.end() ? found->second : nullptr;
}

verbs_conn* verbs_iface::claimable_conn(uint64_t peer_iface_id) {
  for (auto& [serial, c] : conns_) {
    if (c->passive() && c->ep == nullptr && c->state() == conn_state::ready && !c->released() &&
        !c->peer_released() && c->peer_iface_id() == peer_iface_id) {
      return c.get();
    }
  }
  return nullptr;
}

void verbs_iface::fail_all(status reason) {
  for (auto& [serial, c] : conns_) c->fail(reason);
}

// -- addresses and endpoints ----------------------------------------------------------------------

std::vector<uint8_t> verbs_iface::device_address() const {
  std::vector<uint8_t> out(9, 0);
  out[0] = port_.link_layer;
  if (port_.link_layer == IBV_LINK_LAYER_INFINIBAND) std::memcpy(&out[1], gid_.gid.raw, 8);
  return out;
}

std::vector<uint8_t> verbs_iface::iface_address() const {
  iface_address_record rec;
  rec.link_layer = port_.link_layer;
  rec.iface_id = iface_id_;
  rec.tag_matching = tm_;
  std::memcpy(&rec.listener, &listen_address_,
              listen_address_.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  return encode_iface_address(rec);
}

bool verbs_iface::is_reachable(const std::vector<uint8_t>& device_address,
                               const std::vector<uint8_t>& iface_address) const {
  iface_address_record rec;
  if (device_address != this->device_address() || !parse_iface_address(iface_address, &rec)) {
    return false;
  }
  // Both sides frame every SEND the same way: with a TMH for a tag-matching SRQ, without one else.
  return rec.link_layer == port_.link_layer && rec.tag_matching == tm_;
}

status verbs_iface::create_ep(const std::vector<uint8_t>& device_address,
                              const std::vector<uint8_t>& iface_address,
                              std::unique_ptr<tl::ep>& out) {
  iface_address_record rec;
  if (!parse_iface_address(iface_address, &rec)) return status::invalid_addr;
  if (!is_reachable(device_address, iface_address)) return status::unreachable;
  if (verbs_conn* shared = claimable_conn(rec.iface_id)) {
    COMM_LOG(debug, log_name,
             "connection %llu (qp %u): the peer opened it, a new endpoint shares it",
             static_cast<unsigned long long>(shared->serial()), shared->qp()->qp_num);
    out = std::make_unique<verbs_ep>(*this, *shared);
    return status::ok;
  }
  if (conns_.size() >= max_connections()) return status::exceeds_limit;
  ibv_qp* qp = create_qp();
  if (qp == nullptr) return status::io_error;
  rdma_cm_id* id = nullptr;
  sockaddr_storage target{};
  std::memcpy(&target, &rec.listener, sizeof(rec.listener));
  sockaddr_storage source = listen_address_;
  reinterpret_cast<sockaddr_in&>(source).sin_port = 0;  // same offset for sockaddr_in6
  if (t_.create_id(cm_channel_, &id, nullptr, RDMA_PS_TCP) != 0 ||
      t_.resolve_addr(id, reinterpret_cast<sockaddr*>(&source),
                      reinterpret_cast<sockaddr*>(&target),
                      config_.connect_timeout_ms) != 0) {
    COMM_LOG(warn, log_name, "connecting: %s", std::strerror(errno));
    if (id != nullptr) t_.destroy_id(id);
    t_.destroy_qp(qp);
    return status::unreachable;
  }
  const uint32_t psn = next_psn_++ & 0xffffff;
  verbs_conn& c =
      add_conn(std::make_unique<verbs_conn>(*this, next_serial_++, qp, id, false, psn));
  COMM_LOG(debug, log_name, "connection %llu (qp %u): opening for a new endpoint",
           static_cast<unsigned long long>(c.serial()), qp->qp_num);
  out = std::make_unique<verbs_ep>(*this, c);
  return status::ok;
}

// -- connection events ---------------------------------------------------------------------------

unsigned verbs_iface::poll_cm_events() {
  unsigned n = 0;
  rdma_cm_event* event = nullptr;
  while (t_.get_cm_event(cm_channel_, &event) == 0) {
    cm_event_copy copy = copy_event(*event);
    t_.ack_cm_event(event);
    handle_cm_event(copy);
    ++n;
  }
  return n;
}

void verbs_iface::handle_cm_event(cm_event_copy& copy) {
  const rdma_cm_event& event = copy.event;
  if (event.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
    handle_connect_request(copy);
    return;
  }
  verbs_conn* c = conn_of_id(event.id);
  if (c == nullptr) return;
  switch (event.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (t_.resolve_route(event.id, config_.connect_timeout_ms) != 0) c->fail(status::unreachable);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      send_connect(*c);
      break;
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      handle_connect_response(*c, copy);
      break;
    case RDMA_CM_EVENT_ESTABLISHED:
      c->established();
      break;
    case RDMA_CM_EVENT_REJECTED:
      c->fail(event.status == 8 ? status::unreachable : status::rejected);
      break;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
      c->fail(status::unreachable);
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      if (c->ep == nullptr) {
        close_conn(*c);  // nobody here uses it: the peer closed it, as it should
      } else {
        c->fail(status::connection_reset);
      }
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      fail_all(status::io_error);
      break;
    default:
      break;
  }
}

void verbs_iface::send_connect(verbs_conn& c) {
  const encoded_handshake h = encode_handshake(local_handshake(c.qp(), c.psn()));
  rdma_conn_param param{};
  param.private_data = h.bytes;
  param.private_data_len = sizeof(h.bytes);
  param.responder_resources = max_rd_atom_;
  param.initiator_depth = max_init_rd_atom_;
  param.retry_count = config_.retry_count;
  param.rnr_retry_count = config_.rnr_retry;
  param.qp_num = c.qp()->qp_num;
  if (t_.connect(c.id(), &param) != 0) {
    COMM_LOG(warn, log_name, "rdma_connect: %s", std::strerror(errno));
    c.fail(status::unreachable);
  }
}

void verbs_iface::handle_connect_response(verbs_conn& c, const cm_event_copy& copy) {
  handshake peer;
  if (!parse_handshake(copy.private_data, copy.private_data_len, &peer) ||
      peer.link_layer != port_.link_layer) {
    COMM_LOG(warn, log_name, "connection %llu: the server's handshake is not valid",
             static_cast<unsigned long long>(c.serial()));
    c.fail(status::protocol_error);
    return;
  }
  const int error = c.connected(peer);
  if (error != 0) {
    COMM_LOG(warn, log_name, "connecting qp %u: %s", c.qp()->qp_num, std::strerror(error));
    c.fail(status::io_error);
    return;
  }
  if (t_.establish(c.id()) != 0) {
    c.fail(status::io_error);
    return;
  }
  c.established();
}

void verbs_iface::handle_connect_request(const cm_event_copy& copy) {
  rdma_cm_id* id = copy.event.id;
  handshake peer;
  const bool valid = parse_handshake(copy.private_data, copy.private_data_len, &peer) &&
                     peer.link_layer == port_.link_layer;
  if (!valid || conns_.size() >= max_connections()) {
    COMM_LOG(info, log_name, "connection request refused: %s",
             valid ? "too many connections" : "not a valid handshake");
    t_.reject(id, nullptr, 0);
    t_.destroy_id(id);
    return;
  }
  ibv_qp* qp = create_qp();
  if (qp == nullptr) {
    t_.reject(id, nullptr, 0);
    t_.destroy_id(id);
    return;
  }
  const uint32_t psn = next_psn_++ & 0xffffff;
  verbs_conn& c = add_conn(std::make_unique<verbs_conn>(*this, next_serial_++, qp, id, true, psn));
  COMM_LOG(debug, log_name, "connection %llu (qp %u): accepted from qp %u",
           static_cast<unsigned long long>(c.serial()), qp->qp_num, peer.qp_num);
  const encoded_handshake h = encode_handshake(local_handshake(qp, psn));
  rdma_conn_param param{};
  param.private_data = h.bytes;
  param.private_data_len = sizeof(h.bytes);
  param.responder_resources = std::min(max_rd_atom_, copy.event.param.conn.responder_resources);
  param.initiator_depth = std::min(max_init_rd_atom_, copy.event.param.conn.initiator_depth);
  param.qp_num = qp->qp_num;
  if (c.connected(peer) != 0 || t_.accept(id, &param) != 0) {
    COMM_LOG(warn, log_name, "accepting a connection: %s", std::strerror(errno));
    t_.reject(id, nullptr, 0);
    destroy_conn(c);
  }
}

unsigned verbs_iface::poll_events() {
  pollfd fds[2] = {{cm_channel_->fd, POLLIN, 0}, {ctx_->async_fd, POLLIN, 0}};
  if (::poll(fds, 2, 0) <= 0) return 0;
  unsigned n = 0;
  if (fds[0].revents != 0) n += poll_cm_events();
  if (fds[1].revents != 0) n += poll_async_events();
  return n;
}

// -- async events --------------------------------------------------------------------------------

unsigned verbs_iface::poll_async_events() {
  unsigned n = 0;
  ibv_async_event event{};
  while (t_.get_async_event(ctx_, &event) == 0) {
    handle_async_event(event);
    t_.ack_async_event(&event);
    ++n;
  }
  return n;
}

void verbs_iface::handle_async_event(const ibv_async_event& event) {
  COMM_LOG(info, log_name, "%s: async event %s", port_.name().c_str(),
           t_.event_type_str(event.event_type));
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
      if (verbs_conn* c = conn_of_qp(event.element.qp->qp_num)) {
        c->fail(event.event_type == IBV_EVENT_QP_ACCESS_ERR ? status::protection_error
                                                            : status::io_error);
      }
      break;
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      fail_all(status::io_error);
      break;
    default:
      break;
  }
}

// -- completions ---------------------------------------------------------------------------------

bool verbs_iface::repost(uint32_t buffer) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(rx_pool_ + static_cast<size_t>(buffer) * seg_),
              static_cast<uint32_t>(seg_), rx_mr_->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = rx_flag | buffer;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  const int error = t_.post_srq_recv(srq_, &wr, &bad);
  if (error != 0) {
    COMM_LOG(error, log_name, "post_srq_recv: %s", std::strerror(error));
    return false;
  }
  ++rx_posted_;
  return true;
}

int verbs_iface::read_cq(work_completion* out, int max) {
  if (cq_ex_ == nullptr) {
    ibv_wc wc[poll_batch];
    const int n = t_.poll_cq(cq_, std::min(max, poll_batch), wc);
    for (int i = 0; i < n; ++i) out[i] = work_completion{wc[i], {}};
    return n;
  }
  ibv_poll_cq_attr attr{};
  int n = 0;
  int more = t_.start_poll(cq_ex_, &attr);
  if (more == ENOENT) return 0;
  if (more != 0) return -more;
  while (more == 0 && n < max) {
    work_completion& c = out[n++];
    c = work_completion{};
    c.wc.wr_id = cq_ex_->wr_id;
    c.wc.status = cq_ex_->status;
    c.wc.qp_num = t_.wc_read_qp_num(cq_ex_);
    if (c.wc.status == IBV_WC_SUCCESS) {
      c.wc.opcode = t_.wc_read_opcode(cq_ex_);
      c.wc.byte_len = t_.wc_read_byte_len(cq_ex_);
      c.wc.wc_flags = t_.wc_read_wc_flags(cq_ex_);
      if ((c.wc.wc_flags & IBV_WC_WITH_IMM) != 0) c.wc.imm_data = t_.wc_read_imm_data(cq_ex_);
      if (c.wc.opcode == IBV_WC_TM_RECV) t_.wc_read_tm_info(cq_ex_, &c.tm);
    }
    if (n < max) more = t_.next_poll(cq_ex_);
  }
  t_.end_poll(cq_ex_);
  return n;
}

unsigned verbs_iface::poll_cq() {
  work_completion wc[poll_batch];
  const int n = read_cq(wc, poll_batch);
  for (int i = 0; i < n; ++i) handle_wc(wc[i]);
  if (tags_ != nullptr) tags_->after_poll();
  return n > 0 ? static_cast<unsigned>(n) : 0;
}

unsigned verbs_iface::handle_stash() {
  if (stash_.empty()) return 0;
  std::vector<work_completion> stashed;
  stashed.swap(stash_);
  for (const work_completion& wc : stashed) handle_wc(wc);
  return static_cast<unsigned>(stashed.size());
}

void verbs_iface::stash_completions() {
  work_completion wc[poll_batch];
  const int n = read_cq(wc, poll_batch);
  for (int i = 0; i < n; ++i) {
    if (tags_ == nullptr || !tags_->take_list_op(wc[i])) stash_.push_back(wc[i]);
  }
}

void verbs_iface::handle_wc(const work_completion& completion) {
  const ibv_wc& wc = completion.wc;
  if (completion.staged >= 0) {
    if (tags_ != nullptr) tags_->deliver_staged(completion.staged);
    return;
  }
  if ((wc.wr_id & rx_flag) != 0) {
    handle_receive(completion);
    return;
  }
  if ((wc.wr_id & tm_flag) != 0) {
    if (tags_ != nullptr) tags_->handle(completion);
    return;
  }
  verbs_conn* c = conn_of_qp(wc.qp_num);
  if (c != nullptr && wc.status == IBV_WC_WR_FLUSH_ERR && c->state() != conn_state::failed) {
    // Flushed without an error completion first: the cause is an async event or a disconnect
    // not read yet. Read them, so the endpoint fails with the cause rather than the flush.
    poll_async_events();
    poll_cm_events();
    c = conn_of_qp(wc.qp_num);
  }
  if (c != nullptr) c->send_completed(wc.wr_id, wc.status);
}

void verbs_iface::handle_receive(const work_completion& completion) {
  const ibv_wc& wc = completion.wc;
  const auto buffer = static_cast<uint32_t>(wc.wr_id & ~rx_flag);
  --rx_posted_;
  verbs_conn* c = conn_of_qp(wc.qp_num);
  const uint8_t* bytes = rx_pool_ + static_cast<size_t>(buffer) * seg_;
  std::optional<message_header> header;
  if (wc.status == IBV_WC_SUCCESS && tm_) {
    const auto tagged = parse_tagged(bytes, wc.byte_len);
    const bool am = tagged && tags_->active_message(*tagged, wc);
    if (c != nullptr && tagged && tagged->opcode != IBV_TMH_NO_TAG && !am) {
      tags_->handle_tagged(*c, buffer, *tagged, completion);
      return;
    }
    if (c == nullptr && tagged && !am) {
      tags_->count_unexpected(*tagged);  // from a connection gone: the device counted it
      repost(buffer);
      return;
    }
    if (tagged && wc.byte_len >= header_size()) {
      header = parse_message_header(bytes + prefix_, wc.byte_len - prefix_, tl::am_id_count);
    }
  } else if (wc.status == IBV_WC_SUCCESS) {
    header = parse_message_header(bytes, wc.byte_len, tl::am_id_count);
  }
  if (c == nullptr || !header) {
    repost(buffer);
    if (c != nullptr && wc.status != IBV_WC_WR_FLUSH_ERR) {
      c->fail(wc.status == IBV_WC_SUCCESS ? status::protocol_error : status_of(wc.status));
    }
    return;
  }
  c->add_credits(header->credits);
  if (header->kind == message_kind::grant) {
    repost(buffer);
    return;
  }
  if (header->kind == message_kind::release) {
    repost(buffer);
    handle_release(*c);
    return;
  }
  if (header->kind == message_kind::rndv_fin) {
    if (repost(buffer)) c->receive_reposted();
    if (c->ep != nullptr) c->ep->rndv_finished(header->op_id, status::ok);
    return;
  }
  deliver(*c, header->am_id, buffer, wc.byte_len - header_size());
}

void verbs_iface::handle_release(verbs_conn& c) {
  c.peer_left();
  COMM_LOG(debug, log_name, "connection %llu (qp %u): the peer's endpoint left it%s",
           static_cast<unsigned long long>(c.serial()), c.qp()->qp_num,
           c.ep == nullptr ? ", and none here uses it: closed" : "");
  if (c.ep == nullptr) close_conn(c);
}

void verbs_iface::deliver(verbs_conn& c, tl::am_id id, uint32_t buffer, size_t length) {
  uint8_t* data = rx_pool_ + static_cast<size_t>(buffer) * seg_ + header_size();
  const handler& h = handlers_[id];
  status st = status::ok;
  if (h.fn == nullptr) {
    ++dropped_;
    COMM_LOG(debug, log_name, "message for am id %u without a handler dropped", id);
  } else {
    const unsigned flags = can_lend() ? tl::am_flag_desc : 0;
    st = h.fn(h.arg, data, length, flags);
    if (st == status::in_progress && flags != 0) {
      lend(c, buffer);
      return;
    }
  }
  if (repost(buffer)) c.receive_reposted();
}

void verbs_iface::lend(verbs_conn& c, uint32_t buffer) {
  rx_owner_[buffer] = c.qp()->qp_num;
  rx_lent_[buffer] = true;
  ++rx_lent_count_;
}

void verbs_iface::return_buffer(verbs_conn& c, uint32_t buffer) {
  if (repost(buffer)) c.receive_reposted();
}

size_t verbs_iface::max_am_descs() const { return std::max<size_t>(1, config_.credits / 2); }

void verbs_iface::release_am_desc(void* data) {
  // An active message's data follows its header; an unexpected tagged message's, its TMH.
  const auto* p = static_cast<uint8_t*>(data);
  const size_t offset = p >= rx_pool_ ? static_cast<size_t>(p - rx_pool_) % seg_ : 0;
  const bool in_pool = p >= rx_pool_ && p < rx_pool_ + config_.rx_buffers * seg_ &&
                       (offset == header_size() || (tm_ && offset == tmh_size));
  const auto buffer = in_pool ? static_cast<uint32_t>(static_cast<size_t>(p - rx_pool_) / seg_) : 0;
  if (!in_pool || !rx_lent_[buffer]) {
    COMM_LOG(error, log_name, "release_am_desc: %p is not a descriptor kept from this interface",
             data);
    return;
  }
  rx_lent_[buffer] = false;
  --rx_lent_count_;
  if (!repost(buffer)) return;
  if (verbs_conn* c = conn_of_qp(rx_owner_[buffer])) c->receive_reposted();
}

void verbs_iface::drain_cq_events() {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  while (t_.get_cq_event(comp_channel_, &cq, &context) == 0) t_.ack_cq_events(cq, 1);
  armed_ = false;
}

// -- progress ------------------------------------------------------------------------------------

void verbs_iface::set_am_handler(tl::am_id id, tl::am_handler_fn fn, void* arg) {
  if (id < tl::am_id_count) handlers_[id] = {fn, arg};
}

void verbs_iface::set_error_handler(tl::error_handler_fn fn, void* arg) {
  error_fn_ = fn;
  error_arg_ = arg;
}

unsigned verbs_iface::progress() {
  in_progress_ = true;
  unsigned n = handle_stash() + poll_cq();
  if (armed_) drain_cq_events();
  if ((++tick_ & 15) == 0) n += poll_events();
  n += serve_watched();
  in_progress_ = false;
  reap_closed();
  report_failures();
  return n;
}

void verbs_iface::watch(verbs_conn& c) {
  if (c.watched) return;
  c.watched = true;
  watched_.push_back(c.serial());
}

unsigned verbs_iface::serve_watched() {
  unsigned n = 0;
  size_t kept = 0;
  // By index: a dispatched operation may park on another endpoint, which appends to the list.
  for (size_t i = 0; i < watched_.size(); ++i) {
    const uint64_t serial = watched_[i];
    const auto found = conns_.find(serial);
    if (found == conns_.end()) continue;
    verbs_conn& c = *found->second;
    if (c.grant_due()) c.send_grant();
    c.send_due_fins();
    if (c.release_due()) c.send_release();
    if (c.pending_can_run()) n += c.pending.dispatch();
    if (c.needs_watching()) {
      watched_[kept++] = serial;
    } else {
      c.watched = false;
    }
  }
  watched_.resize(kept);
  return n;
}

void verbs_iface::reap_closed() {
  std::vector<uint64_t> closing = std::move(closing_);
  closing_.clear();
  for (uint64_t serial : closing) {
    const auto found = conns_.find(serial);
    if (found != conns_.end()) destroy_conn(*found->second);
  }
}

void verbs_iface::report_failures() {
  std::vector<uint64_t> failed = std::move(failed_);
  failed_.clear();
  for (uint64_t serial : failed) {
    const auto found = conns_.find(serial);
    if (found == conns_.end()) continue;
    verbs_conn& c = *found->second;
    if (c.ep == nullptr) {
      destroy_conn(c);
    } else if (error_fn_ != nullptr) {
      error_fn_(error_arg_, c.ep, c.failure());
    }
  }
}

status verbs_iface::event_arm() {
  if (!failed_.empty() || !closing_.empty() || !stash_.empty()) return status::busy;
  for (uint64_t serial : watched_) {
    const auto found = conns_.find(serial);
    if (found == conns_.end()) continue;
    const verbs_conn& c = *found->second;
    if (c.grant_due() || c.release_due() || c.pending_can_run()) return status::busy;
  }
  if (t_.req_notify_cq(cq_, 0) != 0) return status::io_error;
  armed_ = true;
  stash_completions();
  if (!stash_.empty()) return status::busy;
  if (readable(cm_channel_->fd) || readable(ctx_->async_fd)) return status::busy;
  return status::ok;
}

int32_t verbs_iface::take_tx_buffer() {
  if (free_tx_.empty()) return -1;
  const int32_t index = free_tx_.back();
  free_tx_.pop_back();
  return index;
}

std::string verbs_iface::info() const {
  std::ostringstream out;
  out << "verbs " << port_.name() << " ("
      << (port_.link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : "RoCE") << ", GID "
      << gid_.index << ", backend " << t_.backend << ")\n"
      << "listener " << to_string(listen_address_) << ", " << conns_.size() << " of "
      << max_connections() << " connections\n"
      << "receive " << config_.rx_buffers << " x " << seg_ << " B (" << rx_posted_
      << " posted), send " << config_.tx_buffers << " buffers, " << config_.tx_queue
      << " requests per QP, " << config_.credits << " credits per peer, inline " << max_inline_
      << " B\n"
      << "registrations " << md_->user_regions() << " user, " << md_->cached() << " cached, "
      << dropped_ << " messages without a handler, " << rx_lent_count_ << " of " << max_am_descs()
      << " receive buffers kept by handlers\n";
  if (tm_caps_.max_num_tags == 0) {
    out << "tag matching: the device offers none (tm_caps.max_num_tags 0); no cap_tag_* flags\n";
  } else {
    out << "tag matching: the device offers " << tm_caps_.max_num_tags << " tags (max_ops "
        << tm_caps_.max_ops << ", max_sge " << tm_caps_.max_sge << ", rendezvous header "
        << tm_caps_.max_rndv_hdr_size << " B), "
        << (tm_ ? "used: a tag-matching SRQ" : "not used (COMM_VERBS_TM=0)") << "\n";
  }
  if (tags_ != nullptr) out << tags_->info();
  return out.str();
}

}  // namespace comm::verbs
