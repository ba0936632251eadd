#include "verbs/verbs_component.hpp"

#include "verbs/verbs_cm.hpp"

#include <comm/log.hpp>

#include <algorithm>

namespace comm::verbs {
namespace {

/// The usable ports of `table` that COMM_VERBS_DEVICE names, in its order (every one when unset);
/// why there are none in `*why`.
std::vector<port_info> chosen_ports(const api& table, const tl::options& opts, std::string* why) {
  std::vector<port_info> ports = usable_ports(table, why);
  const std::vector<std::string> wanted = configured_ports(opts);
  if (wanted.empty() || ports.empty()) return ports;
  std::vector<port_info> chosen;
  for (const std::string& name : wanted) {
    auto found = std::find_if(ports.begin(), ports.end(),
                              [&](const port_info& p) { return p.name() == name; });
    if (found != ports.end()) chosen.push_back(*found);
  }
  if (chosen.empty() && why != nullptr) {
    *why = "no RDMA device: none of the active ports is named in COMM_VERBS_DEVICE";
  }
  return chosen;
}

class verbs_component_impl final : public tl::component {
public:
  verbs_component_impl(const api& table, const verbs_config& config)
      : t_(&table), config_(config) {}

  /// Calls `table` from now on.
  void use_table(const api& table) { t_ = &table; }

  std::string_view name() const override { return "verbs"; }

  std::vector<std::string> devices(const tl::options& opts) const override {
    std::vector<std::string> names;
    for (const port_info& p : chosen_ports(*t_, opts, nullptr)) names.push_back(p.name());
    return names;
  }

  std::string unavailable_reason(const tl::options& opts) const override {
    std::string why;
    chosen_ports(*t_, opts, &why);
    return why;
  }

  std::span<const tl::knob> knobs() const override { return verbs_knobs; }

  status check_options(const tl::options& opts, std::string* why) const override {
    verbs_config config;
    return verbs_config::parse(opts, config_, &config, why);
  }

  status open(const tl::iface_params& params, std::unique_ptr<tl::iface>& out) override {
    verbs_config config;
    std::string why;
    if (verbs_config::parse(params.opts, config_, &config, &why) != status::ok) {
      COMM_LOG(error, "verbs", "%s", why.c_str());
      return status::invalid_param;
    }
    const std::vector<port_info> ports = chosen_ports(*t_, params.opts, nullptr);
    auto port = std::find_if(ports.begin(), ports.end(), [&](const port_info& p) {
      return params.device.empty() || p.name() == params.device;
    });
    if (port == ports.end()) return status::no_elem;
    if (!params.auth_key.empty()) {
      // Admitting every peer under a cluster secret would be a silent hole: refuse instead.
      COMM_LOG(error, "verbs", "a cluster auth key is not supported by the verbs transport yet");
      return status::unsupported;
    }
    if (params.fifo_size != 0) {
      // A small receive queue grants each peer at most half of it (and at least two).
      config.rx_buffers = params.fifo_size;
      config.credits = static_cast<uint16_t>(
          std::clamp<size_t>(params.fifo_size / 2, 2, config.credits));
    }
    if (params.segment_size != 0) config.segment_size = params.segment_size;
    auto created = std::make_unique<verbs_iface>(*t_, *port, config);
    if (created->open_status() != status::ok) return created->open_status();
    out = std::move(created);
    return status::ok;
  }

  status open_cm(const tl::cm_params& params, std::unique_ptr<tl::cm>& out) override {
    std::string why;
    if (check_options(params.opts, &why) != status::ok) {
      COMM_LOG(error, "verbs", "%s", why.c_str());
      return status::invalid_param;
    }
    return open_verbs_cm(*t_, params, out);
  }

private:
  const api* t_;
  verbs_config config_;
};

verbs_component_impl& registered() {
  static verbs_component_impl instance(rdma_core_api(), verbs_config{});
  return instance;
}

}  // namespace

std::unique_ptr<tl::component> make_verbs_component(const api& table, const verbs_config& config) {
  return std::make_unique<verbs_component_impl>(table, config);
}

tl::component& verbs_component() { return registered(); }

void use_verbs_table(const api& table) { registered().use_table(table); }

}  // namespace comm::verbs

namespace comm::tl::verbs {

tl::component& verbs_component() { return comm::verbs::verbs_component(); }

}  // namespace comm::tl::verbs
