#include "shm/shm_config.hpp"
#include "shm/shm_iface.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace comm::tl::shm {
namespace {

/// Empty when memfd segments can be made here, else why not.
std::string probe() {
  const int fd = ::memfd_create("comm-shm-probe", MFD_CLOEXEC);
  if (fd < 0) return std::string("memfd_create: ") + std::strerror(errno);
  ::close(fd);
  return {};
}

class shm_component_impl final : public component {
public:
  std::string_view name() const override { return "shm"; }

  std::vector<std::string> devices(const options& opts) const override {
    if (!unavailable_reason(opts).empty()) return {};
    return {"memory"};
  }

  std::string unavailable_reason(const options&) const override {
    static const std::string reason = probe();
    return reason;
  }

  std::span<const knob> knobs() const override { return shm_knobs; }

  status check_options(const options& opts, std::string* why) const override {
    shm_config config;
    return shm_config::parse(opts, &config, why);
  }

  status open(const iface_params& params, std::unique_ptr<iface>& out) override {
    if (!params.device.empty() && params.device != "memory") return status::no_elem;
    auto created = std::make_unique<shm_iface>(params);
    if (created->open_status() != status::ok) return created->open_status();
    out = std::move(created);
    return status::ok;
  }
};

}  // namespace

component& shm_component() {
  static shm_component_impl instance;
  return instance;
}

}  // namespace comm::tl::shm
