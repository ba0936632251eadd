// libcomm as actors: worker actors connected through a listener actor (over shared memory and
// over tcp only), active messages and tagged messages both ways (rendezvous sizes too), tag
// receives and routes, per-endpoint AM routes, reject and unanswered requests, endpoint close,
// errors for bad input, release of everything when a worker exits, and two processes.
#define BOOST_TEST_MODULE actors_io
#include <boost/test/unit_test.hpp>

#include "process_harness.hpp"
#include "test_util.hpp"

#include <comm/actors/io_actors.hpp>
#include <comm/actors/node.hpp>

#include <caf/all.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace comm::actors::io;
using comm::status;
using comm::actors::status_of;


namespace {

/// Limit on every wait of these tests.
constexpr auto timeout = std::chrono::seconds(10);

using relay_atom = caf::atom_constant<caf::atom("relay")>;

comm::config config_with(const std::vector<std::string>& transports) {
  comm::config cfg = comm::config::from_environment();
  cfg.transports = transports;
  cfg.auth_key.clear();
  return cfg;
}

bytes text(const std::string& s) { return bytes(s.begin(), s.end()); }

std::string text_of(const bytes& b) { return std::string(b.begin(), b.end()); }

bytes pattern(size_t length, uint8_t seed) {
  bytes out(length);
  for (size_t i = 0; i < length; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed);
  return out;
}


/// How a test owner answers connection requests.
enum class answer { accept, reject, never };

/// A listener's owner: answers each request as told and reports requests and accepted endpoints
/// to `observer`.
caf::behavior owner_actor(caf::event_based_actor* self, caf::actor observer, answer how) {
  return {
      [=](conn_request_atom, conn_request_info& info) -> conn_reply {
        self->send(observer, conn_request_atom::value, info);
        if (how == answer::accept) return accept_connection(text("welcome"));
        if (how == answer::reject) return reject_connection();
        self->make_response_promise();  // never delivered
        return caf::delegated<accept_atom, bytes>{};
      },
      [=](accepted_atom, uint64_t id, caf::actor& ep) {
        self->send(observer, accepted_atom::value, id, ep);
      },
      [=](accepted_atom, uint64_t id, caf::error& err) {
        self->send(observer, accepted_atom::value, id, std::move(err));
      },
  };
}

/// An AM handler that tells `observer` which route delivered a message: (relay_atom, id, data).
caf::behavior relay_actor(caf::event_based_actor* self, caf::actor observer) {
  return {
      [=](am_atom, uint16_t id, bytes&, bytes& payload, caf::actor&) {
        self->send(observer, relay_atom::value, id, std::move(payload));
      },
  };
}

/// An actor system configured for these protocols.
struct io_config : caf::actor_system_config {
  io_config() { comm::actors::io::add_message_types(*this); }
};

/// Two workers connected through a listener of the first.
struct connection {
  caf::actor server;     ///< the listening worker
  caf::actor client;     ///< the connecting worker
  caf::actor owner;      ///< decides the listener's requests
  caf::actor listener;
  caf::actor server_ep;  ///< the accepted endpoint
  caf::actor client_ep;  ///< the client's endpoint
  conn_request_info request;
};

struct fixture {
  io_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  caf::actor me() { return caf::actor_cast<caf::actor>(self); }

  caf::actor worker(const comm::config& transport, const std::string& name) {
    worker_config wc;
    wc.transport = transport;
    wc.worker.name = name;
    auto w = spawn_worker(sys, wc);
    BOOST_REQUIRE_MESSAGE(w, "spawn_worker: " << (w ? std::string() : sys.render(w.error())));
    return *w;
  }

  /// The answer of type T to a request, failing the test on an error.
  template <class T, class... Ts>
  T ask(const caf::actor& dest, Ts&&... xs) {
    T result{};
    self->request(dest, timeout, std::forward<Ts>(xs)...)
        .receive([&](T& x) { result = std::move(x); },
                 [&](caf::error& err) { BOOST_FAIL("request failed: " << sys.render(err)); });
    return result;
  }

  /// The error a request was answered with; empty for ok_atom.
  template <class... Ts>
  caf::error outcome(const caf::actor& dest, Ts&&... xs) {
    caf::error result = caf::make_error(caf::sec::unexpected_response);
    self->request(dest, timeout, std::forward<Ts>(xs)...)
        .receive([&](ok_atom) { result = caf::error{}; },
                 [&](caf::error& err) { result = std::move(err); });
    return result;
  }

  /// Connects a client worker to a listener of a server worker; the owner answers `how`.
  /// @returns the client's connect error (empty on success)
  caf::error try_connect(connection& c, answer how = answer::accept) {
    c.owner = sys.spawn(owner_actor, me(), how);
    c.listener = ask<caf::actor>(c.server, listen_atom::value, std::string("127.0.0.1:0"), c.owner);
    const std::string address = ask<std::string>(c.listener, address_atom::value);
    caf::error err;
    self->request(c.client, timeout, connect_atom::value, address, text("hello"))
        .receive(
            [&](caf::actor& ep, bytes& server_data) {
              c.client_ep = ep;
              BOOST_TEST(text_of(server_data) == "welcome");
            },
            [&](caf::error& e) { err = std::move(e); });
    self->receive([&](conn_request_atom, conn_request_info& info) { c.request = std::move(info); },
                  caf::after(timeout) >> [] { BOOST_FAIL("the owner saw no request"); });
    return err;
  }

  /// A connected pair of workers on `server_cfg` and `client_cfg`.
  connection connect(const comm::config& server_cfg, const comm::config& client_cfg) {
    connection c;
    c.server = worker(server_cfg, "server");
    c.client = worker(client_cfg, "client");
    const caf::error err = try_connect(c);
    BOOST_REQUIRE_MESSAGE(!err, "connect: " << sys.render(err));
    self->receive(
        [&](accepted_atom, uint64_t id, caf::actor& ep) {
          BOOST_TEST(id == c.request.id);
          c.server_ep = ep;
        },
        caf::after(timeout) >> [] { BOOST_FAIL("the owner got no endpoint"); });
    return c;
  }

  /// Receives one AM delivered to this test's actor and checks it.
  void expect_am(uint16_t id, const bytes& header, const bytes& payload,
                 caf::actor* reply = nullptr) {
    bool got = false;
    self->receive(
        [&](am_atom, uint16_t got_id, bytes& h, bytes& p, caf::actor& reply_ep) {
          got = true;
          BOOST_TEST(got_id == id);
          BOOST_TEST((h == header));
          BOOST_TEST(p.size() == payload.size());
          BOOST_TEST((p == payload));
          BOOST_TEST(static_cast<bool>(reply_ep));
          if (reply != nullptr) *reply = reply_ep;
        },
        caf::after(timeout) >> [] {});
    BOOST_TEST(got, "active message " << id << " arrived");
  }

  /// Receives one tagged message delivered to this test's actor.
  void expect_tag(uint64_t tag, const bytes& payload) {
    bool got = false;
    self->receive(
        [&](tag_atom, uint64_t got_tag, bytes& p) {
          got = true;
          BOOST_TEST(got_tag == tag);
          BOOST_TEST((p == payload));
        },
        caf::after(timeout) >> [] {});
    BOOST_TEST(got, "tagged message " << tag << " arrived");
  }

  /// Sends AMs both ways, small and `large` bytes, the answer through the reply endpoint.
  void exchange_am(connection& c, size_t large) {
    BOOST_REQUIRE(!outcome(c.server, register_am_atom::value, uint16_t{7}, me()));
    BOOST_REQUIRE(!outcome(c.client, register_am_atom::value, uint16_t{8}, me()));
    const bytes header = text("hdr");
    for (size_t length : {size_t{16}, large}) {
      const bytes payload = pattern(length, 1);
      BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{7}, header, payload));
      caf::actor reply;
      expect_am(7, header, payload, &reply);
      BOOST_TEST((reply == c.server_ep));
      const bytes answer = pattern(length, 2);
      BOOST_TEST(!outcome(reply, am_send_atom::value, uint16_t{8}, bytes{}, answer));
      expect_am(8, bytes{}, answer);
    }
  }

  /// Sends tagged messages both ways, small and `large` bytes, received by tag_recv.
  void exchange_tags(connection& c, size_t large) {
    uint64_t tag = 100;
    for (size_t length : {size_t{8}, large}) {
      for (auto [from, to] : {std::pair{c.client_ep, c.server}, std::pair{c.server_ep, c.client}}) {
        const bytes payload = pattern(length, static_cast<uint8_t>(tag));
        // A rendezvous send completes once the receiver took the data: answer it afterwards.
        auto sent = self->request(from, timeout, tag_send_atom::value, tag, payload);
        self->request(to, timeout, tag_recv_atom::value, tag, comm::tag_mask_full)
            .receive(
                [&](tag_atom, uint64_t got, bytes& p) {
                  BOOST_TEST(got == tag);
                  BOOST_TEST((p == payload));
                },
                [&](caf::error& err) { BOOST_FAIL("tag_recv: " << sys.render(err)); });
        sent.receive([](ok_atom) {},
                     [&](caf::error& err) { BOOST_FAIL("tag_send: " << sys.render(err)); });
        ++tag;
      }
    }
  }

  /// Down messages received while waiting for another one.
  std::vector<std::pair<caf::actor_addr, caf::error>> downs;

  /// Waits for the down message of `whom` (monitored before) and returns its reason
  /// (sec::request_timeout when none came in time).
  caf::error down_reason(const caf::actor& whom) { return down_reason(whom.address()); }

  /// As down_reason(whom), for an actor known by its address.
  caf::error down_reason(const caf::actor_addr& addr) {
    auto find = [&] {
      return std::find_if(downs.begin(), downs.end(), [&](auto& d) { return d.first == addr; });
    };
    bool timed_out = false;
    while (find() == downs.end() && !timed_out) {
      self->receive([&](caf::down_msg& down) { downs.emplace_back(down.source, down.reason); },
                    caf::after(timeout) >> [&] { timed_out = true; });
    }
    auto it = find();
    if (it == downs.end()) return caf::make_error(caf::sec::request_timeout);
    caf::error reason = std::move(it->second);
    downs.erase(it);
    return reason;
  }

  /// Closes a worker and waits for it to exit.
  void close_worker(const caf::actor& w) {
    self->monitor(w);
    BOOST_TEST(!outcome(w, close_atom::value));
    BOOST_TEST(!down_reason(w));
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(io_actors, fixture)

BOOST_AUTO_TEST_CASE(listener_actor_forwards_requests_and_the_accept_makes_endpoints) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  BOOST_TEST(text_of(c.request.private_data) == "hello");
  BOOST_TEST(c.request.client_name == "client");
  BOOST_TEST(c.request.client_address.rfind("127.0.0.1:", 0) == 0u);
  self->request(c.client_ep, timeout, info_atom::value)
      .receive(
          [&](std::string& peer, std::string& transport, std::string& line) {
            BOOST_TEST(peer == "server");
            BOOST_TEST(transport == "shm");
            BOOST_TEST(!line.empty());
          },
          [&](caf::error& err) { BOOST_FAIL(sys.render(err)); });
  BOOST_TEST(!ask<std::string>(c.server, info_atom::value).empty());
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(active_messages_both_ways_with_reply_endpoints_and_rendezvous_sizes) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  exchange_am(c, 6 << 20);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(plain_sends_from_one_actor_arrive_in_order) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  BOOST_REQUIRE(!outcome(c.server, register_am_atom::value, uint16_t{5}, me()));
  constexpr uint32_t count = 300;
  for (uint32_t i = 0; i < count; ++i) {
    // Every tenth message goes by rendezvous; a plain send gets no answer.
    const size_t length = i % 10 == 0 ? (256 << 10) : 4 + i;
    bytes payload = pattern(length, static_cast<uint8_t>(i));
    self->send(c.client_ep, am_send_atom::value, uint16_t{5}, bytes{}, std::move(payload));
  }
  BOOST_TEST(!outcome(c.client_ep, flush_atom::value));
  uint32_t in_order = 0;
  for (uint32_t i = 0; i < count; ++i) {
    self->receive(
        [&](am_atom, uint16_t, bytes&, bytes& p, caf::actor&) {
          const size_t length = i % 10 == 0 ? (256 << 10) : 4 + i;
          if (p == pattern(length, static_cast<uint8_t>(i))) ++in_order;
        },
        caf::after(timeout) >> [] {});
  }
  BOOST_TEST(in_order == count);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(tagged_messages_both_ways_with_rendezvous_sizes) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  exchange_tags(c, 5 << 20);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(tcp_only_workers_talk_over_tcp) {
  auto c = connect(config_with({"tcp"}), config_with({"tcp"}));
  self->request(c.server_ep, timeout, info_atom::value)
      .receive([&](std::string&, std::string& transport,
                   std::string&) { BOOST_TEST(transport == "tcp"); },
               [&](caf::error& err) { BOOST_FAIL(sys.render(err)); });
  exchange_am(c, 4 << 20);
  exchange_tags(c, 4 << 20);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(tag_receives_wait_for_their_message_and_routes_take_every_match) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  // A receive posted before the message arrives, matching under a mask.
  auto waiting = self->request(c.server, timeout, tag_recv_atom::value, uint64_t{0x1200},
                               uint64_t{0xff00});
  BOOST_TEST(!outcome(c.client_ep, tag_send_atom::value, uint64_t{0x1234}, text("masked")));
  waiting.receive(
      [&](tag_atom, uint64_t tag, bytes& p) {
        BOOST_TEST(tag == 0x1234u);
        BOOST_TEST(text_of(p) == "masked");
      },
      [&](caf::error& err) { BOOST_FAIL(sys.render(err)); });
  // A route takes every match, in order; other tags stay for receives.
  BOOST_TEST(!outcome(c.server, register_tag_atom::value, uint64_t{0x500}, uint64_t{0xf00}, me()));
  for (uint64_t i = 0; i < 5; ++i) {
    BOOST_TEST(!outcome(c.client_ep, tag_send_atom::value, 0x500 + i, pattern(100, uint8_t(i))));
  }
  for (uint64_t i = 0; i < 5; ++i) expect_tag(0x500 + i, pattern(100, uint8_t(i)));
  BOOST_TEST(!outcome(c.server, unregister_tag_atom::value, uint64_t{0x500}, uint64_t{0xf00}, me()));
  BOOST_TEST(status_of(outcome(c.server, unregister_tag_atom::value, uint64_t{0x500},
                               uint64_t{0xf00}, me())) == status::no_elem);
  // A bounded receive with nothing to match times out; the endpoint actor forwards tag receives
  // to its worker.
  const caf::error expired = outcome(c.server, tag_recv_atom::value, uint64_t{9}, uint64_t{~0ull},
                                     caf::timespan{std::chrono::milliseconds(200)});
  BOOST_TEST(status_of(expired) == status::timed_out);
  BOOST_TEST(!outcome(c.client_ep, tag_send_atom::value, uint64_t{9}, text("late")));
  self->request(c.server_ep, timeout, tag_recv_atom::value, uint64_t{9}, uint64_t{~0ull})
      .receive([&](tag_atom, uint64_t, bytes& p) { BOOST_TEST(text_of(p) == "late"); },
               [&](caf::error& err) { BOOST_FAIL(sys.render(err)); });
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(a_route_gets_its_messages_in_the_order_they_matched_whatever_their_size) {
  for (const char* tl : {"shm", "tcp"}) {
    BOOST_TEST_CONTEXT(tl) {
      auto c = connect(config_with({tl}), config_with({tl}));
      BOOST_REQUIRE(!outcome(c.server, register_tag_atom::value, uint64_t{0x700}, uint64_t{~0xffull},
                             me()));
      constexpr uint64_t count = 60;
      auto length_of = [](uint64_t i) { return i % 6 == 0 ? size_t{512} << 10 : size_t{8 + i}; };
      for (uint64_t i = 0; i < count; ++i) {
        // Every sixth message goes by rendezvous and finishes after the small ones behind it.
        self->send(c.client_ep, tag_send_atom::value, 0x700 + i,
                   pattern(length_of(i), static_cast<uint8_t>(i)));
      }
      for (uint64_t i = 0; i < count; ++i) {
        expect_tag(0x700 + i, pattern(length_of(i), static_cast<uint8_t>(i)));
      }
      close_worker(c.client);
      close_worker(c.server);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_endpoint_route_wins_over_the_worker_route) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  auto relay = sys.spawn(relay_actor, me());
  BOOST_REQUIRE(!outcome(c.server, register_am_atom::value, uint16_t{3}, me()));
  BOOST_REQUIRE(!outcome(c.server_ep, register_am_atom::value, uint16_t{3}, relay));
  BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{3}, bytes{}, text("one")));
  self->receive([&](relay_atom, uint16_t id, bytes& p) {
                  BOOST_TEST(id == 3);
                  BOOST_TEST(text_of(p) == "one");
                },
                caf::after(timeout) >> [] { BOOST_FAIL("the endpoint route got nothing"); });
  BOOST_TEST(!outcome(c.server_ep, unregister_am_atom::value, uint16_t{3}));
  BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{3}, bytes{}, text("two")));
  expect_am(3, bytes{}, text("two"));
  // A handler that terminates loses its routes: the message is dropped, nothing breaks.
  BOOST_REQUIRE(!outcome(c.server_ep, register_am_atom::value, uint16_t{4}, relay));
  self->monitor(relay);
  caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
  down_reason(relay);
  BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{4}, bytes{}, text("lost")));
  BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{3}, bytes{}, text("three")));
  expect_am(3, bytes{}, text("three"));
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(a_rejected_request_fails_the_connect_with_rejected) {
  connection c;
  c.server = worker(config_with({"shm", "tcp"}), "server");
  c.client = worker(config_with({"shm", "tcp"}), "client");
  const caf::error err = try_connect(c, answer::reject);
  BOOST_TEST(status_of(err) == status::rejected);
  BOOST_TEST(text_of(c.request.private_data) == "hello");
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(an_unanswered_request_is_rejected_after_the_answer_timeout) {
  connection c;
  worker_config wc;
  wc.transport = config_with({"shm", "tcp"});
  wc.answer_timeout = std::chrono::milliseconds(300);
  c.server = *spawn_worker(sys, wc);
  c.client = worker(config_with({"shm", "tcp"}), "client");
  const caf::error err = try_connect(c, answer::never);
  BOOST_TEST(status_of(err) == status::rejected);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(closing_an_endpoint_ends_both_endpoint_actors) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  self->monitor(c.client_ep);
  self->monitor(c.server_ep);
  BOOST_TEST(!outcome(c.client_ep, close_atom::value));
  BOOST_TEST(!down_reason(c.client_ep));
  BOOST_TEST(status_of(down_reason(c.server_ep)) == status::not_connected);
  // A closed endpoint actor is gone: requests to it fail, they do not hang.
  const caf::error err = outcome(c.client_ep, tag_send_atom::value, uint64_t{1}, text("x"));
  BOOST_TEST((err == caf::sec::request_receiver_down));
  // The listener still accepts new connections.
  const std::string address = ask<std::string>(c.listener, address_atom::value);
  caf::actor again;
  self->request(c.client, timeout, connect_atom::value, address, bytes{})
      .receive([&](caf::actor& ep, bytes&) { again = ep; },
               [&](caf::error& e) { BOOST_FAIL(sys.render(e)); });
  BOOST_TEST(static_cast<bool>(again));
  self->monitor(c.listener);
  BOOST_TEST(!outcome(c.listener, close_atom::value));
  BOOST_TEST(!down_reason(c.listener));
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(a_listener_closes_when_its_owner_terminates) {
  connection c;
  c.server = worker(config_with({"shm", "tcp"}), "server");
  c.client = worker(config_with({"shm", "tcp"}), "client");
  c.owner = sys.spawn(owner_actor, me(), answer::accept);
  c.listener = ask<caf::actor>(c.server, listen_atom::value, std::string("127.0.0.1:0"), c.owner);
  const std::string address = ask<std::string>(c.listener, address_atom::value);
  self->monitor(c.listener);
  caf::anon_send_exit(c.owner, caf::exit_reason::user_shutdown);
  BOOST_TEST(!down_reason(c.listener));
  caf::error err;
  self->request(c.client, timeout, connect_atom::value, address, bytes{})
      .receive([&](caf::actor&, bytes&) {}, [&](caf::error& e) { err = std::move(e); });
  BOOST_TEST(status_of(err) == status::unreachable);
  close_worker(c.client);
  close_worker(c.server);
}

BOOST_AUTO_TEST_CASE(bad_input_is_answered_with_errors) {
  auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
  const bytes huge_header(1 << 20, 1);
  BOOST_TEST(status_of(outcome(c.client_ep, am_send_atom::value, uint16_t{7}, huge_header,
                               bytes{})) == status::invalid_param);
  BOOST_TEST(status_of(outcome(c.server, register_am_atom::value, uint16_t{7}, caf::actor{})) ==
             status::invalid_param);
  BOOST_TEST(status_of(outcome(c.server, unregister_am_atom::value, uint16_t{77})) ==
             status::no_elem);
  BOOST_TEST(status_of(outcome(c.server_ep, unregister_am_atom::value, uint16_t{77})) ==
             status::no_elem);
  // An AM nobody routes is dropped at the receiver; the connection keeps working.
  BOOST_TEST(!outcome(c.client_ep, am_send_atom::value, uint16_t{99}, bytes{}, text("nobody")));
  exchange_tags(c, 64);
  // Addresses that do not parse or resolve, nobody listening, a port in use.
  auto connect_error = [&](const std::string& address) {
    caf::error err;
    self->request(c.client, timeout, connect_atom::value, address, bytes{})
        .receive([&](caf::actor&, bytes&) {}, [&](caf::error& e) { err = std::move(e); });
    return status_of(err);
  };
  BOOST_TEST(connect_error("no-such-host.invalid:1") == status::unreachable);
  BOOST_TEST(connect_error("127.0.0.1:port") == status::invalid_addr);
  BOOST_TEST(connect_error("not an address") == status::invalid_addr);
  const std::string address = ask<std::string>(c.listener, address_atom::value);
  auto busy = worker(config_with({"shm", "tcp"}), "busy");
  caf::error listen_err;
  self->request(busy, timeout, listen_atom::value, address, c.owner)
      .receive([&](caf::actor&) {}, [&](caf::error& e) { listen_err = std::move(e); });
  BOOST_TEST(status_of(listen_err) == status::busy);
  self->request(busy, timeout, listen_atom::value, std::string("127.0.0.1:0"), caf::actor{})
      .receive([&](caf::actor&) {}, [&](caf::error& e) { listen_err = std::move(e); });
  BOOST_TEST(status_of(listen_err) == status::invalid_param);
  close_worker(busy);
  close_worker(c.server);
  BOOST_TEST(connect_error(address) == status::unreachable);
  close_worker(c.client);
}

BOOST_AUTO_TEST_CASE(a_worker_exit_releases_its_endpoints_listeners_and_descriptors) {
  const size_t before = comm::test::open_fds();
  for (int round = 0; round < 3; ++round) {
    auto c = connect(config_with({"shm", "tcp"}), config_with({"shm", "tcp"}));
    exchange_tags(c, 1 << 20);
    std::vector<caf::actor_addr> io_actors;
    for (const caf::actor& a : {c.server_ep, c.client_ep, c.listener}) {
      self->monitor(a);
      io_actors.push_back(a.address());
    }
    // The client closes on request; the server exits on an exit message, or when the last
    // handle to it is dropped.
    close_worker(c.client);
    self->monitor(c.server);
    const caf::actor_addr server = c.server.address();
    if (round == 2) {
      c.server = nullptr;
    } else {
      caf::anon_send_exit(c.server, caf::exit_reason::user_shutdown);
    }
    const caf::error reason = down_reason(server);
    BOOST_TEST((reason != caf::sec::request_timeout), "the server worker exited");
    for (const caf::actor_addr& a : io_actors) {
      BOOST_TEST((down_reason(a) != caf::sec::request_timeout), "an io actor exited with its worker");
    }
    const caf::error err = outcome(c.server_ep, flush_atom::value);
    BOOST_TEST((err == caf::sec::request_receiver_down));
  }
  size_t after = comm::test::open_fds();
  for (int i = 0; i < 100 && after > before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    after = comm::test::open_fds();
  }
  BOOST_TEST(after == before);
}

BOOST_AUTO_TEST_SUITE_END()

// -- two processes ---------------------------------------------------------------------------------

namespace {

/// The child: connects to `address`, sends AM 3 (1 MiB) and a tagged message, and expects the
/// parent's answer (AM 4) through its reply endpoint.
int run_client(const std::string& address) {
  io_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  worker_config wc;
  wc.transport = config_with({"shm", "tcp"});
  wc.worker.name = "child";
  auto w = spawn_worker(sys, wc);
  CHILD_CHECK(w);
  caf::actor ep;
  self->request(*w, timeout, connect_atom::value, address, text("child"))
      .receive([&](caf::actor& e, bytes&) { ep = e; }, [&](caf::error&) {});
  CHILD_CHECK(ep);
  bool ok = false;
  self->request(*w, timeout, register_am_atom::value, uint16_t{4}, caf::actor_cast<caf::actor>(self))
      .receive([&](ok_atom) { ok = true; }, [&](caf::error&) {});
  CHILD_CHECK(ok);
  ok = false;
  self->request(ep, timeout, am_send_atom::value, uint16_t{3}, text("h"), pattern(1 << 20, 3))
      .receive([&](ok_atom) { ok = true; }, [&](caf::error&) {});
  CHILD_CHECK(ok);
  bytes answer;
  self->receive([&](am_atom, uint16_t, bytes&, bytes& p, caf::actor&) { answer = std::move(p); },
                caf::after(timeout) >> [] {});
  CHILD_CHECK(answer == pattern(3 << 20, 4));
  ok = false;
  self->request(ep, timeout, tag_send_atom::value, uint64_t{42}, text("bye"))
      .receive([&](ok_atom) { ok = true; }, [&](caf::error&) {});
  CHILD_CHECK(ok);
  self->request(ep, timeout, flush_atom::value).receive([](ok_atom) {}, [](caf::error&) {});
  caf::anon_send_exit(*w, caf::exit_reason::user_shutdown);
  return 0;
}

/// Makes worker `w` listen on loopback (accepting every request) and route AM `id` to `self`.
/// @returns the listener's address, for a client process
std::string listen_for_am(caf::scoped_actor& self, const caf::actor& w, uint16_t id) {
  auto me = caf::actor_cast<caf::actor>(self);
  auto owner = self->home_system().spawn(owner_actor, me, answer::accept);
  caf::actor listener;
  auto fail = [&](caf::error& e) { BOOST_FAIL(self->home_system().render(e)); };
  self->request(w, timeout, listen_atom::value, std::string("127.0.0.1:0"), owner)
      .receive([&](caf::actor& l) { listener = l; }, fail);
  self->request(w, timeout, register_am_atom::value, id, me).receive([](ok_atom) {}, fail);
  std::string address;
  self->request(listener, timeout, address_atom::value)
      .receive([&](std::string& a) { address = a; }, fail);
  return address;
}

/// A child that connects to `address` over `tl`, says hello with AM 3, then waits to be killed.
int run_victim(const std::string& address, const char* tl) {
  io_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  worker_config wc;
  wc.transport = config_with({tl});
  wc.worker.name = "victim";
  auto w = spawn_worker(sys, wc);
  CHILD_CHECK(w);
  caf::actor ep;
  self->request(*w, timeout, connect_atom::value, address, text("victim"))
      .receive([&](caf::actor& e, bytes&) { ep = e; }, [&](caf::error&) {});
  CHILD_CHECK(ep);
  bool ok = false;
  self->request(ep, timeout, am_send_atom::value, uint16_t{3}, bytes{}, text("hello"))
      .receive([&](ok_atom) { ok = true; }, [&](caf::error&) {});
  CHILD_CHECK(ok);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // killed long before
  return 3;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_peer_killed_with_sigkill_ends_its_endpoint_actor) {
  for (const char* tl : {"shm", "tcp"}) {
    BOOST_TEST_CONTEXT(tl) {
      comm::test::channel to_child;
      const pid_t child = comm::test::fork_child([&] {
        std::vector<uint8_t> address;
        if (!to_child.receive(&address)) return 2;
        return run_victim(std::string(address.begin(), address.end()), tl);
      });
      io_config cfg;
      caf::actor_system sys{cfg};
      caf::scoped_actor self{sys};
      worker_config wc;
      wc.transport = config_with({tl});
      auto w = spawn_worker(sys, wc);
      BOOST_REQUIRE(w);
      to_child.send(text(listen_for_am(self, *w, 3)));
      caf::actor peer_ep;
      self->receive([&](am_atom, uint16_t, bytes&, bytes&, caf::actor& r) { peer_ep = r; },
                    caf::after(timeout) >> [] {});
      BOOST_REQUIRE(peer_ep);
      self->monitor(peer_ep);
      ::kill(child, SIGKILL);
      BOOST_TEST(comm::test::wait_child(child) != 0);
      caf::error reason = caf::make_error(caf::sec::request_timeout);
      self->receive([&](caf::down_msg& down) { reason = std::move(down.reason); },
                    caf::after(timeout) >> [] {});
      BOOST_TEST_INFO("endpoint actor ended with " << sys.render(reason));
      BOOST_TEST((status_of(reason) == status::connection_reset ||
                  status_of(reason) == status::not_connected));
      // The dead endpoint takes no more work; the worker goes on serving.
      caf::error late;
      self->request(peer_ep, timeout, am_send_atom::value, uint16_t{3}, bytes{}, text("x"))
          .receive([](ok_atom) {}, [&](caf::error& e) { late = std::move(e); });
      BOOST_TEST((late == caf::sec::request_receiver_down));
      self->request(*w, timeout, info_atom::value)
          .receive([](std::string&) {}, [&](caf::error& e) { BOOST_FAIL(sys.render(e)); });
      caf::anon_send_exit(*w, caf::exit_reason::user_shutdown);
    }
  }
}

BOOST_AUTO_TEST_CASE(two_processes_exchange_through_worker_actors) {
  comm::test::channel to_child;
  const pid_t child = comm::test::fork_child([&] {
    std::vector<uint8_t> address;
    if (!to_child.receive(&address)) return 2;
    return run_client(std::string(address.begin(), address.end()));
  });
  {
    io_config cfg;
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    worker_config wc;
    wc.transport = config_with({"shm", "tcp"});
    auto w = spawn_worker(sys, wc);
    BOOST_REQUIRE(w);
    to_child.send(text(listen_for_am(self, *w, 3)));
    caf::actor reply;
    self->receive(
        [&](am_atom, uint16_t id, bytes&, bytes& p, caf::actor& r) {
          BOOST_TEST(id == 3);
          BOOST_TEST((p == pattern(1 << 20, 3)));
          reply = r;
        },
        caf::after(timeout) >> [] {});
    BOOST_REQUIRE(reply);
    self->request(reply, timeout, am_send_atom::value, uint16_t{4}, bytes{}, pattern(3 << 20, 4))
        .receive([](ok_atom) {}, [&](caf::error& e) { BOOST_FAIL(sys.render(e)); });
    self->request(*w, timeout, tag_recv_atom::value, uint64_t{42}, comm::tag_mask_full)
        .receive([&](tag_atom, uint64_t, bytes& p) { BOOST_TEST(text_of(p) == "bye"); },
                 [&](caf::error& e) { BOOST_FAIL(sys.render(e)); });
    BOOST_TEST(comm::test::wait_child(child) == 0);
    // The child's worker closed its endpoint when it exited: ours ends with not_connected.
    BOOST_REQUIRE(reply);
    self->monitor(reply);
    caf::error reason = caf::make_error(caf::sec::request_timeout);
    self->receive([&](caf::down_msg& down) { reason = std::move(down.reason); },
                  caf::after(timeout) >> [] {});
    BOOST_TEST(status_of(reason) == status::not_connected);
    caf::anon_send_exit(*w, caf::exit_reason::user_shutdown);
  }
}
