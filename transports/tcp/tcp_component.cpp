#include "tcp/tcp_cm.hpp"
#include "tcp/tcp_config.hpp"
#include "tcp/tcp_iface.hpp"

#include <algorithm>

namespace comm::tl::tcp {
namespace {

/// The devices COMM_TCP_DEVICE and COMM_TCP_AF_PRIO leave (a refusal of a knob is
/// check_options' to report; a refused family list counts as the default).
std::vector<net_device> devices_of(const options& opts, std::string* why = nullptr) {
  std::vector<int> families;
  tcp_config::parse_families(opts, &families, nullptr);
  return usable_devices(option_reader("tcp", tcp_knobs, opts).list(device_knob), families, why);
}

class tcp_component_impl final : public component {
public:
  std::string_view name() const override { return "tcp"; }

  std::vector<std::string> devices(const options& opts) const override {
    std::vector<std::string> names;
    for (const net_device& d : devices_of(opts)) names.push_back(d.name);
    return names;
  }

  std::string unavailable_reason(const options& opts) const override {
    std::string why;
    devices_of(opts, &why);
    return why;
  }

  std::span<const knob> knobs() const override { return tcp_knobs; }

  status check_options(const options& opts, std::string* why) const override {
    tcp_config config;
    return tcp_config::parse(opts, &config, why);
  }

  status open(const iface_params& params, std::unique_ptr<iface>& out) override {
    const std::vector<net_device> devices = devices_of(params.opts);
    if (devices.empty()) return status::no_elem;
    auto device = devices.begin();
    if (!params.device.empty()) {
      device = std::find_if(devices.begin(), devices.end(),
                            [&](const net_device& d) { return d.name == params.device; });
      if (device == devices.end()) return status::no_elem;
    }
    auto created = std::make_unique<tcp_iface>(params, *device);
    if (created->open_status() != status::ok) return created->open_status();
    out = std::move(created);
    return status::ok;
  }

  status open_cm(const cm_params& params, std::unique_ptr<cm>& out) override {
    return open_tcp_cm(params, out);
  }
};

}  // namespace

component& tcp_component() {
  static tcp_component_impl instance;
  return instance;
}

}  // namespace comm::tl::tcp
