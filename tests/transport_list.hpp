// Which transports the suites run over, taken from the component registry (tl::all_components())
// and never from a list of names: every built-in transport with a device here, or those named in
// COMM_TEST_TLS (comma-separated) to focus on some. A transport without a device is reported as
// skipped with its unavailable_reason. A transport whose device exists only inside this process
// (a test-only device installed before the suites open it, like the verbs test device) is marked
// with mark_in_process_only() before the suites' datasets are built (a global constructor), so
// suites that start other processes skip it and say why.
#pragma once

#include "process_harness.hpp"

#include <comm/transport/transport.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace comm::test {

/// The registry's component called `name`, or null.
inline tl::component* find_component(const std::string& name) {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == name) return c;
  }
  return nullptr;
}

/// The names in COMM_TEST_TLS, empty when it is unset or empty.
inline std::vector<std::string> requested_transports() {
  std::vector<std::string> out;
  const char* only = std::getenv("COMM_TEST_TLS");
  if (only == nullptr) return out;
  std::stringstream list(only);
  for (std::string name; std::getline(list, name, ',');) {
    if (!name.empty()) out.push_back(name);
  }
  return out;
}

/// True when COMM_TEST_TLS is unset or names `name`.
inline bool requested(const std::string& name) {
  const std::vector<std::string> only = requested_transports();
  if (only.empty()) return true;
  for (const std::string& n : only) {
    if (n == name) return true;
  }
  return false;
}

/// Transports the suites run over: every built-in transport that has a device here and that
/// COMM_TEST_TLS (when set) names, in registry order.
inline std::vector<std::string> transports_under_test() {
  std::vector<std::string> out;
  for (tl::component* c : tl::all_components()) {
    const std::string name(c->name());
    if (requested(name) && !c->devices().empty()) out.push_back(name);
  }
  return out;
}

/// Built-in transports left out here, each with why: no device (its unavailable_reason), or not
/// named in COMM_TEST_TLS.
inline std::vector<std::pair<std::string, std::string>> transports_skipped() {
  std::vector<std::pair<std::string, std::string>> out;
  for (tl::component* c : tl::all_components()) {
    const std::string name(c->name());
    if (!requested(name)) {
      out.emplace_back(name, "not named in COMM_TEST_TLS");
    } else if (c->devices().empty()) {
      const std::string why = c->unavailable_reason();
      out.emplace_back(name, why.empty() ? "no device (and no reason given)" : why);
    }
  }
  return out;
}

/// Transports marked as reachable only from inside this process, with the reason.
inline std::map<std::string, std::string>& in_process_only_marks() {
  static std::map<std::string, std::string> marks;
  return marks;
}

/// Marks `name` as usable only inside this process (a test-only device), saying `why`; suites
/// that start other processes skip it with that reason.
inline void mark_in_process_only(const std::string& name, const std::string& why) {
  in_process_only_marks()[name] = why;
}

/// Why `name` cannot reach another process (a test-only device marked so), or empty.
inline std::string in_process_only_reason(const std::string& name) {
  const auto& marks = in_process_only_marks();
  const auto found = marks.find(name);
  return found == marks.end() ? std::string() : found->second;
}

/// Transports marked with mark_acknowledged_by_device().
inline std::set<std::string>& device_ack_marks() {
  static std::set<std::string> marks;
  return marks;
}

/// Marks `name` as a transport whose zcopy sends, puts and flushes complete once the peer's
/// device holds the data, without the peer calling progress() (RDMA's hardware acknowledgement;
/// UCT's zcopy completion allows both). Unmarked transports are held to more: their completions
/// wait for the peer's progress(). A marked transport may also need its device's acknowledgement
/// of sends that went out unsignaled before it can say an endpoint is flushed, so a flush of an
/// endpoint the user thinks idle may be in progress (the sender alone then finishes it).
inline void mark_acknowledged_by_device(const std::string& name) { device_ack_marks().insert(name); }

/// True when `name` was marked with mark_acknowledged_by_device().
inline bool acknowledged_by_device(const std::string& name) {
  return device_ack_marks().count(name) != 0;
}

/// Transports marked with mark_canceled_rendezvous_may_arrive().
inline std::set<std::string>& canceled_rendezvous_marks() {
  static std::set<std::string> marks;
  return marks;
}

/// Marks `name` as a transport whose tagged rendezvous reaches the receiver's device when it is
/// sent (a tag-matching SRQ), so a tag_rndv_cancel (or destroying the endpoint) cannot take it
/// back: the receiver may still match it, and its fetch then fails (the sender's registration is
/// gone). Unmarked transports never show the receiver a rendezvous canceled before it looked.
inline void mark_canceled_rendezvous_may_arrive(const std::string& name) {
  canceled_rendezvous_marks().insert(name);
}

/// True when `name` was marked with mark_canceled_rendezvous_may_arrive().
inline bool canceled_rendezvous_may_arrive(const std::string& name) {
  return canceled_rendezvous_marks().count(name) != 0;
}

/// Transports marked with mark_remote_errors_fail_connection().
inline std::set<std::string>& remote_error_marks() {
  static std::set<std::string> marks;
  return marks;
}

/// Marks `name` as a transport on which the peer's device refuses an RMA with a bad or stale key
/// (a remote access error) and the connection fails with it, as an RC queue pair goes to the
/// error state: the endpoint reports the error to its handler and a new endpoint is needed.
/// Unmarked transports refuse only the operation and keep the endpoint.
inline void mark_remote_errors_fail_connection(const std::string& name) {
  remote_error_marks().insert(name);
}

/// True when `name` was marked with mark_remote_errors_fail_connection().
inline bool remote_errors_fail_connection(const std::string& name) {
  return remote_error_marks().count(name) != 0;
}

/// Why `name` cannot carry traffic between processes, or empty when it can: a test-only device
/// marked in-process-only, or an interface opened on the first device in a forked child that an
/// interface of this process finds unreachable (as self's, whose addresses name their process).
inline std::string cannot_reach_other_processes(const std::string& name) {
  const std::string marked = in_process_only_reason(name);
  if (!marked.empty()) return marked;
  tl::component* component = find_component(name);
  if (component == nullptr || component->devices().empty()) return "no device here";
  tl::iface_params params;
  params.device = component->devices().front();
  channel to_parent, to_child;
  const pid_t child = fork_child([&]() -> int {
    std::unique_ptr<tl::iface> iface;
    CHILD_CHECK(component->open(params, iface) == status::ok);
    send_addresses(to_parent, *iface);
    std::vector<uint8_t> done;
    CHILD_CHECK(to_child.receive(&done));
    return 0;
  });
  if (child < 0) return "fork failed";
  std::vector<uint8_t> device, address;
  const bool got = receive_addresses(to_parent, &device, &address);
  std::unique_ptr<tl::iface> local;
  const bool reachable =
      got && component->open(params, local) == status::ok && local->is_reachable(device, address);
  to_child.send({1});
  wait_child(child);
  return reachable ? std::string() : "an interface in another process is not reachable";
}

/// Transports under test that carry traffic between processes (computed once per program); each
/// one left out is named on stderr with the reason.
inline const std::vector<std::string>& interprocess_transports() {
  static const std::vector<std::string> list = [] {
    std::vector<std::string> out;
    for (const std::string& name : transports_under_test()) {
      const std::string why = cannot_reach_other_processes(name);
      if (why.empty()) {
        out.push_back(name);
      } else {
        std::fprintf(stderr, "multi-process cases skip %s: %s\n", name.c_str(), why.c_str());
      }
    }
    return out;
  }();
  return list;
}

}  // namespace comm::test
