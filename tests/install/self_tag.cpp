// Built against an installed libcomm (tests/install/check_install.sh): every transport is linked
// in, and a worker sends itself a tagged message over the self transport (the C++ face).
#include <comm/context.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

namespace {

/// Fails the program with `what` unless `ok`.
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "self_tag: %s\n", what);
    std::exit(1);
  }
}

/// Every transport the build registered is in the library, available here or not.
void check_transports_linked() {
  std::set<std::string> names;
  for (comm::tl::component* c : comm::tl::all_components()) names.emplace(c->name());
  for (const char* expected : {"self", "shm", "tcp", "verbs"})
    require(names.count(expected) == 1, "a registered transport is missing from the library");
}

/// Sends "hello" with tag 42 to this worker's own address and receives it, through the C++
/// face (a capturing completion, spans, owning handles).
void send_to_self() {
  comm::config cfg = comm::config::from_environment();
  cfg.transports = {"self"};
  comm::context ctx(cfg);
  auto w = comm::worker::create(ctx).value();  // value() throws bad_result_access on an error
  comm::endpoint_ptr ep = w->connect(w->address()).value();

  char in[16] = {};
  size_t got = 0;
  comm::operation r = w->tag_recv(in, 42, comm::tag_mask_full,
                                 [&got](comm::status, const comm::tag_recv_info& info) {
                                   got = info.length;
                                 });
  const char out[] = "hello";
  comm::operation s = ep->tag_send(42, out);
  require(s.wait(10000) == comm::status::ok, "tag_send did not complete");
  require(r.wait(10000) == comm::status::ok, "tag_recv did not complete");
  require(got == sizeof(out) && std::strcmp(in, out) == 0, "received bytes differ from those sent");
}

}  // namespace

int main() {
  check_transports_linked();
  send_to_self();
  std::puts("self_tag: ok");
  return 0;
}
