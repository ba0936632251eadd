// Host topology from hwloc: the summary comm_info prints, and the placement of a worker's
// resources near the cores it was given (UCX's cpu_mask): NUMA nodes for its memory, network
// devices by distance.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace comm::detail {

/// One paragraph describing the machine: packages, NUMA nodes, cores, PUs, caches.
std::string topology_summary();

/// How far a network device is from a set of cores, nearest first.
enum class device_distance : unsigned {
  local = 0,         ///< the device hangs off a NUMA node of those cores
  same_package = 1,  ///< another NUMA node of a package holding those cores
  remote = 2,        ///< another package
  unknown = 3,       ///< hwloc does not know the device (lo, veth, tun) or no cores were given
};

/// Name of a device_distance, for logs and comm_info.
const char* to_string(device_distance d);

/// The host's hardware topology (hwloc), with I/O devices, loaded once. Placement questions take
/// the cores the caller was given (OS indices, as in worker_params::cpus); an empty list, or one
/// that names no core of the topology, asks for no placement.
class topology {
public:
  /// This machine's topology, loaded on first use and shared. hwloc honours HWLOC_XMLFILE, so a
  /// synthetic machine can stand in for this one (tests, comm_info). Null when hwloc fails.
  static std::shared_ptr<const topology> machine();
  /// The topology an hwloc XML file describes; null with `why` set when it does not load.
  static std::unique_ptr<topology> from_xml(const std::string& path, std::string* why);

  ~topology();
  topology(const topology&) = delete;
  topology& operator=(const topology&) = delete;

  /// Packages, NUMA nodes, cores, PUs and caches on one line.
  std::string summary() const;
  /// OS indices of the NUMA nodes whose memory is local to `cpus`, ascending; empty when `cpus`
  /// is empty or names no core here.
  std::vector<unsigned> numa_nodes_of(std::span<const int> cpus) const;
  /// OS indices of the NUMA nodes nearest network device `name` (e.g. "eth0", "ib0", or a verbs
  /// port "mlx5_0:1"); empty when hwloc does not know it.
  std::vector<unsigned> numa_nodes_of_device(const std::string& name) const;
  /// How far network device `name` is from `cpus`.
  device_distance distance(const std::string& name, std::span<const int> cpus) const;
  /// `devices` ordered nearest to `cpus` first; equals keep their order.
  std::vector<std::string> by_locality(std::vector<std::string> devices,
                                       std::span<const int> cpus) const;

private:
  struct state;
  explicit topology(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace comm::detail
