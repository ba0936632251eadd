// Placing memory on NUMA nodes: what a transport does with iface_params::numa_nodes for the memory
// its interface allocates (shm FIFOs and receive buffers). Plain Linux system calls (mbind,
// get_mempolicy), so transports need neither hwloc nor libnuma.
#pragma once

#include <comm/status.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace comm::tl {

/// What became of a request to place memory.
struct placement_outcome {
  status st = status::ok;  ///< ok, or why the memory stays where the kernel put it
  bool bound = false;      ///< a policy is in force (false: nothing asked, or single-node no-op)
  std::string text;        ///< one line for an interface's info(), e.g. "bound to NUMA nodes 0"
};

/// Binds the pages of [address, address + length) (page aligned, mapped) to the NUMA nodes
/// `nodes` (OS indices) and moves pages already there. Empty `nodes` asks for nothing. A kernel
/// that refuses NUMA policies (no NUMA support, a seccomp filter) is a no-op only on a machine
/// with one node; otherwise, and for nodes the machine lacks, the outcome says why it failed.
placement_outcome bind_to_numa_nodes(void* address, size_t length,
                                     std::span<const unsigned> nodes);

/// The NUMA nodes the policy of the page at `address` names (get_mempolicy), ascending; empty
/// when the page has the default policy or the kernel does not say.
std::vector<unsigned> numa_policy_nodes(const void* address);

/// True when this machine has one NUMA node (or a kernel without NUMA support).
bool single_numa_node();

/// "0", "0,2": NUMA node indices as a list, for logs and info().
std::string node_list(std::span<const unsigned> nodes);

}  // namespace comm::tl
