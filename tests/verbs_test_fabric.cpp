// Runs the registered verbs transport over the verbs test device (transports/verbs/testdev), a
// software stand-in for RDMA hardware, in the test program this file is linked into (every suite
// that runs per transport: tests/CMakeLists.txt). It installs a test fabric of two RoCE devices
// before any suite builds its datasets, points the registered verbs component at the test device's
// verbs table, marks what the suites must know of verbs (in-process only: the test device exists
// only inside this process, so suites that start other processes skip it; completions acknowledged
// by the peer's device; remote access errors that fail the connection), and checks that every test
// case leaves the device as it found it (no queue pair, memory region, CQ or rdmacm id left over).
// Nothing measured over it says anything about RDMA performance.
#include "transport_list.hpp"

#include "verbs/testdev/testdev.hpp"
#include "verbs/verbs_component.hpp"

#include <boost/test/tree/observer.hpp>
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace td = comm::verbs::testdev;
namespace utf = boost::unit_test;

/// Installs the fabric for the whole program and reports what it leaked at exit.
struct verbs_test_fabric {
  verbs_test_fabric() {
    // With the test device's model of tag-matching SRQs, so the transport's tag operations
    // (cap_tag_*) run too.
    td::install({td::with_tag_matching(td::roce_device("testdev0", "10.0.0.1")),
                 td::with_tag_matching(td::roce_device("testdev1", "10.0.0.2"))});
    comm::verbs::use_verbs_table(td::table());
    // RC sends, writes and reads complete when the peer's device acknowledges them.
    comm::test::mark_acknowledged_by_device("verbs");
    // A READ or WRITE with a bad key is refused by the peer's device and fails the queue pair.
    comm::test::mark_remote_errors_fail_connection("verbs");
    // A tagged rendezvous is on the receiver's tag-matching SRQ once sent: a cancel cannot
    // take it back.
    comm::test::mark_canceled_rendezvous_may_arrive("verbs");
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

/// Notes every test case after which the test device holds more objects than before the suites
/// started (each case destroys its workers, so their QPs, MRs, CQs and ids must be gone).
class leak_observer final : public utf::test_observer {
 public:
  explicit leak_observer(size_t baseline) : baseline_(baseline) {}

  void test_unit_finish(const utf::test_unit& unit, unsigned long) override {
    if (unit.p_type != utf::TUT_CASE) return;
    const size_t live = td::live_objects();
    if (live > baseline_) {
      leaks.push_back(unit.full_name() + " left " + std::to_string(live - baseline_) +
                      " objects on the verbs test device");
      baseline_ = live;  // report each leak once, at the case that made it
    }
  }

  std::vector<std::string> leaks;  ///< one line per leaking test case

 private:
  size_t baseline_;
};

/// Watches every test case of the module for objects left on the test device, and fails the
/// module (naming the cases) when any were.
struct verbs_leak_check {
  void setup() {
    observer = std::make_unique<leak_observer>(td::live_objects());
    utf::framework::register_observer(*observer);
  }
  void teardown() {
    utf::framework::deregister_observer(*observer);
    for (const std::string& leak : observer->leaks) BOOST_ERROR(leak);
    BOOST_TEST(observer->leaks.empty(), "test cases leaked objects on the verbs test device");
  }
  std::unique_ptr<leak_observer> observer;
};

BOOST_TEST_GLOBAL_FIXTURE(verbs_leak_check);

}  // namespace
