// The one-process cluster: nothing to exchange, the local minimum is the global one. Also the
// cluster parameters' environment variables.
#include <comm/log.hpp>
#include <comm/sim/cluster.hpp>

#include <cstdlib>

namespace comm::sim {
namespace {

/// A job of one process.
class local_cluster final : public cluster {
public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string transports() const override { return "local"; }

  status exchange(const round_input& in, event_sink&, round_outcome* out, std::string*) override {
    out->global_min = in.local_min;
    out->committed = in.committed;
    return status::ok;
  }

  status reduce(const run_counters& mine, run_counters* all, std::string*) override {
    *all = mine;
    return status::ok;
  }

  void abort(std::string_view) override {}
};

}  // namespace

std::unique_ptr<cluster> cluster::local() { return std::make_unique<local_cluster>(); }

int env_microseconds(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < 0 || value > 10000000) {
    COMM_LOG(warn, "sim", "%s=%s is not a number of microseconds (0 to 10^7); using %d", name, text,
             fallback);
    return fallback;
  }
  return static_cast<int>(value);
}

}  // namespace comm::sim
