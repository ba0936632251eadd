// The context: configuration plus the transports available to the workers created from it.
#pragma once

#include <comm/config.hpp>
#include <comm/status.hpp>

#include <memory>
#include <string>
#include <vector>

namespace comm {

namespace tl {
class component;
}

/// A libcomm context (ucp_context): configuration and the enabled transports. Create one per
/// process, then workers from it; it must outlive them.
class context {
public:
  /// Creates a context with `cfg`. Throws std::invalid_argument (after logging it at level error)
  /// when an enabled transport refuses one of cfg.transport_options, or one belongs to none.
  explicit context(config cfg = config::from_environment());
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  /// The configuration in force.
  const config& cfg() const noexcept { return cfg_; }

  /// Enabled transports with at least one device, in preference order.
  const std::vector<tl::component*>& components() const noexcept { return components_; }

  /// A multi-line description: transports, devices, limits, thresholds and topology.
  std::string info() const;

private:
  config cfg_;
  std::vector<tl::component*> components_;
};

}  // namespace comm
