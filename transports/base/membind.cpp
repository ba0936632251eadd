#include "base/membind.hpp"

#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>

namespace comm::tl {
namespace {

/// Bits of one word of a node mask.
constexpr unsigned word_bits = 8 * sizeof(unsigned long);
/// Nodes a mask can name: the kernel's own limit on common configurations (MAX_NUMNODES).
constexpr unsigned max_nodes = 1024;

/// The node mask the kernel takes, with `nodes` set; empty when a node is out of range.
std::vector<unsigned long> node_mask(std::span<const unsigned> nodes) {
  std::vector<unsigned long> mask(max_nodes / word_bits, 0);
  for (unsigned node : nodes) {
    if (node >= max_nodes) return {};
    mask[node / word_bits] |= 1ul << (node % word_bits);
  }
  return mask;
}

/// A kernel answer that means "no NUMA policies here" rather than "this request is wrong".
bool policies_unavailable(int error) { return error == ENOSYS || error == EPERM; }

}  // namespace

std::string node_list(std::span<const unsigned> nodes) {
  std::string text;
  for (unsigned node : nodes) {
    if (!text.empty()) text += ',';
    text += std::to_string(node);
  }
  return text;
}

bool single_numa_node() {
  std::ifstream online("/sys/devices/system/node/online");
  std::string nodes;
  if (!(online >> nodes)) return true;  // no node directory: a kernel without NUMA
  return nodes.find_first_of(",-") == std::string::npos;
}

placement_outcome bind_to_numa_nodes(void* address, size_t length,
                                     std::span<const unsigned> nodes) {
  placement_outcome out;
  if (nodes.empty()) {
    out.text = "not placed (no NUMA nodes given)";
    return out;
  }
  const std::string list = node_list(nodes);
  const std::vector<unsigned long> mask = node_mask(nodes);
  if (mask.empty()) {
    out.st = status::invalid_param;
    out.text = "placement on NUMA nodes " + list + " failed: a node index is out of range";
    return out;
  }
  const long rc = ::syscall(SYS_mbind, address, length, MPOL_BIND, mask.data(),
                            static_cast<unsigned long>(max_nodes), MPOL_MF_MOVE | MPOL_MF_STRICT);
  if (rc == 0) {
    out.bound = true;
    out.text = "bound to NUMA nodes " + list;
    return out;
  }
  const int error = errno;
  if (policies_unavailable(error) && single_numa_node()) {
    out.text = "not bound (one NUMA node; mbind: " + std::string(std::strerror(error)) + ")";
    return out;
  }
  out.st = error == EINVAL ? status::invalid_param : status::no_resource;
  out.text = "placement on NUMA nodes " + list + " failed: mbind: " + std::strerror(error);
  return out;
}

std::vector<unsigned> numa_policy_nodes(const void* address) {
  std::vector<unsigned long> mask(max_nodes / word_bits, 0);
  int mode = 0;
  if (::syscall(SYS_get_mempolicy, &mode, mask.data(), static_cast<unsigned long>(max_nodes),
                address, MPOL_F_ADDR) != 0 ||
      mode == MPOL_DEFAULT) {
    return {};
  }
  std::vector<unsigned> nodes;
  for (unsigned node = 0; node < max_nodes; ++node) {
    if (mask[node / word_bits] & (1ul << (node % word_bits))) nodes.push_back(node);
  }
  return nodes;
}

}  // namespace comm::tl
