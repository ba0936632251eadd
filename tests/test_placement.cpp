// Tests of the placement of a worker's resources and of lane choice (libcomm/src/placement.hpp):
// the logic against synthetic machines (tests/topologies/, see test_topology.cpp) and synthetic
// transport attributes, then the real path on this machine: memory bound to the NUMA node of the
// given cores, no thread pinned, the chosen lane and its reason in the worker's info.
#define BOOST_TEST_MODULE placement
#include <boost/test/unit_test.hpp>

#include "../transports/base/membind.hpp"
#include "test_util.hpp"
#include "placement.hpp"
#include "worker_impl.hpp"

#include <comm/context.hpp>
#include <comm/memory.hpp>
#include <comm/transport/shared_heap.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace comm::detail {
std::ostream& operator<<(std::ostream& out, device_distance d) { return out << to_string(d); }
}  // namespace comm::detail

using namespace comm;
using comm::detail::device_distance;
using comm::detail::lane_candidate;
using comm::detail::topology;

namespace {

std::shared_ptr<const topology> load(const char* name) {
  std::string why;
  auto topo = topology::from_xml(std::string(COMM_TESTS_SOURCE_DIR) + "/topologies/" + name, &why);
  BOOST_TEST_REQUIRE(topo != nullptr, why);
  return std::shared_ptr<const topology>(std::move(topo));
}

using nodes = std::vector<unsigned>;
using names = std::vector<std::string>;

/// A candidate with these attributes; positions default to 0.
lane_candidate lane(const char* transport, const char* device, double latency_ns,
                    double bandwidth, unsigned priority,
                    device_distance distance = device_distance::unknown, size_t iface = 0,
                    size_t peer = 0) {
  return {transport, device, latency_ns, bandwidth, priority, distance, iface, peer};
}

/// "transport/device" of each candidate, in order.
names order_of(const std::vector<lane_candidate>& ranked) {
  names out;
  for (const auto& c : ranked) out.push_back(c.transport + "/" + c.device);
  return out;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Page-aligned anonymous shared memory of `pages` pages, unmapped at scope exit.
struct shared_pages {
  explicit shared_pages(size_t pages) : length(pages * sysconf(_SC_PAGESIZE)) {
    base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    BOOST_TEST_REQUIRE(base != MAP_FAILED);
  }
  ~shared_pages() { munmap(base, length); }
  size_t length;
  void* base;
};

tl::component& component_named(const char* name) {
  for (tl::component* c : tl::all_components())
    if (c->name() == name) return *c;
  throw std::runtime_error(std::string("no component ") + name);
}

}  // namespace

// -- placement on synthetic machines -------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(synthetic_machines)

BOOST_AUTO_TEST_CASE(cpus_map_to_the_numa_nodes_their_memory_goes_to) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(detail::place_worker(topo, {2, 3}).numa_nodes == nodes{1});
  BOOST_TEST(detail::place_worker(topo, {1, 6}).numa_nodes == (nodes{0, 3}));
  BOOST_TEST(detail::place_worker(topo, {}).numa_nodes.empty());
  BOOST_TEST(detail::place_worker(topo, {99}).numa_nodes.empty());
  BOOST_TEST(detail::place_worker(nullptr, {0}).numa_nodes.empty());
  BOOST_TEST(detail::place_worker(topo, {1, 6}).describe() ==
             "placement: cpus 1,6 -> NUMA nodes 0,3");
  BOOST_TEST(detail::place_worker(topo, {}).describe() == "placement: none (no cpus given)");
  BOOST_TEST(contains(detail::place_worker(topo, {99}).describe(), "no core of this machine"));
  BOOST_TEST(contains(detail::place_worker(nullptr, {0}).describe(), "no topology"));
}

BOOST_AUTO_TEST_CASE(devices_nearest_the_cpus_come_first_once_each) {
  auto topo = load("two_packages_four_numa.xml");
  const names offered{"lo", "eth0", "eth1", "eth0", "ib0"};  // eth0 twice: IPv4 and IPv6
  BOOST_TEST(detail::place_worker(topo, {4}).order_devices(offered) ==
                 (names{"eth1", "eth0", "ib0", "lo"}),
             boost::test_tools::per_element());
  BOOST_TEST(detail::place_worker(topo, {2}).order_devices(offered) ==
                 (names{"ib0", "eth0", "eth1", "lo"}),
             boost::test_tools::per_element());
  BOOST_TEST(detail::place_worker(topo, {}).order_devices(offered) ==
                 (names{"lo", "eth0", "eth1", "ib0"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(verbs_ports_are_ordered_by_their_device) {
  auto topo = load("one_package_two_numa_roce.xml");
  const names ports{"mlx5_0:1", "eth0", "eth2"};
  BOOST_TEST(detail::place_worker(topo, {3}).order_devices(ports) ==
                 (names{"mlx5_0:1", "eth2", "eth0"}),
             boost::test_tools::per_element());
  BOOST_TEST(detail::place_worker(topo, {0}).order_devices(ports) ==
                 (names{"eth0", "mlx5_0:1", "eth2"}),
             boost::test_tools::per_element());
  BOOST_TEST(detail::place_worker(topo, {3}).distance("mlx5_0:1") == device_distance::local);
}

BOOST_AUTO_TEST_CASE(of_two_equal_network_devices_the_local_one_carries_the_lane) {
  auto topo = load("two_packages_four_numa.xml");
  for (int cpu : {0, 5}) {
    const auto place = detail::place_worker(topo, {cpu});
    // The worker opens its devices in this order; each reaches the peer's one entry.
    const names devices = place.order_devices({"eth0", "eth1"});
    std::vector<lane_candidate> candidates;
    for (size_t i = 0; i < devices.size(); ++i) {
      candidates.push_back(lane("tcp", devices[i].c_str(), 10'000, 2e9, 5,
                                place.distance(devices[i]), i, 0));
    }
    std::swap(candidates[0], candidates[1]);  // the ranking, not the input order, decides
    detail::rank_lanes(candidates);
    BOOST_TEST(candidates[0].device == (cpu == 0 ? "eth0" : "eth1"));
    BOOST_TEST(std::string(detail::lane_decider(candidates[0], candidates[1])) == "nearer device");
  }
}

BOOST_AUTO_TEST_SUITE_END()

// -- lane choice from transport attributes -------------------------------------------------------

BOOST_AUTO_TEST_SUITE(lane_choice)

BOOST_AUTO_TEST_CASE(the_cheapest_transport_wins_whatever_its_registration_order) {
  // Registration order puts tcp before verbs; the attributes put verbs first.
  std::vector<lane_candidate> c{
      lane("tcp", "eth0", 10'000, 2e9, 5, device_distance::local, 0),
      lane("verbs", "mlx5_0:1", 800, 12.5e9, 1, device_distance::remote, 1),
      lane("shm", "memory", 100, 10e9, 10, device_distance::unknown, 2),
  };
  detail::rank_lanes(c);
  BOOST_TEST(order_of(c) == (names{"shm/memory", "verbs/mlx5_0:1", "tcp/eth0"}),
             boost::test_tools::per_element());
  BOOST_TEST(detail::lane_cost_ns(c[0]) == 100 + 8192 / 10.0, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(std::string(detail::lane_decider(c[0], c[1])) == "lower cost");
}

BOOST_AUTO_TEST_CASE(bandwidth_counts_for_the_reference_message) {
  // Same latency: the faster link wins; a link without a bandwidth counts as a slow one.
  std::vector<lane_candidate> c{
      lane("x", "slow", 1000, 1e9, 0, device_distance::unknown, 0),
      lane("x", "none", 1000, 0, 9, device_distance::unknown, 1),
      lane("x", "fast", 1000, 25e9, 0, device_distance::unknown, 2),
  };
  detail::rank_lanes(c);
  BOOST_TEST(order_of(c) == (names{"x/fast", "x/slow", "x/none"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(equal_costs_go_to_priority_then_distance_then_order) {
  auto same = [](const char* dev, unsigned prio, device_distance d, size_t iface, size_t peer) {
    return lane("tcp", dev, 10'000, 2e9, prio, d, iface, peer);
  };
  std::vector<lane_candidate> c{
      same("d", 5, device_distance::unknown, 0, 1),
      same("e", 5, device_distance::unknown, 0, 0),
      same("c", 5, device_distance::unknown, 1, 0),
      same("b", 5, device_distance::same_package, 3, 0),
      same("a", 6, device_distance::remote, 4, 0),
  };
  detail::rank_lanes(c);
  BOOST_TEST(order_of(c) == (names{"tcp/a", "tcp/b", "tcp/e", "tcp/d", "tcp/c"}),
             boost::test_tools::per_element());
  BOOST_TEST(std::string(detail::lane_decider(c[0], c[1])) == "higher priority");
  BOOST_TEST(std::string(detail::lane_decider(c[1], c[2])) == "nearer device");
  BOOST_TEST(std::string(detail::lane_decider(c[2], c[3])) == "the peer's order");
  BOOST_TEST(std::string(detail::lane_decider(c[3], c[4])) == "transport and locality order");
  // Deterministic: every input order ranks the same.
  for (size_t rotation = 1; rotation < c.size(); ++rotation) {
    std::vector<lane_candidate> other(c.begin() + rotation, c.end());
    other.insert(other.end(), c.begin(), c.begin() + rotation);
    detail::rank_lanes(other);
    BOOST_TEST(order_of(other) == order_of(c), boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(the_reason_names_the_lane_and_what_beat_the_next) {
  std::vector<lane_candidate> c{
      lane("shm", "memory", 100, 10e9, 10, device_distance::unknown, 1, 1),
      lane("tcp", "eth0", 10'000, 2e9, 5, device_distance::local, 2, 2),
      lane("tcp", "lo", 10'000, 2e9, 5, device_distance::unknown, 3, 3),
  };
  const std::string first = detail::lane_reason(c, 0);
  BOOST_TEST(contains(first, "lane shm/memory (peer entry 1): cost 919 ns"), first);
  BOOST_TEST(contains(first, "over tcp/eth0 (peer entry 2, cost 14096 ns): lower cost"), first);
  BOOST_TEST(contains(first, "of 3 candidates"), first);
  const std::string fallback = detail::lane_reason(c, 1);
  BOOST_TEST(contains(fallback, "1 better candidate(s) could not be created"), fallback);
  BOOST_TEST(contains(fallback, "over tcp/lo"), fallback);
  BOOST_TEST(contains(fallback, "nearer device"), fallback);
  const std::string only = detail::lane_reason({c[2]}, 0);
  BOOST_TEST(contains(only, "the only candidate"), only);
}

BOOST_AUTO_TEST_SUITE_END()

// -- the real path on this machine ---------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(this_machine)

BOOST_AUTO_TEST_CASE(memory_binds_to_node_0_and_the_kernel_says_so) {
  shared_pages pages(4);
  const tl::placement_outcome out = tl::bind_to_numa_nodes(pages.base, pages.length, nodes{0});
  BOOST_TEST(out.st == status::ok, out.text);
  BOOST_TEST(out.bound, out.text);
  BOOST_TEST(out.text == "bound to NUMA nodes 0");
  BOOST_TEST(tl::numa_policy_nodes(pages.base) == nodes{0});
  static_cast<char*>(pages.base)[0] = 1;  // faulted in under the policy
}

BOOST_AUTO_TEST_CASE(no_nodes_asks_for_nothing) {
  shared_pages pages(1);
  const tl::placement_outcome out = tl::bind_to_numa_nodes(pages.base, pages.length, nodes{});
  BOOST_TEST(out.st == status::ok);
  BOOST_TEST(!out.bound);
  BOOST_TEST(tl::numa_policy_nodes(pages.base).empty());
}

BOOST_AUTO_TEST_CASE(a_node_the_machine_lacks_is_a_reported_failure) {
  shared_pages pages(1);
  const tl::placement_outcome absent =
      tl::bind_to_numa_nodes(pages.base, pages.length, nodes{900});
  BOOST_TEST(absent.st != status::ok);
  BOOST_TEST(!absent.bound);
  BOOST_TEST(contains(absent.text, "placement on NUMA nodes 900 failed"), absent.text);
  const tl::placement_outcome huge =
      tl::bind_to_numa_nodes(pages.base, pages.length, nodes{1u << 20});
  BOOST_TEST(huge.st == status::invalid_param);
  BOOST_TEST(contains(huge.text, "out of range"), huge.text);
}

BOOST_AUTO_TEST_CASE(an_shm_interface_places_its_segment_and_says_where) {
  tl::iface_params params;
  params.numa_nodes = {0};
  std::unique_ptr<tl::iface> placed;
  BOOST_TEST_REQUIRE(component_named("shm").open(params, placed) == status::ok);
  BOOST_TEST(contains(placed->info(), "bound to NUMA nodes 0"), placed->info());

  params.numa_nodes = {900};  // a failed placement is shown; the interface still opens
  std::unique_ptr<tl::iface> unplaced;
  BOOST_TEST_REQUIRE(component_named("shm").open(params, unplaced) == status::ok);
  BOOST_TEST(contains(unplaced->info(), "placement on NUMA nodes 900 failed"), unplaced->info());
}

/// Writes and reads back every page of `block` (`length` bytes): the memory is usable.
bool usable(void* block, size_t length) {
  auto* bytes = static_cast<volatile uint8_t*>(block);
  for (size_t i = 0; i < length; i += 4096) bytes[i] = static_cast<uint8_t>(i >> 12 | 1);
  for (size_t i = 0; i < length; i += 4096) {
    if (bytes[i] != static_cast<uint8_t>(i >> 12 | 1)) return false;
  }
  return true;
}

BOOST_AUTO_TEST_CASE(shared_heap_blocks_go_to_the_nodes_asked_for) {
  const tl::shared_heap_stats before = tl::shared_heap_snapshot();
  // A slab-sized block and a block with a segment of its own, on node 0 and unplaced.
  for (size_t length : {size_t{100}, size_t{3} << 20}) {
    BOOST_TEST_CONTEXT("length " << length) {
      void* placed = tl::shared_alloc(length, nodes{0});
      void* unplaced = tl::shared_alloc(length, nodes{});
      void* plain = tl::shared_alloc(length);
      BOOST_TEST_REQUIRE(placed != nullptr);
      BOOST_TEST_REQUIRE(unplaced != nullptr);
      BOOST_TEST_REQUIRE(plain != nullptr);
      BOOST_TEST(tl::numa_policy_nodes(placed) == nodes{0});
      BOOST_TEST(tl::numa_policy_nodes(unplaced).empty());  // never in a bound segment
      BOOST_TEST(tl::numa_policy_nodes(plain).empty());
      BOOST_TEST(usable(placed, length));
      BOOST_TEST(usable(unplaced, length));
      for (void* block : {placed, unplaced, plain}) tl::shared_free(block);
    }
  }
  const tl::shared_heap_stats after = tl::shared_heap_snapshot();
  BOOST_TEST(after.bound_segments > before.bound_segments);
  BOOST_TEST(after.placement_failures == before.placement_failures);
  BOOST_TEST(after.fallbacks == before.fallbacks);
}

BOOST_AUTO_TEST_CASE(a_freed_large_block_is_reused_only_for_its_own_nodes) {
  const size_t length = size_t{2} << 20;
  void* unplaced = tl::shared_alloc(length);
  BOOST_TEST_REQUIRE(unplaced != nullptr);
  tl::shared_free(unplaced);  // cached for reuse by the unplaced
  void* placed = tl::shared_alloc(length, nodes{0});
  BOOST_TEST_REQUIRE(placed != nullptr);
  BOOST_TEST(tl::numa_policy_nodes(placed) == nodes{0});
  void* again = tl::shared_alloc(length);
  BOOST_TEST(tl::numa_policy_nodes(again).empty());
  tl::shared_free(placed);
  void* placed_again = tl::shared_alloc(length, nodes{0});  // the cached bound segment
  BOOST_TEST(placed_again == placed);
  BOOST_TEST(tl::numa_policy_nodes(placed_again) == nodes{0});
  tl::shared_free(again);
  tl::shared_free(placed_again);
}

BOOST_AUTO_TEST_CASE(a_node_the_machine_lacks_leaves_a_usable_unbound_block) {
  const tl::shared_heap_stats before = tl::shared_heap_snapshot();
  void* block = tl::shared_alloc(1 << 20, nodes{900});
  BOOST_TEST_REQUIRE(block != nullptr);
  BOOST_TEST(tl::numa_policy_nodes(block).empty());
  BOOST_TEST(usable(block, 1 << 20));
  const tl::shared_heap_stats after = tl::shared_heap_snapshot();
  BOOST_TEST(after.placement_failures == before.placement_failures + 1);
  BOOST_TEST(after.fallbacks == before.fallbacks);  // still a shared segment
  tl::shared_free(block);
}

BOOST_AUTO_TEST_CASE(a_worker_allocates_on_the_nodes_of_its_cpus) {
  config cfg = config::from_environment();
  cfg.transports = {"shm"};
  context ctx(cfg);
  worker_params wp;
  wp.cpus = {0};
  auto placed = worker::create(ctx, wp).value();
  auto unplaced = worker::create(ctx, {}).value();
  for (size_t length : {size_t{64}, size_t{1} << 20}) {
    void* near = placed->mem_alloc(length);
    void* anywhere = unplaced->mem_alloc(length);
    BOOST_TEST_REQUIRE(near != nullptr);
    BOOST_TEST_REQUIRE(anywhere != nullptr);
    BOOST_TEST(tl::numa_policy_nodes(near) == nodes{0});
    BOOST_TEST(tl::numa_policy_nodes(anywhere).empty());
    mem_free(near);
    mem_free(anywhere);
  }
}

BOOST_AUTO_TEST_CASE(a_worker_placed_on_a_synthetic_machine_allocates_on_its_nodes) {
  // The worker's placement as it would be on a two-node machine (cores 0-1 on node 0, 2-3 on
  // node 1): node 0 exists here and binds; node 1 does not, and the block is still made.
  const auto topo = load("one_package_two_numa_roce.xml");
  config cfg = config::from_environment();
  cfg.transports = {"shm"};
  context ctx(cfg);
  auto w = worker::create(ctx, {}).value();
  detail::impl(*w).placement = detail::place_worker(topo, {1});
  void* near = w->mem_alloc(8192);
  BOOST_TEST_REQUIRE(near != nullptr);
  BOOST_TEST(tl::numa_policy_nodes(near) == nodes{0});
  mem_free(near);

  detail::impl(*w).placement = detail::place_worker(topo, {2, 3});
  BOOST_TEST(detail::impl(*w).placement.numa_nodes == nodes{1});
  const uint64_t failures = tl::shared_heap_snapshot().placement_failures;
  void* far = w->mem_alloc(8192);
  BOOST_TEST_REQUIRE(far != nullptr);
  BOOST_TEST(usable(far, 8192));
  if (tl::single_numa_node()) {
    BOOST_TEST(tl::numa_policy_nodes(far).empty());
    BOOST_TEST(tl::shared_heap_snapshot().placement_failures == failures + 1);
  } else {
    BOOST_TEST(tl::numa_policy_nodes(far) == nodes{1});
  }
  mem_free(far);
}

BOOST_AUTO_TEST_CASE(cpus_place_a_worker_without_pinning_the_caller) {
  cpu_set_t before, after;
  BOOST_TEST_REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  config cfg = config::from_environment();
  cfg.transports = {"shm"};
  context ctx(cfg);
  worker_params wp;
  wp.cpus = {0};
  auto w = worker::create(ctx, wp).value();
  BOOST_TEST_REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  BOOST_TEST(CPU_EQUAL(&before, &after));
  const std::string info = w->info();
  BOOST_TEST(contains(info, "placement: cpus 0 -> NUMA nodes 0"), info);
  BOOST_TEST(contains(info, "iface shm/memory"), info);
  BOOST_TEST(contains(info, "bound to NUMA nodes 0"), info);

  auto unplaced = worker::create(ctx, {}).value();
  BOOST_TEST(contains(unplaced->info(), "placement: none (no cpus given)"), unplaced->info());
  BOOST_TEST(contains(unplaced->info(), "not placed (no NUMA nodes given)"), unplaced->info());
}

BOOST_AUTO_TEST_CASE(every_device_of_a_transport_is_a_candidate_and_info_shows_the_choice) {
  config cfg = config::from_environment();
  cfg.transports = {"tcp", "shm"};  // the listing order must not matter
  context ctx(cfg);
  worker_params wa, wb;
  wa.name = "a";
  wb.name = "b";
  auto a = worker::create(ctx, wa).value();
  auto b = worker::create(ctx, wb).value();
  const auto tcp_devices = component_named("tcp").devices(cfg.transport_options);
  size_t tcp_ifaces = 0;
  for (const auto& li : detail::impl(*a).ifaces) tcp_ifaces += li.component->name() == "tcp";
  std::vector<std::string> unique;
  for (const auto& d : tcp_devices)
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  BOOST_TEST(tcp_ifaces == unique.size());

  endpoint* ab = nullptr;
  BOOST_TEST_REQUIRE(a->connect(b->address(), &ab) == status::ok);
  BOOST_TEST(ab->transport() == "shm");
  const std::string info = ab->info();
  BOOST_TEST_MESSAGE(info);
  BOOST_TEST(contains(info, "lane shm/memory"), info);
  BOOST_TEST(contains(info, "over tcp/" + unique.front()), info);
  BOOST_TEST(contains(info, "lower cost"), info);
  BOOST_TEST(contains(a->info(), "lane shm/memory"));

  // Over tcp alone, the lane is a tcp device, chosen among every pair of devices.
  config tcp_only = cfg;
  tcp_only.transports = {"tcp"};
  context tcp_ctx(tcp_only);
  auto c = worker::create(tcp_ctx, wa).value();
  auto d = worker::create(tcp_ctx, wb).value();
  endpoint* cd = nullptr;
  BOOST_TEST_REQUIRE(c->connect(d->address(), &cd) == status::ok);
  BOOST_TEST(cd->transport() == "tcp");
  BOOST_TEST_MESSAGE(cd->info());
  BOOST_TEST(contains(cd->info(), "lane tcp/" + unique.front() + " (peer entry 0)"), cd->info());
  if (unique.size() > 1) {
    BOOST_TEST(contains(cd->info(), "of " + std::to_string(unique.size() * unique.size()) +
                                        " candidates"),
               cd->info());
  }
}

BOOST_AUTO_TEST_SUITE_END()

/// `address` (a packed WorkerAddress) with its first transport entry repeated `copies` times.
std::vector<uint8_t> with_entries(const std::vector<uint8_t>& address, size_t copies) {
  auto words = kj::heapArray<capnp::word>(address.size() / 8);
  std::memcpy(words.begin(), address.data(), address.size());
  capnp::FlatArrayMessageReader reader(words);
  auto in = reader.getRoot<wire::schema::WorkerAddress>();
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<wire::schema::WorkerAddress>();
  out.setUid(in.getUid());
  out.setName(in.getName());
  out.setClientId(in.getClientId());
  auto list = out.initTransports(static_cast<unsigned>(copies));
  for (unsigned i = 0; i < copies; ++i) list.setWithCaveats(i, in.getTransports()[0]);
  const auto packed = capnp::messageToFlatArray(message);
  const auto bytes = packed.asBytes();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

BOOST_AUTO_TEST_CASE(an_address_with_more_entries_than_an_address_holds_is_refused) {
  config cfg = config::from_environment();
  cfg.transports = {"shm"};
  context ctx(cfg);
  auto a = worker::create(ctx).value();
  auto b = worker::create(ctx).value();
  const std::vector<uint8_t> most = with_entries(b->address(), detail::max_address_entries);
  const std::vector<uint8_t> too_many = with_entries(b->address(), detail::max_address_entries + 1);
  worker_address_attr attr;
  BOOST_TEST(worker::query_address(most.data(), most.size(), &attr) == status::ok);
  BOOST_TEST(attr.transports == names{"shm"});
  BOOST_TEST(worker::query_address(too_many.data(), too_many.size(), &attr) == status::invalid_addr);
  endpoint* ep = nullptr;
  BOOST_TEST(a->connect(too_many, &ep) == status::invalid_addr);
  BOOST_TEST_REQUIRE(a->connect(most, &ep) == status::ok);
  BOOST_TEST(contains(ep->info(), "of " + std::to_string(detail::max_address_entries) +
                                      " candidates"),
             ep->info());
}
