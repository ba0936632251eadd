#include "topology.hpp"

#include <comm/log.hpp>

#include <hwloc.h>

#include <algorithm>
#include <mutex>
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

/// An hwloc bitmap that frees itself.
struct bitmap {
  bitmap() : set(hwloc_bitmap_alloc()) {}
  ~bitmap() { hwloc_bitmap_free(set); }
  bitmap(const bitmap&) = delete;
  bitmap& operator=(const bitmap&) = delete;
  hwloc_bitmap_t set;
};

std::vector<unsigned> indices(hwloc_const_bitmap_t set) {
  std::vector<unsigned> out;
  unsigned i = 0;
  hwloc_bitmap_foreach_begin(i, set) out.push_back(i);
  hwloc_bitmap_foreach_end();
  return out;
}

}  // namespace

struct topology::state {
  hwloc_topology_t topo = nullptr;
  ~state() {
    if (topo != nullptr) hwloc_topology_destroy(topo);
  }

  /// Loads the machine's topology, or the XML file at `xml` when it is not null.
  bool load(const char* xml, std::string* why) {
    if (hwloc_topology_init(&topo) != 0) {
      topo = nullptr;
      if (why) *why = "hwloc_topology_init failed";
      return false;
    }
    // Network devices (and the PCI objects that place them) are what placement needs.
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    // PCI devices come from sysfs (linuxio) as well as from the libpciaccess plugin, which
    // leaks its state at every load (LeakSanitizer reports it): leave that plugin out.
    hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
    if (xml != nullptr && hwloc_topology_set_xml(topo, xml) != 0) {
      if (why) *why = std::string("hwloc cannot read ") + xml;
      return false;
    }
    if (hwloc_topology_load(topo) != 0) {
      if (why) *why = "hwloc_topology_load failed";
      return false;
    }
    return true;
  }

  /// The cores of `cpus` that this topology has, as a cpuset (empty when none). An index beyond
  /// the machine is skipped before it reaches the bitmap, which would grow to hold it.
  void cpuset_of(std::span<const int> cpus, hwloc_bitmap_t out) const {
    hwloc_const_bitmap_t machine = hwloc_topology_get_topology_cpuset(topo);
    hwloc_bitmap_zero(out);
    for (int cpu : cpus)
      if (cpu >= 0 && hwloc_bitmap_isset(machine, static_cast<unsigned>(cpu)))
        hwloc_bitmap_set(out, static_cast<unsigned>(cpu));
  }

  /// The OS device (network or otherwise) called `name`, or null. A verbs port ("mlx5_0:1") is
  /// found as its device ("mlx5_0", an OpenFabrics object for hwloc).
  hwloc_obj_t osdev(const std::string& name) const {
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, nullptr); o != nullptr;
         o = hwloc_get_next_osdev(topo, o))
      if (o->name != nullptr && name == o->name) return o;
    const size_t colon = name.rfind(':');
    return colon != std::string::npos && colon > 0 ? osdev(name.substr(0, colon)) : nullptr;
  }

  /// The package holding `obj`, or null (a machine without packages, or an object above them).
  hwloc_obj_t package_of(hwloc_obj_t obj) const {
    if (obj->type == HWLOC_OBJ_PACKAGE) return obj;
    return hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, obj);
  }
};

const char* to_string(device_distance d) {
  switch (d) {
    case device_distance::local: return "local";
    case device_distance::same_package: return "same package";
    case device_distance::remote: return "remote package";
    case device_distance::unknown: return "unknown";
  }
  return "unknown";
}

topology::topology(std::unique_ptr<state> s) : s_(std::move(s)) {}
topology::~topology() = default;

std::shared_ptr<const topology> topology::machine() {
  static std::once_flag once;
  static std::shared_ptr<const topology> shared;
  std::call_once(once, [] {
    auto s = std::make_unique<state>();
    std::string why;
    if (!s->load(nullptr, &why)) {
      COMM_LOG(warn, "topology", "no placement by topology: %s", why.c_str());
      return;
    }
    shared.reset(new topology(std::move(s)));
  });
  return shared;
}

std::unique_ptr<topology> topology::from_xml(const std::string& path, std::string* why) {
  auto s = std::make_unique<state>();
  if (!s->load(path.c_str(), why)) return nullptr;
  return std::unique_ptr<topology>(new topology(std::move(s)));
}

std::string topology::summary() const {
  hwloc_topology_t topo = s_->topo;
  std::ostringstream out;
  out << "topology: packages=" << count(topo, HWLOC_OBJ_PACKAGE)
      << " numa_nodes=" << count(topo, HWLOC_OBJ_NUMANODE)
      << " cores=" << count(topo, HWLOC_OBJ_CORE) << " pus=" << count(topo, HWLOC_OBJ_PU)
      << cache_sizes(topo);
  return out.str();
}

std::vector<unsigned> topology::numa_nodes_of(std::span<const int> cpus) const {
  bitmap cpuset, nodeset;
  s_->cpuset_of(cpus, cpuset.set);
  if (hwloc_bitmap_iszero(cpuset.set)) return {};
  hwloc_cpuset_to_nodeset(s_->topo, cpuset.set, nodeset.set);
  return indices(nodeset.set);
}

std::vector<unsigned> topology::numa_nodes_of_device(const std::string& name) const {
  hwloc_obj_t dev = s_->osdev(name);
  if (dev == nullptr) return {};
  hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(s_->topo, dev);
  if (near == nullptr || near->nodeset == nullptr) return {};
  return indices(near->nodeset);
}

device_distance topology::distance(const std::string& name, std::span<const int> cpus) const {
  bitmap cpuset, nodeset;
  s_->cpuset_of(cpus, cpuset.set);
  hwloc_obj_t dev = s_->osdev(name);
  if (dev == nullptr || hwloc_bitmap_iszero(cpuset.set)) return device_distance::unknown;
  hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(s_->topo, dev);
  if (near == nullptr) return device_distance::unknown;
  hwloc_cpuset_to_nodeset(s_->topo, cpuset.set, nodeset.set);
  if (near->nodeset != nullptr && hwloc_bitmap_intersects(near->nodeset, nodeset.set))
    return device_distance::local;
  hwloc_obj_t package = s_->package_of(near);
  if (package != nullptr && hwloc_bitmap_intersects(package->cpuset, cpuset.set))
    return device_distance::same_package;
  return device_distance::remote;
}

std::vector<std::string> topology::by_locality(std::vector<std::string> devices,
                                               std::span<const int> cpus) const {
  std::vector<std::pair<device_distance, std::string>> ranked;
  ranked.reserve(devices.size());
  for (auto& d : devices) ranked.emplace_back(distance(d, cpus), std::move(d));
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  devices.clear();
  for (auto& r : ranked) devices.push_back(std::move(r.second));
  return devices;
}

std::string topology_summary() {
  auto topo = topology::machine();
  return topo ? topo->summary() : "topology: hwloc failed to load";
}

}  // namespace comm::detail
