#include <comm/context.hpp>
#include <comm/log.hpp>
#include <comm/transport/transport.hpp>

#include "topology.hpp"

#include <sstream>

namespace comm {

context::context(config cfg) : cfg_(std::move(cfg)) {
  for (tl::component* component : tl::all_components()) {
    const std::string name(component->name());
    if (!cfg_.transport_enabled(name)) continue;
    if (component->devices().empty()) {
      COMM_LOG(info, "context", "transport %s unavailable: %s", name.c_str(),
               component->unavailable_reason().c_str());
      continue;
    }
    components_.push_back(component);
  }
  for (const auto& wanted : cfg_.transports) {
    bool known = wanted == "all";
    for (tl::component* component : tl::all_components()) {
      known = known || component->name() == wanted;
    }
    if (!known) COMM_LOG(warn, "context", "COMM_TLS names unknown transport '%s'", wanted.c_str());
  }
}

context::~context() = default;

std::string context::info() const {
  std::ostringstream out;
  out << "# libcomm context\n";
  for (tl::component* component : tl::all_components()) {
    const std::string name(component->name());
    out << "transport " << name << ": ";
    auto devices = component->devices();
    if (!cfg_.transport_enabled(name)) {
      out << "disabled by COMM_TLS\n";
    } else if (devices.empty()) {
      out << "unavailable (" << component->unavailable_reason() << ")\n";
    } else {
      out << "devices";
      for (const auto& d : devices) out << ' ' << d;
      out << '\n';
    }
  }
  out << "thresholds: short=" << (cfg_.short_thresh ? std::to_string(cfg_.short_thresh) : "auto")
      << " zcopy=" << cfg_.zcopy_thresh
      << " rndv=" << (cfg_.rndv_thresh ? std::to_string(cfg_.rndv_thresh) : "auto")
      << " shm_fifo=" << cfg_.shm_fifo_size << " shm_segment=" << cfg_.shm_segment_size << '\n';
  out << detail::topology_summary() << '\n';
  const peer_limits& limits = cfg_.limits;
  out << "peer limits: unexpected=" << limits.unexpected_max_bytes
      << " unexpected_ep=" << limits.unexpected_ep_max_bytes
      << " unexpected_ep_msgs=" << limits.unexpected_ep_max_msgs
      << " am_rx=" << limits.am_rx_max_bytes << " am_rx_ep=" << limits.am_rx_ep_max_bytes
      << " reply_ep=" << limits.reply_ep_max_bytes << " peer_eps=" << limits.peer_ep_max << '\n';
  return out.str();
}

}  // namespace comm
