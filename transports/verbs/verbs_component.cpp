#include "verbs/verbs_component.hpp"

#include "verbs/verbs_cm.hpp"

#include <comm/log.hpp>

#include <algorithm>

namespace comm::verbs {
namespace {

class verbs_component_impl final : public tl::component {
public:
  verbs_component_impl(const api& table, const verbs_config& config)
      : t_(table), config_(config) {}

  std::string_view name() const override { return "verbs"; }

  std::vector<std::string> devices() const override {
    std::vector<std::string> names;
    for (const port_info& p : usable_ports(t_)) names.push_back(p.name());
    return names;
  }

  std::string unavailable_reason() const override {
    std::string why;
    usable_ports(t_, &why);
    return why;
  }

  status open(const tl::iface_params& params, std::unique_ptr<tl::iface>& out) override {
    const std::vector<port_info> ports = usable_ports(t_);
    auto port = std::find_if(ports.begin(), ports.end(), [&](const port_info& p) {
      return params.device.empty() || p.name() == params.device;
    });
    if (port == ports.end()) return status::no_elem;
    if (!params.auth_key.empty()) {
      // Admitting every peer under a cluster secret would be a silent hole: refuse instead.
      COMM_LOG(error, "verbs", "a cluster auth key is not supported by the verbs transport yet");
      return status::unsupported;
    }
    verbs_config config = config_;
    if (params.fifo_size != 0) config.rx_buffers = params.fifo_size;
    if (params.segment_size != 0) config.segment_size = params.segment_size;
    auto created = std::make_unique<verbs_iface>(t_, *port, config);
    if (created->open_status() != status::ok) return created->open_status();
    out = std::move(created);
    return status::ok;
  }

  status open_cm(const tl::cm_params& params, std::unique_ptr<tl::cm>& out) override {
    return open_verbs_cm(t_, params, out);
  }

private:
  const api& t_;
  verbs_config config_;
};

}  // namespace

std::unique_ptr<tl::component> make_verbs_component(const api& table, const verbs_config& config) {
  return std::make_unique<verbs_component_impl>(table, config);
}

tl::component& verbs_component() {
  static verbs_component_impl instance(rdma_core_api(), verbs_config{});
  return instance;
}

}  // namespace comm::verbs
