// Worker addresses and the endpoint table: packing and decoding addresses, picking a lane to a
// peer, creating and destroying endpoints. The handshake that follows is the wireup module's
// (wireup.cpp); client-server connections pick their lane here too (listener.cpp).
#include "protocols.hpp"
#include "worker_impl.hpp"

#include <comm/log.hpp>

#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstring>

namespace comm {

using detail::worker_impl;

namespace detail {

/// A decoded worker address.
struct peer_address {
  uint64_t uid = 0;
  std::string name;
  uint64_t client_id = 0;
  struct transport {
    std::string name;
    std::vector<uint8_t> device;
    std::vector<uint8_t> iface;
    uint32_t reads_in = 0;  ///< RDMA reads it accepts per endpoint (0: not said)
    uint64_t eager_window = 0;  ///< large eager copies it accepts per endpoint (0: not said)
  };
  std::vector<transport> transports;
};

namespace {

std::vector<uint8_t> to_vector(capnp::Data::Reader data) {
  return std::vector<uint8_t>(data.begin(), data.end());
}

/// Decodes a packed WorkerAddress; invalid_addr for anything malformed or with more than
/// max_address_entries transport entries.
status decode_address(const void* data, size_t length, peer_address* out) {
  if (length > (1u << 20)) return status::invalid_addr;
  status result = status::ok;
  const bool valid = wire::read_checked_message<wire::schema::WorkerAddress>(
      data, length, [&](wire::schema::WorkerAddress::Reader address) {
        out->uid = address.getUid();
        out->name = address.getName();
        out->client_id = address.getClientId();
        if (address.getTransports().size() > max_address_entries) {
          result = status::invalid_addr;
          return;
        }
        for (auto t : address.getTransports()) {
          out->transports.push_back({t.getName(), to_vector(t.getDevice()), to_vector(t.getIface()),
                                     t.getReadsIn(), t.getEagerWindow()});
        }
      });
  if (!valid || out->uid == 0) result = status::invalid_addr;
  return result;
}

}  // namespace

/// RDMA reads a peer may have outstanding per endpoint on an interface with `attr`: the
/// configured limit, lowered to what the transport accepts.
uint32_t worker_impl::reads_accepted(const tl::iface_attr& attr) const {
  size_t limit = ctx.cfg().limits.rma_reads_in;
  if (attr.max_outstanding_reads != 0) limit = std::min(limit, attr.max_outstanding_reads);
  return static_cast<uint32_t>(std::clamp<size_t>(limit, 1, UINT32_MAX));
}

size_t worker_impl::eager_window_accepted() const {
  const peer_limits& c = ctx.cfg().limits;
  return std::min({c.eager_window_ep_bytes, c.unexpected_ep_max_bytes / 2,
                   c.unexpected_max_bytes / 2});
}

std::vector<uint8_t> worker_impl::packed_address(unsigned flags) const {
  const auto offered = [&](const lane_iface& li) {
    return (flags & address_net_only) == 0 || !li.iface->attr().node_local;
  };
  capnp::MallocMessageBuilder message;
  auto address = message.initRoot<wire::schema::WorkerAddress>();
  address.setUid(uid_);
  address.setName(params.name);
  address.setClientId(params.client_id);
  const auto count = std::count_if(ifaces.begin(), ifaces.end(), offered);
  auto list = address.initTransports(static_cast<unsigned>(count));
  unsigned n = 0;
  for (const lane_iface& li : ifaces) {
    if (!offered(li)) continue;
    auto entry = list[n++];
    entry.setName(std::string(li.component->name()));
    auto device = li.iface->device_address();
    auto iface = li.iface->iface_address();
    entry.setDevice(kj::arrayPtr(device.data(), device.size()));
    entry.setIface(kj::arrayPtr(iface.data(), iface.size()));
    entry.setReadsIn(reads_accepted(li.iface->attr()));
    entry.setEagerWindow(eager_window_accepted());
  }
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

status worker_impl::new_ep(bool by_peer, endpoint_impl** out) {
  uint32_t index;
  if (!free_ep_slots.empty()) {
    index = free_ep_slots.back();
    free_ep_slots.pop_back();
  } else {
    if (ep_table.size() >= (1u << 20)) return status::exceeds_limit;
    index = static_cast<uint32_t>(ep_table.size());
    ep_table.push_back(nullptr);
  }
  ep_generation = (ep_generation + 1) & 0xFFFu;
  if (ep_generation == 0) ep_generation = 1;
  const uint32_t id = index | (ep_generation << 20);
  auto* ep = new endpoint_impl(*this, id, by_peer);
  ep_table[index] = ep;
  if (by_peer) ++peer_eps;
  *out = ep;
  return status::ok;
}

std::vector<lane_candidate> worker_impl::lane_candidates(const peer_address& peer) const {
  std::vector<lane_candidate> out;
  for (size_t i = 0; i < ifaces.size(); ++i) {
    const lane_iface& li = ifaces[i];
    for (size_t j = 0; j < peer.transports.size(); ++j) {
      const auto& t = peer.transports[j];
      if (t.name != li.component->name() || !li.iface->is_reachable(t.device, t.iface)) continue;
      const tl::iface_attr& a = li.iface->attr();
      out.push_back({t.name, li.device, a.latency_ns, a.bandwidth_bytes_per_s, a.priority,
                     placement.distance(li.device), i, j});
    }
  }
  rank_lanes(out);
  return out;
}

status worker_impl::connect_lane(endpoint_impl* ep, const void* data, size_t length) {
  peer_address peer;
  status st = decode_address(data, length, &peer);
  if (st != status::ok) return st;
  const std::vector<lane_candidate> ranked = lane_candidates(peer);
  for (size_t k = 0; k < ranked.size(); ++k) {
    const lane_candidate& c = ranked[k];
    const auto& t = peer.transports[c.peer_index];
    std::unique_ptr<tl::ep> lane;
    st = ifaces[c.iface_index].iface->create_ep(t.device, t.iface, lane);
    if (st != status::ok) {
      COMM_LOG(warn, "wireup", "%s: cannot create %s endpoint to %s: %s", params.name.c_str(),
               t.name.c_str(), peer.name.c_str(), to_string(st));
      continue;
    }
    ep->peer_uid_ = peer.uid;
    ep->peer_name_ = peer.name;
    ep->lane_choice = lane_reason(ranked, k);
    ep->peer_iface = static_cast<uint32_t>(c.peer_index);
    ep->attach_lane(std::move(lane), ifaces[c.iface_index].iface.get());
    module_of<rma_protocol>(*this).bind_read_limit(*ep, t.reads_in);
    ep->eager_window = ep->copies_below != 0 ? t.eager_window : 0;
    ep->eager_credit = ep->eager_window;
    COMM_LOG(debug, "wireup", "%s: endpoint %u to %s: %s", params.name.c_str(), ep->id,
             peer.name.c_str(), ep->lane_choice.c_str());
    return status::ok;
  }
  COMM_LOG(info, "wireup", "%s: no transport reaches %s", params.name.c_str(), peer.name.c_str());
  return status::unreachable;
}

status worker_impl::create_ep(const void* data, size_t length, bool by_peer, endpoint_impl** out) {
  endpoint_impl* ep = nullptr;
  status st = new_ep(by_peer, &ep);
  if (st != status::ok) return st;
  st = connect_lane(ep, data, length);
  if (st != status::ok) {
    const uint32_t index = ep->id & 0xFFFFFu;
    ep_table[index] = nullptr;
    free_ep_slots.push_back(index);
    if (by_peer) --peer_eps;
    delete ep;
    return st;
  }
  *out = ep;
  return status::ok;
}

void worker_impl::destroy_ep(endpoint_impl* ep) {
  const uint32_t index = ep->id & 0xFFFFFu;
  if (index < ep_table.size() && ep_table[index] == ep) {
    forget_peer(*ep, held_fate::detach);
    if (ep->created_by_peer) --peer_eps;
    ep_table[index] = nullptr;
    free_ep_slots.push_back(index);
    closed_ids[closed_next++ % closed_ids.size()] = ep->id;
    doomed.push_back(ep);
  }
}

endpoint_impl* worker_impl::unknown_receiving_ep(uint32_t id, const char* what) {
  if (id != 0 && std::find(closed_ids.begin(), closed_ids.end(), id) != closed_ids.end()) {
    ++late_messages;
    COMM_LOG(debug, "worker", "%s: %s (endpoint %u, closed): dropped", params.name.c_str(), what,
             id);
    return nullptr;
  }
  protocol_error(nullptr, what);
  return nullptr;
}

}  // namespace detail

status worker::query_address(const void* address, size_t length, worker_address_attr* out) {
  detail::peer_address peer;
  status st = detail::decode_address(address, length, &peer);
  if (st != status::ok) return st;
  out->uid = peer.uid;
  out->name = peer.name;
  out->client_id = peer.client_id;
  out->transports.clear();
  for (const auto& t : peer.transports) {  // one entry per device: each transport named once
    if (std::find(out->transports.begin(), out->transports.end(), t.name) == out->transports.end())
      out->transports.push_back(t.name);
  }
  return status::ok;
}

}  // namespace comm
