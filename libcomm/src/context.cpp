#include <comm/context.hpp>
#include <comm/log.hpp>
#include <comm/transport/transport.hpp>

#include "topology.hpp"

#include <sstream>
#include <stdexcept>

namespace comm {

namespace {

/// Throws std::invalid_argument when an entry of `opts` belongs to no transport built in.
void refuse_unowned_options(const tl::options& opts) {
  for (const auto& [variable, value] : opts) {
    bool owned = false;
    for (tl::component* component : tl::all_components())
      owned = owned || variable.starts_with(tl::option_prefix(component->name()));
    if (owned) continue;
    const std::string why = variable + "=" + value + " refused: no transport reads it";
    COMM_LOG(error, "context", "%s", why.c_str());
    throw std::invalid_argument(why);
  }
}

/// Throws std::invalid_argument, after logging it at level error, when `component` refuses one of
/// its options in `opts`: a demanding user gets no traffic on another transport in its place.
void check_options(const tl::component& component, const tl::options& opts) {
  std::string why;
  if (component.check_options(opts, &why) == status::ok) return;
  why = "transport " + std::string(component.name()) + ": " + why;
  COMM_LOG(error, "context", "%s", why.c_str());
  throw std::invalid_argument(why);
}

}  // namespace

context::context(config cfg) : cfg_(std::move(cfg)) {
  refuse_unowned_options(cfg_.transport_options);
  for (tl::component* component : tl::all_components()) {
    const std::string name(component->name());
    if (!cfg_.transport_enabled(name)) continue;
    check_options(*component, cfg_.transport_options);
    if (component->devices(cfg_.transport_options).empty()) {
      COMM_LOG(info, "context", "transport %s unavailable: %s", name.c_str(),
               component->unavailable_reason(cfg_.transport_options).c_str());
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
    auto devices = component->devices(cfg_.transport_options);
    if (!cfg_.transport_enabled(name)) {
      out << "disabled by COMM_TLS\n";
    } else if (devices.empty()) {
      out << "unavailable (" << component->unavailable_reason(cfg_.transport_options) << ")\n";
    } else {
      out << "devices";
      for (const auto& d : devices) out << ' ' << d;
      out << '\n';
    }
  }
  out << "thresholds: short=" << (cfg_.short_thresh ? std::to_string(cfg_.short_thresh) : "auto")
      << " zcopy=" << cfg_.zcopy_thresh
      << " rndv=" << (cfg_.rndv_thresh ? std::to_string(cfg_.rndv_thresh) : "auto") << '\n';
  out << detail::topology_summary() << '\n';
  const peer_limits& limits = cfg_.limits;
  out << "peer limits: unexpected=" << limits.unexpected_max_bytes
      << " unexpected_ep=" << limits.unexpected_ep_max_bytes
      << " unexpected_ep_msgs=" << limits.unexpected_ep_max_msgs
      << " eager_window_ep=" << limits.eager_window_ep_bytes
      << " am_rx=" << limits.am_rx_max_bytes << " am_rx_ep=" << limits.am_rx_ep_max_bytes
      << " am_held=" << limits.am_held_max << " am_held_bytes=" << limits.am_held_max_bytes
      << " stream_rx=" << limits.stream_rx_max_bytes
      << " stream_rx_ep=" << limits.stream_rx_ep_max_bytes
      << " reply_ep=" << limits.reply_ep_max_bytes << " peer_eps=" << limits.peer_ep_max << '\n';
  return out.str();
}

}  // namespace comm
