// Which transports the suites run over, taken from the component registry (tl::all_components())
// and never from a list of names: every built-in transport with a device here, or those named in
// COMM_TEST_TLS (comma-separated) to focus on some. A transport without a device is reported as
// skipped with its unavailable_reason. A transport whose device exists only inside this process
// (a test-only device installed before the suites open it, like the verbs test device) is marked
// with mark_in_process_only(), so suites that start other processes skip it and say why.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstdlib>
#include <map>
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

}  // namespace comm::test
