#include "placement.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace comm::detail {
namespace {

/// Bandwidth assumed for a transport that reports none: low, so it never wins on a guess.
constexpr double unreported_bandwidth = 1e6;

template <typename T>
std::string joined(const std::vector<T>& values) {
  std::string text;
  for (const T& v : values) {
    if (!text.empty()) text += ',';
    text += std::to_string(v);
  }
  return text;
}

std::string lane_name(const lane_candidate& c) { return c.transport + '/' + c.device; }

std::string rounded_ns(double ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f ns", ns);
  return text;
}

}  // namespace

worker_placement place_worker(std::shared_ptr<const topology> topo, std::vector<int> cpus) {
  worker_placement p;
  p.cpus = std::move(cpus);
  p.topo = std::move(topo);
  if (p.topo != nullptr) p.numa_nodes = p.topo->numa_nodes_of(p.cpus);
  return p;
}

std::vector<std::string> worker_placement::order_devices(
    const std::vector<std::string>& devices) const {
  std::vector<std::string> unique;
  for (const std::string& d : devices) {
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  }
  return topo != nullptr ? topo->by_locality(std::move(unique), cpus) : unique;
}

device_distance worker_placement::distance(const std::string& device) const {
  return topo != nullptr ? topo->distance(device, cpus) : device_distance::unknown;
}

std::string worker_placement::describe() const {
  if (cpus.empty()) return "placement: none (no cpus given)";
  std::string text = "placement: cpus " + joined(cpus) + " -> ";
  if (topo == nullptr) return text + "no topology (hwloc failed), memory not placed";
  if (numa_nodes.empty()) return text + "no core of this machine, memory not placed";
  return text + "NUMA nodes " + joined(numa_nodes);
}

double lane_cost_ns(const lane_candidate& c) {
  const double bandwidth =
      c.bandwidth_bytes_per_s > 0 ? c.bandwidth_bytes_per_s : unreported_bandwidth;
  return c.latency_ns + 1e9 * static_cast<double>(lane_reference_bytes) / bandwidth;
}

bool better_lane(const lane_candidate& a, const lane_candidate& b) {
  const double cost_a = lane_cost_ns(a), cost_b = lane_cost_ns(b);
  if (cost_a != cost_b) return cost_a < cost_b;
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.distance != b.distance) return a.distance < b.distance;
  if (a.iface_index != b.iface_index) return a.iface_index < b.iface_index;
  return a.peer_index < b.peer_index;
}

void rank_lanes(std::vector<lane_candidate>& candidates) {
  std::sort(candidates.begin(), candidates.end(), better_lane);
}

const char* lane_decider(const lane_candidate& winner, const lane_candidate& loser) {
  if (lane_cost_ns(winner) != lane_cost_ns(loser)) return "lower cost";
  if (winner.priority != loser.priority) return "higher priority";
  if (winner.distance != loser.distance) return "nearer device";
  if (winner.iface_index != loser.iface_index) return "transport and locality order";
  return "the peer's order";
}

std::string lane_reason(const std::vector<lane_candidate>& ranked, size_t chosen) {
  const lane_candidate& c = ranked[chosen];
  std::ostringstream out;
  out << "lane " << lane_name(c) << " (peer entry " << c.peer_index << "): cost "
      << rounded_ns(lane_cost_ns(c)) << " for " << lane_reference_bytes / 1024 << " KiB (latency "
      << rounded_ns(c.latency_ns) << ", " << c.bandwidth_bytes_per_s / 1e9 << " GB/s), priority "
      << c.priority << ", device " << to_string(c.distance);
  if (chosen > 0) out << "; " << chosen << " better candidate(s) could not be created";
  if (chosen + 1 < ranked.size()) {
    const lane_candidate& next = ranked[chosen + 1];
    out << "; over " << lane_name(next) << " (peer entry " << next.peer_index << ", cost "
        << rounded_ns(lane_cost_ns(next)) << "): " << lane_decider(c, next);
    if (ranked.size() > chosen + 2) out << ", of " << ranked.size() - chosen << " candidates";
  } else if (chosen == 0) {
    out << "; the only candidate";
  }
  return out.str();
}

}  // namespace comm::detail
