// The single backend: a process on its own, rank 0 of 1. A fence makes its committed puts
// readable, as it would in a job of one.
#include "bootstrap_impl.hpp"

namespace comm::detail {

namespace {

/// Rank 0 of a job of one.
class single_bootstrap final : public stored_bootstrap {
public:
  single_bootstrap() : stored_bootstrap(0, 1) {}

  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  std::string_view backend_name() const noexcept override { return "single"; }

  status fence(int) override {
    std::string why;
    for (bootstrap_record& record : store_.take_committed()) {
      if (const status st = store_.publish(std::move(record), &why); st != status::ok) {
        return fail(st, why);
      }
    }
    return status::ok;
  }
};

}  // namespace

std::unique_ptr<bootstrap> make_single_bootstrap() { return std::make_unique<single_bootstrap>(); }

}  // namespace comm::detail
