// The one-process cluster: nothing to exchange, the local minimum is the global one.
#include <comm/sim/cluster.hpp>

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

}  // namespace comm::sim
