// Host topology from hwloc, for info output and placement.
#pragma once

#include <string>

namespace comm::detail {

/// One paragraph describing the machine: packages, NUMA nodes, cores, PUs, caches.
std::string topology_summary();

}  // namespace comm::detail
