// Runs the registered verbs transport over the verbs test device (transports/verbs/testdev), a
// software stand-in for RDMA hardware, in the test program this file is linked into: it installs a
// test fabric of two RoCE devices before any suite builds its datasets, points the registered
// verbs component at the test device's verbs table, and marks verbs as in-process only (the test
// device exists only inside this process, so suites that start other processes skip it).
// Nothing measured over it says anything about RDMA performance.
#include "transport_list.hpp"

#include "verbs/testdev/testdev.hpp"
#include "verbs/verbs_component.hpp"

#include <cstdio>

namespace {

namespace td = comm::verbs::testdev;

/// Installs the fabric for the whole program and reports what it leaked at exit.
struct verbs_test_fabric {
  verbs_test_fabric() {
    td::install({td::roce_device("testdev0", "10.0.0.1"), td::roce_device("testdev1", "10.0.0.2")});
    comm::verbs::use_verbs_table(td::table());
    // RC sends, writes and reads complete when the peer's device acknowledges them.
    comm::test::mark_acknowledged_by_device("verbs");
    comm::test::mark_in_process_only(
        "verbs", "runs on the verbs test device, a software stand-in that exists only in this "
                 "process");
    std::fprintf(stderr, "verbs runs on the verbs test device (a software stand-in for RDMA "
                         "hardware, not an RDMA device)\n");
  }
  ~verbs_test_fabric() {
    const size_t leaked = td::uninstall();
    if (leaked != 0) {
      std::fprintf(stderr, "verbs test device: %zu objects not released at exit\n", leaked);
    }
  }
};

// Before the suites' default-priority constructors, which build the datasets from the registry.
__attribute__((init_priority(101))) verbs_test_fabric fabric;

}  // namespace
