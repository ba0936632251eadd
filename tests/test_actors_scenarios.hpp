// Scenarios of the actor tests, shared by the suites that run them in one process, in two
// processes over shared memory, and (with a node address on another host) across network
// namespaces over tcp. A service node publishes `service`; a client node looks it up by the
// service node's address and checks what comes back. Every wait is bounded.
#pragma once

#include <comm/actors/node.hpp>

#include "process_harness.hpp"

#include <caf/all.hpp>

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace comm::test::actors {

using comm::test::channel;

using add_atom = caf::atom_constant<caf::atom("add")>;
using fail_atom = caf::atom_constant<caf::atom("fail")>;
using echo_atom = caf::atom_constant<caf::atom("echo")>;
using seq_atom = caf::atom_constant<caf::atom("seq")>;
using count_atom = caf::atom_constant<caf::atom("count")>;
using call_atom = caf::atom_constant<caf::atom("callme")>;
using ping_atom = caf::atom_constant<caf::atom("ping")>;
using hold_atom = caf::atom_constant<caf::atom("hold")>;
using victim_atom = caf::atom_constant<caf::atom("victim")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using reveal_atom = caf::atom_constant<caf::atom("reveal")>;
using unreadable_atom = caf::atom_constant<caf::atom("unreadable")>;
using exited_atom = caf::atom_constant<caf::atom("exited")>;
using digest_atom = caf::atom_constant<caf::atom("digest")>;
using keep_atom = caf::atom_constant<caf::atom("keep")>;
using kept_atom = caf::atom_constant<caf::atom("kept")>;

using comm::actors::blob;

/// Name the service is published under.
inline const std::string service_name = "service";

/// A type only the client registers: the service node cannot read it.
struct secret {
  int32_t value = 0;
};

/// Serialisation of secret.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, secret& x) {
  return f(caf::meta::type_name("secret"), x.value);
}

/// A type only the service registers: a client node cannot read an answer of it.
struct hidden {
  int32_t value = 0;
};

/// Serialisation of hidden.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hidden& x) {
  return f(caf::meta::type_name("hidden"), x.value);
}

/// What the service remembers per sender and across messages.
struct service_state {
  std::map<caf::actor_addr, int32_t> next;     ///< next seq expected per sender
  std::map<caf::actor_addr, uint64_t> received;///< seq messages per sender
  std::map<caf::actor_addr, uint64_t> disorder;///< seq messages out of order per sender
  std::vector<caf::typed_response_promise<int32_t>> held;  ///< requests never answered
  blob kept;                                   ///< the blob of the last keep message
};

/// FNV-1a of `size` bytes at `data`.
inline uint64_t digest_of(const char* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ static_cast<unsigned char>(data[i])) * 1099511628211ull;
  return h;
}

/// A blob of `size` bytes of a pattern that depends on `seed`.
inline blob patterned_blob(size_t size, unsigned seed) {
  blob b(size);
  char* out = b.mutable_data();
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(i * 131 + (i >> 12) + seed);
  return b;
}

/// An actor that answers an int with itself, until told to stop.
inline caf::behavior victim(caf::event_based_actor*) {
  return {[](int32_t x) { return x; }};
}

/// Links itself to the actor it is told to watch and reports that actor's exit to an observer.
inline caf::behavior watcher(caf::event_based_actor* self) {
  return {
      [self](watch_atom, const caf::actor& who, const caf::actor& observer) {
        self->set_exit_handler([self, observer](caf::exit_msg& em) {
          self->send(observer, exited_atom::value, em.reason);
          self->quit();
        });
        self->link_to(who);
        return caf::unit;
      },
  };
}

/// Counts a numbered message from the current sender, and whether it came in order.
inline void count_in_order(caf::stateful_actor<service_state>* self, int32_t i) {
  const auto from = self->current_sender()
                        ? caf::actor_cast<caf::actor_addr>(self->current_sender())
                        : caf::actor_addr{};
  auto& next = self->state.next[from];
  if (i != next) ++self->state.disorder[from];
  next = i + 1;
  ++self->state.received[from];
}

/// The service every scenario talks to.
inline caf::behavior service(caf::stateful_actor<service_state>* self) {
  return {
      [](add_atom, int32_t a, int32_t b) { return a + b; },
      [](fail_atom) -> caf::result<int32_t> {
        return caf::make_error(caf::sec::invalid_argument, "failed on request");
      },
      [](echo_atom, std::vector<char>& data) { return std::move(data); },
      [](echo_atom, double x, float y) -> caf::result<double, float> { return {x, y}; },
      [](echo_atom, blob& data) { return data; },
      [](echo_atom, blob& a, std::string& b, std::vector<char>& c, blob& d, std::string& e)
          -> caf::result<blob, std::string, std::vector<char>, blob, std::string> {
        return {a, b, c, d, e};
      },
      [](echo_atom, std::vector<std::string>& many, blob& b)
          -> caf::result<std::vector<std::string>, blob> {
        return {many, b};
      },
      [](digest_atom, const blob& b) { return digest_of(b.data(), b.size()); },
      [self](keep_atom, blob& b) { self->state.kept = std::move(b); },
      [self](kept_atom) { return self->state.kept; },
      [self](seq_atom, int32_t i) { count_in_order(self, i); },
      [self](seq_atom, int32_t i, const std::vector<char>&) { count_in_order(self, i); },
      [self](count_atom) -> caf::result<uint64_t, uint64_t> {
        const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
        return {self->state.received[from], self->state.disorder[from]};
      },
      [self](call_atom) -> caf::result<int32_t> {
        // Requests from whoever asked, through the proxy of the sender (taken before the
        // promise, which takes the sender over).
        auto who = caf::actor_cast<caf::actor>(self->current_sender());
        auto rp = self->make_response_promise<int32_t>();
        self->request(who, std::chrono::seconds(5), ping_atom::value)
            .then([rp](int32_t v) mutable { rp.deliver(v + 1); },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
      [self](hold_atom) -> caf::result<int32_t> {
        auto rp = self->make_response_promise<int32_t>();
        self->state.held.push_back(rp);
        return rp;
      },
      [self](victim_atom) { return self->spawn(victim); },
      [self](watch_atom a, const caf::actor& who, const caf::actor& observer) {
        return self->delegate(self->spawn(watcher), a, who, observer);
      },
      [self](stop_atom, const caf::actor& v) { self->send_exit(v, caf::exit_reason::user_shutdown); },
      [self](stats_atom) -> caf::result<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t> {
        auto s = comm::actors::node::get(self->home_system())->stats();
        return {s.peers, s.proxies, s.remote_monitors, s.frames_held, s.peak_bytes_held};
      },
      [](reveal_atom) { return hidden{5}; },
      [self](unreadable_atom) {
        return comm::actors::node::get(self->home_system())->stats().unreadable_messages;
      },
  };
}

/// Adjusts a test node's parameters (delivery mode, transports, cluster secret).
using node_tweak = std::function<void(comm::actors::node_params&)>;

/// Configures a node for a test: listening on `listen_address`, registering `secret` when
/// `knows_secret` (a client) and `hidden` otherwise (the service), with `tweak` applied to its
/// parameters.
inline void configure(caf::actor_system_config& cfg, const std::string& listen_address,
                      bool knows_secret, const node_tweak& tweak = {}) {
  comm::actors::node_params params;
  params.listen_address = listen_address;
  params.connect_timeout = std::chrono::milliseconds(5000);
  if (tweak) tweak(params);
  comm::actors::node::load(cfg, params);
  if (knows_secret) {
    cfg.add_message_type<secret>("secret");
  } else {
    cfg.add_message_type<hidden>("hidden");
  }
}

/// The node of `sys`.
inline comm::actors::node& node_of(caf::actor_system& sys) { return *comm::actors::node::get(sys); }

/// Spawns and publishes the service on `sys`.
inline caf::actor start_service(caf::actor_system& sys) {
  auto svc = sys.spawn(service);
  if (auto err = node_of(sys).publish(svc, service_name)) {
    std::fprintf(stderr, "publish: %s\n", sys.render(err).c_str());
  }
  return svc;
}

// -- client-side checks: each returns an empty string on success, else what went wrong ---------

/// Formats an error for a failed check.
inline std::string describe(caf::actor_system& sys, const char* what, const caf::error& err) {
  return std::string(what) + ": " + sys.render(err);
}

/// request/response: (add, 1, 2) -> 3.
inline std::string check_request(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::string failure = "no answer";
  self->request(svc, std::chrono::seconds(5), add_atom::value, int32_t{1}, int32_t{2})
      .receive([&](int32_t r) { failure = r == 3 ? "" : "wrong sum " + std::to_string(r); },
               [&](caf::error& e) { failure = describe(sys, "add failed", e); });
  return failure;
}

/// An error response crosses nodes: (fail) -> sec::invalid_argument.
inline std::string check_error_response(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::string failure = "no answer";
  self->request(svc, std::chrono::seconds(5), fail_atom::value)
      .receive([&](int32_t) { failure = "fail answered with a value"; },
               [&](caf::error& e) {
                 failure = e == caf::sec::invalid_argument ? "" : describe(sys, "wrong error", e);
               });
  return failure;
}

/// A type the service node lacks is answered with sec::unknown_type.
inline std::string check_unknown_type(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::string failure = "no answer";
  self->request(svc, std::chrono::seconds(5), secret{7})
      .receive([&](int32_t) { failure = "secret answered with a value"; },
               [&](caf::error& e) {
                 failure = e == caf::sec::unknown_type ? "" : describe(sys, "wrong error", e);
               });
  // The connection survives it.
  return failure.empty() ? check_request(sys, svc) : failure;
}

/// An answer of a type the client node lacks fails the request at once (not at its timeout) with
/// sec::unknown_type naming the type.
inline std::string check_unknown_reply(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::string failure = "no answer";
  self->request(svc, std::chrono::seconds(20), reveal_atom::value)
      .receive([&](int32_t) { failure = "hidden read as an int"; },
               [&](caf::error& e) {
                 const std::string text = sys.render(e);
                 failure = e == caf::sec::unknown_type && text.find("hidden") != std::string::npos
                               ? ""
                               : describe(sys, "wrong error", e);
               });
  return failure.empty() ? check_request(sys, svc) : failure;
}

/// The service node's count of messages it could not read.
inline std::optional<uint64_t> unreadable_count(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::optional<uint64_t> count;
  self->request(svc, std::chrono::seconds(5), unreadable_atom::value)
      .receive([&](uint64_t n) { count = n; }, [](caf::error&) {});
  return count;
}

/// A plain send of a type the service node lacks is dropped there and counted in its stats.
inline std::string check_unknown_send(caf::actor_system& sys, const caf::actor& svc) {
  const auto before = unreadable_count(sys, svc);
  if (!before) return "no unreadable count";
  {
    caf::scoped_actor self{sys};
    self->send(svc, secret{3});
    self->send(svc, secret{4});
  }
  // Frames of one sender arrive in order: a request from another actor may overtake them, so
  // ask until they are counted (bounded).
  std::optional<uint64_t> after;
  for (int i = 0; i < 500; ++i) {
    after = unreadable_count(sys, svc);
    if (!after || *after >= *before + 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!after) return "no unreadable count after the sends";
  if (*after != *before + 2) {
    return "unreadable messages " + std::to_string(*before) + " -> " + std::to_string(*after) +
           ", expected +2";
  }
  return check_request(sys, svc);
}

/// The service requests back from the actor that asked it (sender identity): 41 + 1.
inline std::string check_callback(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  auto report = caf::actor_cast<caf::actor>(self);
  sys.spawn([svc, report](caf::event_based_actor* c) -> caf::behavior {
    c->request(svc, std::chrono::seconds(5), call_atom::value)
        .then(
            [c, report](int32_t v) {
              c->send(report, v);
              c->quit();
            },
            [c, report](caf::error& e) {
              c->send(report, e);
              c->quit();
            });
    return {[](ping_atom) { return int32_t{41}; }};
  });
  std::string failure = "no answer";
  self->receive([&](int32_t v) { failure = v == 42 ? "" : "wrong answer " + std::to_string(v); },
                [&](caf::error& e) { failure = describe(sys, "callback failed", e); },
                caf::after(std::chrono::seconds(10)) >> [&] { failure = "callback timed out"; });
  return failure;
}

/// A payload of `size` bytes goes there and back intact.
inline std::string check_echo(caf::actor_system& sys, const caf::actor& svc, size_t size) {
  std::vector<char> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>(i * 131 + (i >> 12));
  caf::scoped_actor self{sys};
  std::string failure = "no answer";
  self->request(svc, std::chrono::seconds(20), echo_atom::value, data)
      .receive([&](const std::vector<char>& back) {
                 failure = back == data ? "" : "echo of " + std::to_string(size) + " B differs";
               },
               [&](caf::error& e) { failure = describe(sys, "echo failed", e); });
  return failure;
}

/// Blobs, and messages mixing blobs with other large and small runs, go there and back intact;
/// a blob the service keeps stays intact while other large messages pass.
inline std::string check_attachments(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  std::string failure;
  auto fail = [&](caf::error& e) { failure = describe(sys, "attachment check failed", e); };
  const auto timeout = std::chrono::seconds(20);
  for (size_t size : {size_t{0}, size_t{5}, size_t{32767}, size_t{32768}, (size_t{1} << 20) + 3,
                      size_t{8} << 20}) {
    const blob sent = patterned_blob(size, 1);
    self->request(svc, timeout, echo_atom::value, sent)
        .receive([&](const blob& back) {
                   if (back != sent) failure = "blob of " + std::to_string(size) + " B differs";
                 },
                 fail);
    self->request(svc, timeout, digest_atom::value, sent)
        .receive([&](uint64_t d) {
                   if (d != digest_of(sent.data(), size)) failure = "digest differs";
                 },
                 fail);
    if (!failure.empty()) return failure;
  }
  const blob a = patterned_blob(40 * 1024, 2), d = patterned_blob(1 << 20, 3);
  const std::string b(100 * 1024, 'b'), e = "tail";
  const std::vector<char> c(64 * 1024, 'c');
  self->request(svc, timeout, echo_atom::value, a, b, c, d, e)
      .receive(
          [&](const blob& a2, const std::string& b2, const std::vector<char>& c2, const blob& d2,
              const std::string& e2) {
            if (a2 != a || b2 != b || c2 != c || d2 != d || e2 != e) failure = "mixed runs differ";
          },
          fail);
  // A payload too long to travel in the AM header beside its blob.
  const std::vector<std::string> many(2000, std::string(60, 'm'));
  self->request(svc, timeout, echo_atom::value, many, a)
      .receive([&](const std::vector<std::string>& many2, const blob& a2) {
                 if (many2 != many || a2 != a) failure = "long payload with a blob differs";
               },
               fail);
  if (!failure.empty()) return failure;
  const blob keep = patterned_blob(1 << 20, 4);
  self->send(svc, keep_atom::value, keep);
  for (int i = 0; i < 20 && failure.empty(); ++i) {
    const blob other = patterned_blob(1 << 20, static_cast<unsigned>(10 + i));
    self->request(svc, timeout, echo_atom::value, other)
        .receive([&](const blob& back) { if (back != other) failure = "echo differs"; }, fail);
  }
  self->request(svc, timeout, kept_atom::value)
      .receive([&](const blob& back) { if (back != keep) failure = "kept blob changed"; }, fail);
  return failure;
}

/// `senders` actors each send `count` numbered messages, then ask how many arrived in order.
inline std::string check_ordering(caf::actor_system& sys, const caf::actor& svc, int senders,
                                  int32_t count) {
  caf::scoped_actor self{sys};
  auto report = caf::actor_cast<caf::actor>(self);
  for (int s = 0; s < senders; ++s) {
    sys.spawn([svc, report, count](caf::event_based_actor* c) {
      for (int32_t i = 0; i < count; ++i) c->send(svc, seq_atom::value, i);
      c->request(svc, std::chrono::seconds(60), count_atom::value)
          .then([c, report](uint64_t received, uint64_t disorder) {
                  c->send(report, received, disorder);
                },
                [c, report](caf::error& e) { c->send(report, e); });
    });
  }
  std::string failure;
  for (int s = 0; s < senders && failure.empty(); ++s) {
    self->receive(
        [&](uint64_t received, uint64_t disorder) {
          if (received != static_cast<uint64_t>(count) || disorder != 0) {
            failure = "sender saw " + std::to_string(received) + " received, " +
                      std::to_string(disorder) + " out of order";
          }
        },
        [&](caf::error& e) { failure = describe(sys, "count failed", e); },
        caf::after(std::chrono::seconds(60)) >> [&] { failure = "ordering timed out"; });
  }
  return failure;
}

/// One sender's small messages do not overtake its large ones (sent by rendezvous, fetched
/// later): `count` numbered messages, every `every`-th carrying `size` bytes.
inline std::string check_mixed_ordering(caf::actor_system& sys, const caf::actor& svc,
                                        int32_t count, int32_t every, size_t size) {
  caf::scoped_actor self{sys};
  auto report = caf::actor_cast<caf::actor>(self);
  sys.spawn([=](caf::event_based_actor* c) {
    const std::vector<char> blob(size, 'b');
    for (int32_t i = 0; i < count; ++i) {
      if (i % every == 0) {
        c->send(svc, seq_atom::value, i, blob);
      } else {
        c->send(svc, seq_atom::value, i);
      }
    }
    c->request(svc, std::chrono::seconds(60), count_atom::value)
        .then([c, report](uint64_t received, uint64_t disorder) {
                c->send(report, received, disorder);
              },
              [c, report](caf::error& e) { c->send(report, e); });
  });
  std::string failure = "mixed ordering timed out";
  self->receive(
      [&](uint64_t received, uint64_t disorder) {
        failure = received == static_cast<uint64_t>(count) && disorder == 0
                      ? ""
                      : std::to_string(received) + " received, " + std::to_string(disorder) +
                            " out of order";
      },
      [&](caf::error& e) { failure = describe(sys, "count failed", e); },
      caf::after(std::chrono::seconds(60)) >> [] {});
  self->request(svc, std::chrono::seconds(5), stats_atom::value)
      .receive(
          [](uint64_t, uint64_t, uint64_t, uint64_t held, uint64_t peak) {
            std::printf("mixed ordering: the service node held %llu frames for order, at most "
                        "%.1f MiB at once\n",
                        static_cast<unsigned long long>(held), static_cast<double>(peak) / (1 << 20));
          },
          [](caf::error&) {});
  return failure;
}

/// A remote actor's exit reaches its monitors (down_msg) and links (exit_msg) with its reason,
/// and a request to it afterwards fails at once.
inline std::string check_remote_exit(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  caf::actor v;
  std::string failure;
  self->request(svc, std::chrono::seconds(5), victim_atom::value)
      .receive([&](caf::actor& x) { v = x; },
               [&](caf::error& e) { failure = describe(sys, "victim", e); });
  if (!failure.empty()) return failure;
  if (!v || v.node() == sys.node()) return "victim is not a remote actor";
  self->monitor(v);
  auto report = caf::actor_cast<caf::actor>(self);
  auto linked = sys.spawn([v, report](caf::event_based_actor* l) -> caf::behavior {
    l->set_exit_handler([l, report](caf::exit_msg& em) {
      l->send(report, std::string("exit"), em.reason);
      l->quit();
    });
    l->link_to(v);
    l->send(report, std::string("linked"));
    return {[](int32_t) {}};
  });
  self->receive([](const std::string&) {}, caf::after(std::chrono::seconds(5)) >> [] {});
  // The link frame and the stop request travel on different connections: give the link a head
  // start, then make sure it arrived by a round trip through the victim.
  self->request(v, std::chrono::seconds(5), int32_t{7})
      .receive([&](int32_t x) { failure = x == 7 ? "" : "victim answered wrong"; },
               [&](caf::error& e) { failure = describe(sys, "victim request", e); });
  if (!failure.empty()) return failure;
  self->send(svc, stop_atom::value, v);
  bool down = false, exited = false;
  for (int i = 0; i < 2 && failure.empty(); ++i) {
    self->receive(
        [&](caf::down_msg& dm) {
          down = dm.source == v.address() && dm.reason == caf::exit_reason::user_shutdown;
          if (!down) failure = "down_msg " + caf::to_string(dm.reason);
        },
        [&](const std::string&, caf::error& reason) {
          exited = reason == caf::exit_reason::user_shutdown;
          if (!exited) failure = "exit_msg " + sys.render(reason);
        },
        caf::after(std::chrono::seconds(5)) >> [&] { failure = "no down/exit message"; });
  }
  if (!failure.empty()) return failure;
  self->request(v, std::chrono::seconds(5), int32_t{1})
      .receive([&](int32_t) { failure = "a dead actor answered"; },
               [&](caf::error& e) {
                 if (e == caf::sec::request_timeout) failure = "request to a dead actor timed out";
               });
  return failure;
}

/// A local actor's exit reaches a remote actor linked to it (the link made on the remote side).
inline std::string check_local_exit(caf::actor_system& sys, const caf::actor& svc) {
  caf::scoped_actor self{sys};
  auto v = sys.spawn(victim);
  std::string failure;
  self->request(svc, std::chrono::seconds(5), watch_atom::value, v,
                caf::actor_cast<caf::actor>(self))
      .receive([] {}, [&](caf::error& e) { failure = describe(sys, "watch", e); });
  if (!failure.empty()) return failure;
  caf::anon_send_exit(v, caf::exit_reason::user_shutdown);
  failure = "the remote watcher saw no exit";
  self->receive(
      [&](exited_atom, caf::error& reason) {
        failure = reason == caf::exit_reason::user_shutdown ? "" : "exit " + sys.render(reason);
      },
      caf::after(std::chrono::seconds(5)) >> [] {});
  return failure;
}

/// Looking up a name nobody published fails with status::no_elem.
inline std::string check_unknown_name(caf::actor_system& sys, const std::string& address) {
  auto found = node_of(sys).lookup(address, "nobody-here");
  if (found) return "an unknown name was found";
  return comm::actors::status_of(found.error()) == comm::status::no_elem
             ? ""
             : describe(sys, "wrong error", found.error());
}

// -- nodes in processes of their own -----------------------------------------------------------

/// Bytes of a string, for a channel.
inline std::vector<uint8_t> bytes_of(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

/// The string a channel carried; empty on timeout.
inline std::string receive_string(const channel& ch, int timeout_ms = 20000) {
  std::vector<uint8_t> bytes;
  if (!ch.receive(&bytes, timeout_ms)) return {};
  return std::string(bytes.begin(), bytes.end());
}

/// Nanoseconds on the host's monotonic clock (comparable between processes of one host).
inline uint64_t monotonic_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

/// The node-killed scenario from the test's side: waits for the client's "ready" on `report`,
/// runs `kill` (SIGKILL of the service node), and returns the milliseconds from the kill until the
/// client saw the down message and every failed request (check_node_killed reports the time);
/// nothing when the client did not report.
template <class Kill>
std::optional<double> ms_until_failures_seen(const channel& report, Kill&& kill) {
  if (receive_string(report) != "ready") return std::nullopt;
  const uint64_t killed = monotonic_ns();
  kill();
  uint64_t seen = 0;
  if (!report.receive_word(&seen)) return std::nullopt;
  return static_cast<double>(seen - killed) / 1e6;
}

/// Body of a service process: a node listening on `listen_address` that publishes the service,
/// tells its address on `out`, and serves until anything arrives on `in` (or 60 s passed).
inline int service_process(const std::string& listen_address, const channel& out,
                           const channel& in, const node_tweak& tweak = {}) {
  caf::actor_system_config cfg;
  configure(cfg, listen_address, false, tweak);
  caf::actor_system sys{cfg};
  auto svc = start_service(sys);
  const std::string address = node_of(sys).address();
  out.send(bytes_of(address));
  if (address.empty()) return 2;
  std::vector<uint8_t> stop;
  in.receive(&stop, 60000);
  caf::anon_send_exit(svc, caf::exit_reason::user_shutdown);
  return 0;
}

/// A node in a forked child process, stopped or killed by the parent: `run(from, to)` is the
/// child's body, which first sends the node's address on `from` and stops when anything arrives
/// on `to`.
struct node_child {
  channel from;  ///< what the node tells the parent (its address)
  channel to;    ///< anything sent here stops it
  pid_t pid = -1;
  std::string address;

  /// Forks the child that runs `run` and waits for its address.
  template <class Run>
  explicit node_child(Run&& run) {
    pid = fork_child([&] { return run(from, to); });
    address = receive_string(from);
  }

  /// Stops it and returns its exit code.
  int stop() {
    to.send(bytes_of("stop"));
    const int rc = wait_child(pid);
    pid = -1;
    return rc;
  }

  /// Kills it with SIGKILL.
  void kill() {
    ::kill(pid, SIGKILL);
    wait_child(pid);
    pid = -1;
  }

  ~node_child() {
    if (pid > 0) kill();
  }
};

/// A service node in a forked child process (service_process).
struct service_child : node_child {
  /// Starts a service node listening on `listen_address`; `enter`, when given, runs first in the
  /// child (e.g. to move into a network namespace) and must return true.
  explicit service_child(const std::string& listen_address = "127.0.0.1:0",
                         const node_tweak& tweak = {},
                         const std::function<bool()>& enter = {})
      : node_child([&](const channel& from, const channel& to) {
          if (enter && !enter()) return 3;
          return service_process(listen_address, from, to, tweak);
        }) {}
};

/// A client's test body: given its actor system and the service node's address, returns an
/// empty string on success, else what failed.
using client_body = std::function<std::string(caf::actor_system&, const std::string&)>;

/// Body of a client process: a node (listening on `listen_address`, knowing `secret`) that runs
/// `body` against the service node at `address`, printing what failed.
inline int client_process(const std::string& address, const client_body& body,
                          const std::string& listen_address = "127.0.0.1:0",
                          const node_tweak& tweak = {}) {
  caf::actor_system_config cfg;
  configure(cfg, listen_address, true, tweak);
  caf::actor_system sys{cfg};
  const std::string failure = body(sys, address);
  if (!failure.empty()) std::fprintf(stderr, "client: %s\n", failure.c_str());
  return failure.empty() ? 0 : 1;
}

/// Looks the service up at `address` into `out`; returns what failed.
inline std::string lookup_service(caf::actor_system& sys, const std::string& address,
                                  caf::actor& out) {
  auto found = node_of(sys).lookup(address, service_name);
  if (!found) return describe(sys, "lookup", found.error());
  out = *found;
  return out.node() != sys.node() ? "" : "the service is not remote";
}

/// Runs `checks` in order against the service at `address`; the first failure ends them.
inline std::string run_checks(
    caf::actor_system& sys, const std::string& address,
    const std::vector<std::function<std::string(caf::actor_system&, const caf::actor&)>>& checks) {
  caf::actor svc;
  std::string failure = lookup_service(sys, address, svc);
  for (size_t i = 0; i < checks.size() && failure.empty(); ++i) failure = checks[i](sys, svc);
  return failure;
}

/// The service node is killed while requests wait there: monitors get a down_msg and every
/// waiting request fails. Sends "ready" on `out` once the requests arrived, then the monotonic
/// time at which the last failure was seen; the parent kills the service node in between.
inline std::string check_node_killed(caf::actor_system& sys, const std::string& address,
                                     const channel& out, int held) {
  caf::actor svc;
  std::string failure = lookup_service(sys, address, svc);
  if (!failure.empty()) return failure;
  caf::scoped_actor self{sys};
  self->monitor(svc);
  using handle = decltype(self->request(svc, std::chrono::seconds(30), hold_atom::value));
  std::vector<handle> waiting;
  for (int i = 0; i < held; ++i) {
    waiting.push_back(self->request(svc, std::chrono::seconds(30), hold_atom::value));
  }
  failure = check_request(sys, svc);  // answered after every hold arrived
  if (!failure.empty()) return failure;
  out.send(bytes_of("ready"));
  bool down = false;
  self->receive([&](caf::down_msg& dm) {
                  down = dm.reason == caf::exit_reason::remote_link_unreachable;
                },
                caf::after(std::chrono::seconds(10)) >> [] {});
  if (!down) return "no down_msg (remote_link_unreachable) for the killed node";
  for (auto& h : waiting) {
    bool failed = false;
    std::move(h).receive([](int32_t) {},
                         [&](caf::error& e) { failed = e == caf::sec::request_receiver_down; });
    if (!failed) return "a request to the killed node did not fail with request_receiver_down";
  }
  const uint64_t seen = monotonic_ns();
  out.send(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&seen),
                                reinterpret_cast<const uint8_t*>(&seen) + sizeof(seen)));
  if (node_of(sys).stats().peers != 0) return "the killed node's connection is still counted";
  return "";
}

}  // namespace comm::test::actors
