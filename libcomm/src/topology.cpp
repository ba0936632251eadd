#include "topology.hpp"

#include <hwloc.h>

#include <sstream>

namespace comm::detail {
namespace {

int count(hwloc_topology_t topo, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(topo, type);
  return n < 0 ? 0 : n;
}

std::string cache_sizes(hwloc_topology_t topo) {
  std::ostringstream out;
  const hwloc_obj_type_t levels[] = {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE};
  const char* names[] = {"L1d", "L2", "L3"};
  for (int i = 0; i < 3; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, levels[i], 0);
    if (obj == nullptr || obj->attr == nullptr) continue;
    out << ' ' << names[i] << '=' << (obj->attr->cache.size >> 10) << "KiB";
  }
  return out.str();
}

}  // namespace

std::string topology_summary() {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return "topology: hwloc init failed";
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return "topology: hwloc load failed";
  }
  std::ostringstream out;
  out << "topology: packages=" << count(topo, HWLOC_OBJ_PACKAGE)
      << " numa_nodes=" << count(topo, HWLOC_OBJ_NUMANODE)
      << " cores=" << count(topo, HWLOC_OBJ_CORE) << " pus=" << count(topo, HWLOC_OBJ_PU)
      << cache_sizes(topo);
  hwloc_topology_destroy(topo);
  return out.str();
}

}  // namespace comm::detail
