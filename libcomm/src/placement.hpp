// Placement of a worker's resources and the choice of its lanes, as UCX and MPI libraries do it:
// worker_params::cpus (UCX's cpu_mask) names the cores the worker is used from; its interfaces
// put their memory on the NUMA nodes of those cores, network devices are tried nearest first, and
// an endpoint's lane is the best candidate by what the transports report (iface_attr), with a
// deterministic tie-break. Pure logic over a topology, so synthetic machines (hwloc XML) test it.
#pragma once

#include "topology.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace comm::detail {

/// Where a worker's resources go, from its cpus and the machine's topology.
struct worker_placement {
  std::vector<int> cpus;                ///< worker_params::cpus as given
  std::vector<unsigned> numa_nodes;     ///< NUMA nodes local to cpus (empty: no placement)
  std::shared_ptr<const topology> topo; ///< the topology the answers come from (may be null)

  /// `devices` without repeats, nearest to cpus first (equals keep their order).
  std::vector<std::string> order_devices(const std::vector<std::string>& devices) const;
  /// How far `device` is from cpus (unknown without a topology).
  device_distance distance(const std::string& device) const;
  /// One line for worker info: the cores and the NUMA nodes they map to.
  std::string describe() const;
};

/// The placement of a worker given `cpus`, on `topo` (null: no topology, no placement).
worker_placement place_worker(std::shared_ptr<const topology> topo, std::vector<int> cpus);

/// One way to reach a peer: one of our interfaces, and one transport entry of the peer's address
/// that it reaches.
struct lane_candidate {
  std::string transport;                        ///< transport name ("shm")
  std::string device;                           ///< our device ("memory", "eth0")
  double latency_ns = 0;                        ///< iface_attr::latency_ns
  double bandwidth_bytes_per_s = 0;             ///< iface_attr::bandwidth_bytes_per_s
  unsigned priority = 0;                        ///< iface_attr::priority
  device_distance distance = device_distance::unknown;  ///< of our device from the cpus
  size_t iface_index = 0;                       ///< our interface's position in the worker
  size_t peer_index = 0;                        ///< the entry's position in the peer's address
};

/// Size of the message lanes are compared on: small enough that latency counts, large enough
/// that bandwidth does.
inline constexpr size_t lane_reference_bytes = 8192;

/// Estimated time to deliver lane_reference_bytes on `c`: latency plus transfer (ns).
double lane_cost_ns(const lane_candidate& c);

/// True when `a` is the better lane: lower cost, then higher priority, then a nearer device, then
/// our earlier interface (transport order, then device locality), then the peer's earlier entry
/// (the peer lists its nearest devices first). Candidates differ in the last two, so the order is
/// total and the choice deterministic.
bool better_lane(const lane_candidate& a, const lane_candidate& b);

/// Sorts `candidates` best first.
void rank_lanes(std::vector<lane_candidate>& candidates);

/// What decided between `winner` and `loser`: "lower cost", "higher priority", "nearer device",
/// "transport and locality order" or "the peer's order".
const char* lane_decider(const lane_candidate& winner, const lane_candidate& loser);

/// One line saying which lane was chosen and why, given the candidates ranked best first and the
/// one chosen (the first that could be created).
std::string lane_reason(const std::vector<lane_candidate>& ranked, size_t chosen);

}  // namespace comm::detail
