// Tests of comm::detail::topology, the placement logic behind worker_params::cpus, on synthetic
// machines loaded from hwloc XML (tests/topologies/): this VM has one NUMA node and no network
// device that hwloc places, so only a described machine exercises the choices.
//
// two_packages_four_numa.xml: packages 0 and 1, each with two L3 caches, each cache with its own
// NUMA node (P#0..P#3) and two cores (PUs 0-1 on node 0, 2-3 on node 1, 4-5 on node 2, 6-7 on
// node 3); eth0 hangs off node 0, ib0 off node 1, eth1 off node 2.
#define BOOST_TEST_MODULE topology
#include <boost/test/unit_test.hpp>

#include "topology.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

namespace comm::detail {
std::ostream& operator<<(std::ostream& out, device_distance d) { return out << to_string(d); }
}  // namespace comm::detail

using comm::detail::device_distance;
using comm::detail::topology;

namespace {

std::unique_ptr<topology> load(const char* name) {
  std::string why;
  auto topo = topology::from_xml(std::string(COMM_TESTS_SOURCE_DIR) + "/topologies/" + name, &why);
  BOOST_TEST_REQUIRE(topo != nullptr, why);
  return topo;
}

using nodes = std::vector<unsigned>;
using cpus = std::vector<int>;

}  // namespace

BOOST_AUTO_TEST_CASE(the_synthetic_machine_loads_as_described) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(topo->summary().find("packages=2 numa_nodes=4 cores=8 pus=8") != std::string::npos,
             topo->summary());
}

BOOST_AUTO_TEST_CASE(numa_nodes_of_cores) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(topo->numa_nodes_of(cpus{0}) == nodes{0});
  BOOST_TEST(topo->numa_nodes_of(cpus{1, 0}) == nodes{0});
  BOOST_TEST(topo->numa_nodes_of(cpus{3}) == nodes{1});
  BOOST_TEST(topo->numa_nodes_of(cpus{2, 5}) == (nodes{1, 2}));
  BOOST_TEST(topo->numa_nodes_of(cpus{7, 6}) == nodes{3});
}

BOOST_AUTO_TEST_CASE(no_cores_or_unknown_cores_ask_for_no_placement) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(topo->numa_nodes_of(cpus{}).empty());
  BOOST_TEST(topo->numa_nodes_of(cpus{64, -1}).empty());
  BOOST_TEST(topo->numa_nodes_of(cpus{64, 6}) == nodes{3});  // the known core counts
}

/// Peak resident memory of this process so far, in KiB.
long peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

BOOST_AUTO_TEST_CASE(a_huge_core_index_is_answered_without_a_huge_cpuset) {
  auto topo = load("two_packages_four_numa.xml");
  const long before = peak_rss_kib();
  // A bitmap holding bit INT_MAX would take 256 MiB (and be zeroed, so resident).
  BOOST_TEST(topo->numa_nodes_of(cpus{INT_MAX}).empty());
  BOOST_TEST(topo->distance("eth0", cpus{INT_MAX, 0}) == device_distance::local);
  BOOST_TEST(peak_rss_kib() - before < 64 * 1024);
}

BOOST_AUTO_TEST_CASE(network_devices_are_placed_at_their_numa_node) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(topo->numa_nodes_of_device("eth0") == nodes{0});
  BOOST_TEST(topo->numa_nodes_of_device("ib0") == nodes{1});
  BOOST_TEST(topo->numa_nodes_of_device("eth1") == nodes{2});
  BOOST_TEST(topo->numa_nodes_of_device("lo").empty());
  BOOST_TEST(topo->numa_nodes_of_device("").empty());
}

BOOST_AUTO_TEST_CASE(device_distance_from_cores) {
  auto topo = load("two_packages_four_numa.xml");
  BOOST_TEST(topo->distance("eth0", cpus{0, 1}) == device_distance::local);
  BOOST_TEST(topo->distance("ib0", cpus{0, 1}) == device_distance::same_package);
  BOOST_TEST(topo->distance("eth1", cpus{0, 1}) == device_distance::remote);
  BOOST_TEST(topo->distance("eth1", cpus{4}) == device_distance::local);
  BOOST_TEST(topo->distance("eth1", cpus{7}) == device_distance::same_package);
  BOOST_TEST(topo->distance("eth0", cpus{7}) == device_distance::remote);
  BOOST_TEST(topo->distance("eth0", cpus{0, 7}) == device_distance::local);
  BOOST_TEST(topo->distance("lo", cpus{0}) == device_distance::unknown);
  BOOST_TEST(topo->distance("eth0", cpus{}) == device_distance::unknown);
  BOOST_TEST(std::string(to_string(device_distance::same_package)) == "same package");
}

BOOST_AUTO_TEST_CASE(devices_ordered_nearest_first_keeping_the_order_of_equals) {
  auto topo = load("two_packages_four_numa.xml");
  const std::vector<std::string> all{"lo", "eth1", "ib0", "eth0", "veth7"};
  BOOST_TEST(topo->by_locality(all, cpus{0}) ==
                 (std::vector<std::string>{"eth0", "ib0", "eth1", "lo", "veth7"}),
             boost::test_tools::per_element());
  BOOST_TEST(topo->by_locality(all, cpus{5}) ==
                 (std::vector<std::string>{"eth1", "ib0", "eth0", "lo", "veth7"}),
             boost::test_tools::per_element());
  BOOST_TEST(topo->by_locality(all, cpus{}) == all, boost::test_tools::per_element());
}

// one_package_two_numa_roce.xml: one package, NUMA node 0 (cores 0-1) with eth0, node 1 (cores
// 2-3) with a ConnectX card: its Ethernet port eth2 and its verbs device mlx5_0.
BOOST_AUTO_TEST_CASE(a_verbs_port_is_placed_as_its_device) {
  auto topo = load("one_package_two_numa_roce.xml");
  BOOST_TEST(topo->summary().find("packages=1 numa_nodes=2 cores=4") != std::string::npos,
             topo->summary());
  BOOST_TEST(topo->numa_nodes_of_device("mlx5_0") == nodes{1});
  BOOST_TEST(topo->numa_nodes_of_device("mlx5_0:1") == nodes{1});
  BOOST_TEST(topo->numa_nodes_of_device("mlx5_9:1").empty());
  BOOST_TEST(topo->distance("mlx5_0:1", cpus{2}) == device_distance::local);
  BOOST_TEST(topo->distance("mlx5_0:1", cpus{0}) == device_distance::same_package);
  BOOST_TEST(topo->distance("eth0", cpus{0}) == device_distance::local);
}

BOOST_AUTO_TEST_CASE(a_missing_or_broken_file_is_an_error_not_a_machine) {
  std::string why;
  BOOST_TEST(topology::from_xml("/nonexistent/topology.xml", &why) == nullptr);
  BOOST_TEST(why.find("/nonexistent/topology.xml") != std::string::npos, why);
  char path[] = "/tmp/comm_topology_XXXXXX";
  const int fd = mkstemp(path);
  BOOST_TEST_REQUIRE(fd >= 0);
  const char garbage[] = "<?xml version=\"1.0\"?><topology version=\"2.0\"><object";
  BOOST_TEST(write(fd, garbage, sizeof garbage - 1) == static_cast<ssize_t>(sizeof garbage - 1));
  close(fd);
  why.clear();
  BOOST_TEST(topology::from_xml(path, &why) == nullptr);
  BOOST_TEST(!why.empty());
  unlink(path);
}

BOOST_AUTO_TEST_CASE(this_machine_loads_and_places_its_own_cores) {
  auto topo = topology::machine();
  BOOST_TEST_REQUIRE(topo != nullptr);
  BOOST_TEST(topo->summary().find("pus=") != std::string::npos);
  BOOST_TEST(!topo->numa_nodes_of(cpus{0}).empty());  // core 0 exists everywhere
}
