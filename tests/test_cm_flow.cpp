// The client-server flow of UCT (seed 001) driven directly on tl::cm, over every transport with a
// connection manager here: tcp over 127.0.0.1 and ::1, and verbs on the verbs test device (a
// software stand-in for RDMA hardware, installed by verbs_test_fabric.cpp; nothing measured here
// says anything about RDMA). Resolve, then connect; a pack callback that sees the device name and
// refuses; query and its limits; the client's and the server's notify; disconnect from either
// side with both callbacks, and none for a connection not yet connected; a listener's user_data
// and backlog; reject; a server that never answers; a peer that dies mid-handshake
// (a process killed for tcp; for verbs, whose test device lives in this process only, its
// connection manager destroyed, which the test device shows as its process exiting). Every case
// checks that nothing leaks: descriptors, and the test device's objects.
// Every wait is bounded in rounds and time; nothing asserts on timing.
#define BOOST_TEST_MODULE cm_flow
#include "process_harness.hpp"
#include "test_util.hpp"
#include "transport_list.hpp"

#include "verbs/testdev/testdev.hpp"

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace comm;
using comm::test::channel;
using comm::test::fork_child;
using comm::test::wait_child;

namespace cm_flow_test {

namespace td = comm::verbs::testdev;
using clock_type = std::chrono::steady_clock;

// -- where each transport's connection manager is reached here -----------------------------------

/// One way to reach a transport's connection manager on this machine.
struct cm_place {
  std::string transport;  ///< the component
  std::string host;       ///< how a client names the server's host: "127.0.0.1", "[::1]"
  std::string nowhere;    ///< an address that does not resolve to a route here
};

/// The places of `transport`: loopback of both families for tcp, the verbs test fabric's first
/// device (verbs_test_fabric.cpp) for verbs. A transport with a connection manager but no place
/// here gets one with an empty host: its cases fail, naming it.
std::vector<cm_place> places_of(const std::string& transport) {
  if (transport == "tcp") {
    // A link-local address without its interface cannot be routed.
    return {{"tcp", "127.0.0.1", "[fe80::1]:7"}, {"tcp", "[::1]", "[fe80::1]:7"}};
  }
  if (transport == "verbs") return {{"verbs", "10.0.0.1", "10.9.9.9:7"}};
  return {{transport, "", ""}};
}

/// True when `component` opens a connection manager.
bool has_cm(tl::component& component) {
  struct ignore final : tl::cm_handler {
    void on_request(tl::cm_listener*, std::unique_ptr<tl::cm_conn>, const uint8_t*,
                    size_t) override {}
    void on_established(tl::cm_conn*, const uint8_t*, size_t) override {}
    void on_failed(tl::cm_conn*, status) override {}
  } events;
  tl::cm_params params;
  params.handler = &events;
  std::unique_ptr<tl::cm> made;
  return component.open_cm(params, made) == status::ok;
}

/// "tcp 127.0.0.1", "tcp [::1]", "verbs 10.0.0.1": every place of every transport under test
/// that has a connection manager.
std::vector<std::string> place_names() {
  std::vector<std::string> names;
  for (const std::string& name : comm::test::transports_under_test()) {
    tl::component* component = comm::test::find_component(name);
    if (component == nullptr || !has_cm(*component)) continue;
    for (const cm_place& p : places_of(name)) names.push_back(name + " " + p.host);
  }
  return names;
}

cm_place place_named(const std::string& name) {
  const std::string transport = name.substr(0, name.find(' '));
  for (const cm_place& p : places_of(transport)) {
    if (transport + " " + p.host == name) return p;
  }
  return {transport, "", ""};
}

// -- what the callbacks saw -----------------------------------------------------------------------

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

tl::cm_private_data given(const std::vector<uint8_t>& bytes) {
  tl::cm_private_data data;
  data.data = bytes.data();
  data.length = bytes.size();
  return data;
}

tl::cm_private_data packed() {
  tl::cm_private_data data;
  data.pack = true;
  return data;
}

/// The callbacks of one flow connection, recorded; what some of them do is set beforehand.
struct flow_log final : tl::cm_flow_handler {
  // what the callbacks do
  status resolve_answer = status::ok;       ///< on_resolved returns this
  std::function<void(tl::cm_conn*)> then;   ///< runs at the end of on_resolved / on_connect
  status pack_refusal = status::ok;         ///< pack_private_data refuses with this unless ok
  std::vector<uint8_t> pack_bytes;          ///< else writes these (the device name when empty)

  // what they saw
  int resolves = 0;
  std::string resolved_device;
  status resolve_result = status::ok;
  int packs = 0;
  std::string pack_device;
  int connects = 0;
  status connect_result = status::ok;
  std::vector<uint8_t> connect_data;
  int notifies = 0;
  status notify_result = status::ok;
  int disconnects = 0;

  status on_resolved(tl::cm_conn* conn, std::string_view device, status result) override {
    ++resolves;
    resolved_device = device;
    resolve_result = result;
    if (then && result == status::ok) then(conn);
    return resolve_answer;
  }
  ssize_t pack_private_data(tl::cm_conn*, std::string_view device, uint8_t* dest,
                            size_t room) override {
    ++packs;
    pack_device = device;
    if (pack_refusal != status::ok) return static_cast<ssize_t>(pack_refusal);
    const std::vector<uint8_t> bytes =
        pack_bytes.empty() ? bytes_of(std::string(device)) : pack_bytes;
    if (bytes.size() > room) return static_cast<ssize_t>(status::exceeds_limit);
    std::copy(bytes.begin(), bytes.end(), dest);
    return static_cast<ssize_t>(bytes.size());
  }
  void on_connect(tl::cm_conn* conn, status result, const uint8_t* data, size_t length) override {
    ++connects;
    connect_result = result;
    connect_data.assign(data, data + length);
    if (then && result == status::ok) then(conn);
  }
  void on_notify(tl::cm_conn*, status result) override {
    ++notifies;
    notify_result = result;
  }
  void on_disconnect(tl::cm_conn*) override { ++disconnects; }
};

/// The connection manager's own events: requests kept for the test; the short handshake's
/// outcomes counted (a flow never reports them).
struct requests final : tl::cm_handler {
  void on_request(tl::cm_listener* from, std::unique_ptr<tl::cm_conn> conn, const uint8_t* data,
                  size_t length) override {
    listener_data.push_back(from == nullptr ? nullptr : from->user_data);
    conns.push_back(std::move(conn));
    data_seen.emplace_back(data, data + length);
  }
  void on_established(tl::cm_conn*, const uint8_t*, size_t) override { ++short_outcomes; }
  void on_failed(tl::cm_conn*, status) override { ++short_outcomes; }

  std::vector<std::unique_ptr<tl::cm_conn>> conns;
  std::vector<std::vector<uint8_t>> data_seen;
  std::vector<void*> listener_data;  ///< the user_data of the listener each request came to
  int short_outcomes = 0;
};

// -- a server and a client connection manager ----------------------------------------------------

/// Descriptors and test-device objects held now, to compare with at the end of a case.
struct leak_check {
  size_t fds = comm::test::open_fds();
  size_t objects = td::live_objects();
  bool none() const {
    const size_t fds_now = comm::test::open_fds(), objects_now = td::live_objects();
    if (fds_now != fds || objects_now != objects) {
      BOOST_TEST_MESSAGE("descriptors " << fds << " -> " << fds_now << ", test device objects "
                                        << objects << " -> " << objects_now);
    }
    return fds_now == fds && objects_now == objects;
  }
};

tl::component& component_of(const cm_place& place) {
  tl::component* c = comm::test::find_component(place.transport);
  BOOST_REQUIRE(c != nullptr);
  return *c;
}

std::unique_ptr<tl::cm> open_cm(const cm_place& place, tl::cm_handler& events) {
  tl::cm_params params;
  params.handler = &events;
  std::unique_ptr<tl::cm> made;
  BOOST_REQUIRE(component_of(place).open_cm(params, made) == status::ok);
  return made;
}

/// A listening server and a client connection manager at `place`.
struct cm_pair {
  explicit cm_pair(const cm_place& where) : place(where) {
    BOOST_REQUIRE_MESSAGE(!place.host.empty(),
                          place.transport << " has a connection manager but the test knows no "
                                             "address to reach it at: add it to places_of()");
    server = open_cm(place, server_events);
    client = open_cm(place, client_events);
    const std::string any = place.host + ":0";
    BOOST_REQUIRE(server->listen(any, 16, listener) == status::ok);
  }

  /// The listener's address as a client gives it.
  std::string address() const { return place.host + ":" + std::to_string(listener->port()); }

  /// Progresses both until `done()` holds (at most `seconds`); false when it never did.
  bool progress_until(const std::function<bool()>& done, double seconds = 10) {
    const auto deadline = clock_type::now() + std::chrono::duration<double>(seconds);
    for (uint64_t round = 0; round < 20'000'000; ++round) {
      if (server) server->progress();
      if (client) client->progress();
      if (done()) return true;
      if ((round & 63) == 0 && clock_type::now() > deadline) return false;
    }
    return false;
  }

  /// Progresses both for `ms` milliseconds.
  void progress_for(int ms) {
    progress_until([] { return false; }, ms / 1000.0);
  }

  /// Starts a client flow connection with `log`.
  tl::cm_conn* resolve(flow_log& log, int timeout_ms = 5000) {
    tl::cm_client_params params;
    params.address = address();
    params.handler = &log;
    params.timeout_ms = timeout_ms;
    tl::cm_conn* conn = nullptr;
    BOOST_REQUIRE(client->resolve(params, &conn) == status::ok);
    BOOST_REQUIRE(conn != nullptr);
    return conn;
  }

  /// Resolves and connects with `data`; waits until the server holds the request.
  tl::cm_conn* request(flow_log& log, const std::vector<uint8_t>& data, int timeout_ms = 5000) {
    tl::cm_conn* conn = resolve(log, timeout_ms);
    BOOST_REQUIRE(progress_until([&] { return log.resolves == 1; }));
    BOOST_REQUIRE_EQUAL(log.resolve_result, status::ok);
    const size_t before = server_events.conns.size();
    BOOST_REQUIRE_EQUAL(conn->connect(given(data)), status::ok);
    BOOST_REQUIRE(progress_until([&] { return server_events.conns.size() > before; }));
    return conn;
  }

  /// Answers the latest request with `reply` under `log`.
  tl::cm_conn* answer(flow_log& log, const std::vector<uint8_t>& reply, int timeout_ms = 5000) {
    BOOST_REQUIRE(!server_events.conns.empty());
    tl::cm_server_params params;
    params.handler = &log;
    params.reply = given(reply);
    params.timeout_ms = timeout_ms;
    tl::cm_conn* conn = nullptr;
    BOOST_REQUIRE(server->accept_flow(std::move(server_events.conns.back()), params, &conn) ==
                  status::ok);
    server_events.conns.pop_back();
    return conn;
  }

  /// A connection both sides call established: requested, answered, notified.
  void establish(flow_log& client_log, flow_log& server_log, tl::cm_conn** client_conn,
                 tl::cm_conn** server_conn) {
    *client_conn = request(client_log, bytes_of("request"));
    *server_conn = answer(server_log, bytes_of("reply"));
    BOOST_REQUIRE(progress_until([&] { return client_log.connects == 1; }));
    BOOST_REQUIRE_EQUAL(client_log.connect_result, status::ok);
    BOOST_REQUIRE_EQUAL((*client_conn)->notify(), status::ok);
    BOOST_REQUIRE(progress_until([&] { return server_log.notifies == 1; }));
    BOOST_REQUIRE_EQUAL(server_log.notify_result, status::ok);
  }

  /// Destroys the connection managers (the listener first).
  void reset() {
    listener.reset();
    server_events.conns.clear();
    server.reset();
    client.reset();
  }

  cm_place place;
  requests server_events, client_events;
  std::unique_ptr<tl::cm> server, client;
  std::unique_ptr<tl::cm_listener> listener;
};

/// True when `device` is one of the devices of `place`'s transport.
bool is_device_of(const cm_place& place, const std::string& device) {
  const auto devices = component_of(place).devices();
  return std::find(devices.begin(), devices.end(), device) != devices.end();
}

/// True when `st` is how a connection ends when its peer dies mid-handshake.
bool peer_death(status st) {
  return st == status::connection_reset || st == status::rejected || st == status::unreachable ||
         st == status::endpoint_timeout;
}

const auto places = boost::unit_test::data::make(place_names());

/// Resolves once at every place before the cases run, so that what a transport makes once per
/// process and keeps (the test device's rdmacm context of a device, with its descriptor) is not
/// counted as a case's leak.
struct first_use {
  first_use() {
    for (const std::string& name : place_names()) {
      const cm_place place = place_named(name);
      if (place.host.empty()) continue;
      cm_pair p(place);
      flow_log log;
      tl::cm_conn* conn = p.resolve(log);
      p.progress_until([&] { return log.resolves == 1; });
      p.client->close(conn);
    }
  }
};

}  // namespace cm_flow_test

using namespace cm_flow_test;

BOOST_TEST_GLOBAL_FIXTURE(first_use);

BOOST_AUTO_TEST_CASE(every_transport_with_a_connection_manager_is_covered) {
  const auto names = place_names();
  for (const std::string& name : names) BOOST_TEST_MESSAGE("cm flow over " << name);
  BOOST_TEST(!names.empty());
  for (const auto& [name, why] : comm::test::transports_skipped()) {
    BOOST_TEST_MESSAGE("skipped " << name << ": " << why);
  }
}

BOOST_DATA_TEST_CASE(resolve_connect_answer_and_both_notifies, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    const tl::cm_attr attr = p.client->query();
    BOOST_TEST(attr.max_conn_priv >= 52u);
    BOOST_TEST(attr.max_reply_priv >= attr.max_conn_priv);
    BOOST_TEST(p.listener->address() == p.address());

    flow_log client_log, server_log;
    tl::cm_conn* c = p.resolve(client_log);
    // Nothing is resolved before progress: the steps that need it are refused as busy.
    const auto hello = bytes_of("request");
    BOOST_TEST(c->connect(given(hello)) == status::busy);
    BOOST_TEST(c->notify() == status::busy);
    BOOST_TEST(c->disconnect() == status::busy);
    BOOST_REQUIRE(p.progress_until([&] { return client_log.resolves == 1; }));
    BOOST_TEST(client_log.resolve_result == status::ok);
    BOOST_TEST(is_device_of(p.place, client_log.resolved_device), client_log.resolved_device);
    BOOST_TEST(c->device_name() == client_log.resolved_device);

    BOOST_REQUIRE(c->connect(given(hello)) == status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() == 1; }));
    BOOST_TEST(p.server_events.data_seen[0] == hello);
    BOOST_TEST(p.listener->requests() == 1u);
    BOOST_TEST(is_device_of(p.place, p.server_events.conns[0]->device_name()));
    BOOST_TEST(!p.server_events.conns[0]->peer_address().empty());
    BOOST_TEST(c->disconnect() == status::busy);  // not connected until the server answers

    tl::cm_conn* s = p.answer(server_log, bytes_of("reply"));
    BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
    BOOST_TEST(client_log.connect_result == status::ok);
    BOOST_TEST(client_log.connect_data == bytes_of("reply"));
    p.progress_for(50);
    BOOST_TEST(server_log.notifies == 0);  // the server waits for the client's notify
    BOOST_TEST(s->disconnect() == status::busy);

    BOOST_TEST(c->notify() == status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
    BOOST_TEST(server_log.notify_result == status::ok);
    p.progress_for(50);
    BOOST_TEST(client_log.disconnects + server_log.disconnects == 0);
    BOOST_TEST(client_log.connects == 1);
    BOOST_TEST(server_log.notifies == 1);
    BOOST_TEST(p.server_events.short_outcomes + p.client_events.short_outcomes == 0);
    p.client->close(c);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(disconnect_from_either_side_tells_both, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    for (const bool client_first : {true, false}) {
      BOOST_TEST_CONTEXT((client_first ? "the client" : "the server") << " disconnects first") {
        flow_log client_log, server_log;
        tl::cm_conn *c = nullptr, *s = nullptr;
        p.establish(client_log, server_log, &c, &s);
        tl::cm_conn* first = client_first ? c : s;
        tl::cm_conn* second = client_first ? s : c;
        flow_log& first_log = client_first ? client_log : server_log;
        flow_log& second_log = client_first ? server_log : client_log;
        BOOST_TEST(first->disconnect() == status::in_progress);
        BOOST_TEST(first->disconnect() == status::not_connected);  // already disconnecting
        BOOST_REQUIRE(p.progress_until([&] { return second_log.disconnects == 1; }));
        BOOST_TEST(second->disconnect() == status::ok);  // answers: both are done
        BOOST_REQUIRE(p.progress_until([&] { return first_log.disconnects == 1; }));
        BOOST_TEST(first->disconnect() == status::not_connected);
        BOOST_TEST(second->disconnect() == status::not_connected);
        BOOST_TEST(second->notify() != status::ok);
        p.progress_for(50);
        BOOST_TEST(first_log.disconnects == 1);  // once each
        BOOST_TEST(second_log.disconnects == 1);
        p.client->close(c);
        p.server->close(s);
      }
    }
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(closing_a_connected_side_tells_its_peer, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    for (const bool close_client : {true, false}) {
      flow_log client_log, server_log;
      tl::cm_conn *c = nullptr, *s = nullptr;
      p.establish(client_log, server_log, &c, &s);
      if (close_client) {
        p.client->close(c);
        BOOST_REQUIRE(p.progress_until([&] { return server_log.disconnects == 1; }));
        BOOST_TEST(s->disconnect() == status::ok);  // the peer is gone: nothing to wait for
        p.server->close(s);
      } else {
        p.server->close(s);
        BOOST_REQUIRE(p.progress_until([&] { return client_log.disconnects == 1; }));
        BOOST_TEST(c->disconnect() == status::ok);
        p.client->close(c);
      }
      p.progress_for(20);
      BOOST_TEST((close_client ? client_log : server_log).disconnects == 0);  // closed: untold
    }
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(callbacks_may_take_the_next_step_themselves, places, name) {
  // As UCP does: connect from on_resolved, notify from on_connect.
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log client_log, server_log;
    const auto hello = bytes_of("from the callback");
    status connect_status = status::no_elem;
    status notify_status = status::no_elem;
    client_log.then = [&](tl::cm_conn* conn) {
      if (client_log.connects == 0) {
        connect_status = conn->connect(given(hello));
      } else {
        notify_status = conn->notify();
      }
    };
    tl::cm_conn* c = p.resolve(client_log);
    BOOST_REQUIRE(p.progress_until([&] { return !p.server_events.conns.empty(); }));
    BOOST_TEST(connect_status == status::ok);
    BOOST_TEST(p.server_events.data_seen[0] == hello);
    tl::cm_conn* s = p.answer(server_log, {});
    BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
    BOOST_TEST(notify_status == status::ok);
    BOOST_TEST(client_log.connect_data.empty());
    p.client->close(c);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_pack_callback_sees_the_device_and_its_refusal_fails_the_connect, places,
                     name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    // Packing: the request carries what the callback wrote for the device it was given.
    flow_log packing;
    tl::cm_conn* c = p.resolve(packing);
    BOOST_REQUIRE(p.progress_until([&] { return packing.resolves == 1; }));
    BOOST_REQUIRE(c->connect(packed()) == status::ok);
    BOOST_TEST(packing.packs == 1);
    BOOST_TEST(packing.pack_device == packing.resolved_device);
    BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() == 1; }));
    BOOST_TEST(p.server_events.data_seen[0] == bytes_of(packing.resolved_device));
    p.server_events.conns.clear();  // rejected
    BOOST_REQUIRE(p.progress_until([&] { return packing.connects == 1; }));
    BOOST_TEST(packing.connect_result == status::rejected);
    p.client->close(c);

    // Refusing: connect fails with the callback's status, and that connection is over.
    flow_log refusing;
    refusing.pack_refusal = status::canceled;
    tl::cm_conn* r = p.resolve(refusing);
    BOOST_REQUIRE(p.progress_until([&] { return refusing.resolves == 1; }));
    BOOST_TEST(r->connect(packed()) == status::canceled);
    BOOST_TEST(refusing.packs == 1);
    BOOST_TEST(is_device_of(p.place, refusing.pack_device));
    BOOST_TEST(r->connect(given(bytes_of("again"))) == status::not_connected);
    BOOST_TEST(r->notify() == status::not_connected);
    BOOST_TEST(r->disconnect() == status::not_connected);
    p.progress_for(100);
    BOOST_TEST(refusing.connects == 0);  // nothing more is told
    BOOST_TEST(p.server_events.conns.empty());
    BOOST_TEST(p.listener->requests() == 1u);  // only the first one reached the server
    p.client->close(r);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_server_pack_callback_that_refuses_rejects_the_client, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log client_log, server_log;
    tl::cm_conn* c = p.request(client_log, bytes_of("request"));
    const std::string server_device = p.server_events.conns.back()->device_name();
    server_log.pack_refusal = status::canceled;
    tl::cm_server_params params;
    params.handler = &server_log;
    params.reply = packed();
    tl::cm_conn* s = nullptr;
    BOOST_TEST(p.server->accept_flow(std::move(p.server_events.conns.back()), params, &s) ==
               status::canceled);
    BOOST_TEST(server_log.packs == 1);
    BOOST_TEST(server_log.pack_device == server_device);
    BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
    BOOST_TEST(client_log.connect_result == status::rejected);
    BOOST_TEST(server_log.notifies == 0);

    // A server that packs its answer: the client gets what it wrote for its device.
    flow_log again, packing;
    tl::cm_conn* c2 = p.request(again, bytes_of("request"));
    params.handler = &packing;
    BOOST_REQUIRE(p.server->accept_flow(std::move(p.server_events.conns.back()), params, &s) ==
                  status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return again.connects == 1; }));
    BOOST_TEST(again.connect_result == status::ok);
    BOOST_TEST(again.connect_data == bytes_of(packing.pack_device));
    BOOST_TEST(is_device_of(p.place, packing.pack_device));
    p.client->close(c);
    p.client->close(c2);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(query_gives_the_private_data_limits_both_ways, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    const tl::cm_attr attr = p.client->query();
    BOOST_TEST(p.server->query().max_conn_priv == attr.max_conn_priv);
    const std::vector<uint8_t> largest(attr.max_conn_priv, 0x5a);
    const std::vector<uint8_t> too_long(attr.max_conn_priv + 1, 0x5a);

    flow_log client_log, server_log;
    tl::cm_conn* c = p.resolve(client_log);
    BOOST_REQUIRE(p.progress_until([&] { return client_log.resolves == 1; }));
    BOOST_TEST(c->connect(given(too_long)) == status::exceeds_limit);
    BOOST_REQUIRE(c->connect(given(largest)) == status::ok);  // the limit itself goes through
    BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() == 1; }));
    BOOST_TEST(p.server_events.data_seen[0] == largest);

    tl::cm_server_params params;
    params.handler = &server_log;
    const std::vector<uint8_t> reply_too_long(attr.max_reply_priv + 1, 1);
    params.reply = given(reply_too_long);
    tl::cm_conn* s = nullptr;
    BOOST_TEST(p.server->accept_flow(std::move(p.server_events.conns.back()), params, &s) ==
               status::exceeds_limit);
    BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
    BOOST_TEST(client_log.connect_result == status::rejected);  // not answered: rejected

    flow_log second;
    tl::cm_conn* c2 = p.request(second, {});
    const std::vector<uint8_t> largest_reply(attr.max_reply_priv, 2);
    s = p.answer(server_log, largest_reply);
    BOOST_REQUIRE(p.progress_until([&] { return second.connects == 1; }));
    BOOST_TEST(second.connect_result == status::ok);
    BOOST_TEST(second.connect_data == largest_reply);
    p.client->close(c);
    p.client->close(c2);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_rejected_request_fails_the_client_with_rejected, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log client_log;
    tl::cm_conn* c = p.request(client_log, bytes_of("request"));
    p.server_events.conns.back()->reject();
    BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
    BOOST_TEST(client_log.connect_result == status::rejected);
    BOOST_TEST(c->notify() == status::not_connected);
    BOOST_TEST(c->disconnect() == status::not_connected);
    p.client->close(c);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(resolution_that_fails_or_is_refused_ends_the_connection, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log nowhere;
    tl::cm_client_params params;
    params.address = p.place.nowhere;
    params.handler = &nowhere;
    params.timeout_ms = 3000;
    tl::cm_conn* n = nullptr;
    BOOST_REQUIRE(p.client->resolve(params, &n) == status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return nowhere.resolves == 1; }));
    BOOST_TEST(nowhere.resolve_result == status::unreachable);
    BOOST_TEST(nowhere.resolved_device.empty());
    BOOST_TEST(n->connect(given({})) == status::not_connected);
    p.client->close(n);

    flow_log refused;
    refused.resolve_answer = status::canceled;
    tl::cm_conn* r = p.resolve(refused);
    BOOST_REQUIRE(p.progress_until([&] { return refused.resolves == 1; }));
    BOOST_TEST(r->connect(given({})) == status::not_connected);
    p.progress_for(50);
    BOOST_TEST(refused.connects == 0);
    BOOST_TEST(p.listener->requests() == 0u);
    p.client->close(r);

    params.handler = nullptr;
    BOOST_TEST(p.client->resolve(params, &n) == status::invalid_param);
    params.handler = &nowhere;
    params.address = "not an address:x";
    BOOST_TEST(p.client->resolve(params, &n) == status::invalid_addr);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_server_that_never_answers_times_the_client_out, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log client_log;
    tl::cm_conn* c = p.request(client_log, bytes_of("request"), 300);
    // The server holds the request and never answers.
    BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
    BOOST_TEST(client_log.connect_result == status::endpoint_timeout);
    p.server_events.conns.clear();  // too late: the client is told nothing more
    p.progress_for(50);
    BOOST_TEST(client_log.connects == 1);
    p.client->close(c);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_client_that_never_notifies_times_the_server_out, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    flow_log client_log, server_log;
    tl::cm_conn* c = p.request(client_log, bytes_of("request"));
    tl::cm_conn* s = p.answer(server_log, {}, 300);
    BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
    BOOST_TEST(server_log.notify_result == status::endpoint_timeout);
    BOOST_TEST(client_log.connects == 1);
    p.client->close(c);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_connection_not_yet_connected_is_never_told_on_disconnect, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    BOOST_TEST_CONTEXT("the client closes before the server answered") {
      flow_log client_log, server_log;
      tl::cm_conn* c = p.request(client_log, bytes_of("request"));
      p.client->close(c);
      tl::cm_conn* s = p.answer(server_log, bytes_of("reply"), 1000);
      BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
      BOOST_TEST(server_log.notify_result != status::ok);
      p.progress_for(100);
      BOOST_TEST(server_log.disconnects == 0);
      BOOST_TEST(server_log.notifies == 1);
      BOOST_TEST(client_log.connects + client_log.disconnects == 0, "closed: untold");
      p.server->close(s);
    }
    BOOST_TEST_CONTEXT("the client closes after on_connect, before it notifies") {
      flow_log client_log, server_log;
      tl::cm_conn* c = p.request(client_log, bytes_of("request"));
      tl::cm_conn* s = p.answer(server_log, bytes_of("reply"), 1000);
      BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
      BOOST_REQUIRE_EQUAL(client_log.connect_result, status::ok);
      p.client->close(c);
      BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
      BOOST_TEST(server_log.notify_result != status::ok);
      p.progress_for(100);
      BOOST_TEST(server_log.disconnects == 0, "the server never was connected");
      BOOST_TEST(client_log.disconnects == 0);
      p.server->close(s);
    }
    BOOST_TEST_CONTEXT("the server rejects") {
      flow_log client_log;
      tl::cm_conn* c = p.request(client_log, bytes_of("request"));
      p.server_events.conns.back()->reject();
      p.server_events.conns.clear();
      BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
      BOOST_TEST(client_log.connect_result == status::rejected);
      p.progress_for(100);
      BOOST_TEST(client_log.disconnects == 0);
      BOOST_TEST(c->disconnect() == status::not_connected, "over, never connected");
      p.client->close(c);
    }
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(a_listeners_user_data_comes_with_its_requests, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    std::unique_ptr<tl::cm_listener> second;
    BOOST_REQUIRE(p.server->listen(p.place.host + ":0", 16, second) == status::ok);
    int first_mark = 1, second_mark = 2;
    p.listener->user_data = &first_mark;
    second->user_data = &second_mark;
    const std::string second_address = p.place.host + ":" + std::to_string(second->port());
    for (const bool to_second : {true, false, true}) {
      flow_log log;
      tl::cm_client_params params;
      params.address = to_second ? second_address : p.address();
      params.handler = &log;
      log.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("hello"))); };
      tl::cm_conn* c = nullptr;
      BOOST_REQUIRE(p.client->resolve(params, &c) == status::ok);
      const size_t before = p.server_events.conns.size();
      BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() > before; }));
      BOOST_TEST(p.server_events.listener_data.back() ==
                 static_cast<void*>(to_second ? &second_mark : &first_mark));
      p.server_events.conns.clear();  // rejected
      BOOST_REQUIRE(p.progress_until([&] { return log.connects == 1; }));
      p.client->close(c);
    }
    BOOST_TEST(p.listener->requests() == 1u);
    BOOST_TEST(second->requests() == 2u);
    second.reset();
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

// -- the listen backlog ---------------------------------------------------------------------------

namespace cm_flow_test {

/// Plain TCP connects to `host` ("127.0.0.1" or "[::1]") and `port`, one after another, each
/// given up to `wait_ms` to complete while nobody accepts; returns how many completed. The
/// sockets are closed before it returns.
int plain_connects(const std::string& host, uint16_t port, int count, int wait_ms) {
  const bool v6 = host.front() == '[';
  sockaddr_storage to{};
  socklen_t length = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&to);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    ::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a->sin6_addr);
    length = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&to);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    ::inet_pton(AF_INET, host.c_str(), &a->sin_addr);
    length = sizeof(*a);
  }
  std::vector<int> fds;
  int completed = 0;
  for (int i = 0; i < count; ++i) {
    const int fd = ::socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), length) == 0) {
      ++completed;
      continue;
    }
    pollfd pfd{fd, POLLOUT, 0};
    int error = 0;
    socklen_t error_length = sizeof(error);
    if (::poll(&pfd, 1, wait_ms) == 1 &&
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_length) == 0 && error == 0) {
      ++completed;
    }
  }
  for (const int fd : fds) ::close(fd);
  return completed;
}

}  // namespace cm_flow_test

BOOST_DATA_TEST_CASE(the_listen_backlog_bounds_the_requests_waiting_to_be_taken, places, name) {
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    std::unique_ptr<tl::cm_listener> one, most;
    BOOST_REQUIRE(p.server->listen(p.place.host + ":0", 1, one) == status::ok);
    BOOST_REQUIRE(p.server->listen(p.place.host + ":0", 0, most) == status::ok);  // the maximum
    if (p.place.transport == "tcp") {
      // The backlog is the kernel's queue of connections the server has not taken yet (it takes
      // them in progress(), which nobody calls here): one waiting, and the one the kernel allows
      // beyond it; the others stay unanswered. Without a backlog all get through.
      BOOST_TEST(plain_connects(p.place.host, one->port(), 6, 300) <= 2);
      BOOST_TEST(plain_connects(p.place.host, most->port(), 6, 2000) == 6);
    } else {
      // verbs: requests handed over and not answered yet fill the backlog; one more is refused.
      flow_log held, refused;
      tl::cm_client_params params;
      params.address = p.place.host + ":" + std::to_string(one->port());
      params.handler = &held;
      held.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("first"))); };
      tl::cm_conn *a = nullptr, *b = nullptr;
      BOOST_REQUIRE(p.client->resolve(params, &a) == status::ok);
      BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() == 1; }));
      params.handler = &refused;
      refused.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("second"))); };
      BOOST_REQUIRE(p.client->resolve(params, &b) == status::ok);
      BOOST_REQUIRE(p.progress_until([&] { return refused.connects == 1; }));
      BOOST_TEST(refused.connect_result == status::rejected);
      BOOST_TEST(p.server_events.conns.size() == 1u);
      p.server_events.conns.clear();
      BOOST_REQUIRE(p.progress_until([&] { return held.connects == 1; }));
      p.client->close(a);
      p.client->close(b);
      // A backlog of 0 is the component's maximum (as rdma_listen's), not one: two requests
      // left unanswered both reach the server.
      flow_log first, second;
      params.address = p.place.host + ":" + std::to_string(most->port());
      params.handler = &first;
      first.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("one"))); };
      BOOST_REQUIRE(p.client->resolve(params, &a) == status::ok);
      params.handler = &second;
      second.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("two"))); };
      BOOST_REQUIRE(p.client->resolve(params, &b) == status::ok);
      BOOST_TEST(p.progress_until([&] { return p.server_events.conns.size() == 2; }));
      BOOST_TEST(first.connects == 0);
      BOOST_TEST(second.connects == 0);
      p.server_events.conns.clear();
      p.client->close(a);
      p.client->close(b);
    }
    // Once the server takes what waits, requests come through again.
    p.progress_for(100);
    p.server_events.conns.clear();
    flow_log later;
    tl::cm_client_params params;
    params.address = p.place.host + ":" + std::to_string(one->port());
    params.handler = &later;
    later.then = [](tl::cm_conn* conn) { conn->connect(given(bytes_of("later"))); };
    tl::cm_conn* c = nullptr;
    BOOST_REQUIRE(p.client->resolve(params, &c) == status::ok);
    BOOST_TEST(p.progress_until([&] { return !p.server_events.conns.empty(); }));
    p.server_events.conns.clear();
    BOOST_TEST(p.progress_until([&] { return later.connects == 1; }));
    BOOST_TEST(later.connect_result == status::rejected);
    p.client->close(c);
    one.reset();
    most.reset();
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

// -- a peer that dies mid-handshake ---------------------------------------------------------------

namespace cm_flow_test {

/// Runs a server at `place` in a child process: sends its port, holds the first request (or,
/// with `answer`, answers it and waits for a notify that the test never lets come), says so, and
/// waits to be killed.
int run_doomed_server(const cm_place& place, bool answer, const channel& out) {
  requests events;
  flow_log log;
  tl::cm_params params;
  params.handler = &events;
  std::unique_ptr<tl::cm> server;
  CHILD_CHECK(comm::test::find_component(place.transport)->open_cm(params, server) ==
              status::ok);
  std::unique_ptr<tl::cm_listener> listener;
  CHILD_CHECK(server->listen(place.host + ":0", 4, listener) == status::ok);
  out.send_word(listener->port());
  const auto until = clock_type::now() + std::chrono::seconds(20);
  while (events.conns.empty() && clock_type::now() < until) server->progress();
  CHILD_CHECK(!events.conns.empty());
  if (answer) {
    tl::cm_server_params reply;
    reply.handler = &log;
    tl::cm_conn* conn = nullptr;
    CHILD_CHECK(server->accept_flow(std::move(events.conns.back()), reply, &conn) == status::ok);
  }
  out.send_word(1);
  while (clock_type::now() < until) server->progress();  // until killed
  return 1;
}

}  // namespace cm_flow_test

BOOST_DATA_TEST_CASE(a_server_that_dies_mid_handshake_fails_the_client, places, name) {
  const cm_place place = place_named(name);
  for (const bool answered : {false, true}) {
    BOOST_TEST_CONTEXT("the server " << (answered ? "answered" : "held the request")) {
      leak_check leaks;
      flow_log client_log;
      tl::cm_conn* c = nullptr;
      if (comm::test::in_process_only_reason(place.transport).empty()) {
        // A real process, killed: its kernel closes its sockets.
        channel from_server;
        cm_pair p(place);
        p.listener.reset();
        const pid_t server =
            fork_child([&] { return run_doomed_server(place, answered, from_server); });
        uint64_t port = 0, word = 0;
        BOOST_REQUIRE(from_server.receive_word(&port));
        tl::cm_client_params params;
        params.address = place.host + ":" + std::to_string(port);
        params.handler = &client_log;
        client_log.then = [&](tl::cm_conn* conn) {
          if (client_log.connects == 0) (void)conn->connect(given(bytes_of("request")));
        };
        BOOST_REQUIRE(p.client->resolve(params, &c) == status::ok);
        BOOST_REQUIRE(p.progress_until([&] { return from_server.receive_word(&word, 0); }));
        if (answered) BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
        ::kill(server, SIGKILL);
        BOOST_TEST(wait_child(server) == -1);
        if (answered) {
          BOOST_REQUIRE(p.progress_until([&] { return client_log.disconnects == 1; }));
          BOOST_TEST(c->disconnect() == status::ok);  // the peer is gone already
        } else {
          BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
          BOOST_TEST(peer_death(client_log.connect_result), client_log.connect_result);
        }
        p.client->close(c);
        p.reset();
      } else {
        // The test device lives in this process: the server's connection manager goes away as
        // its process would (the test device closes its ids as a process exit does).
        cm_pair p(place);
        c = p.request(client_log, bytes_of("request"));
        flow_log server_log;
        if (answered) {
          p.answer(server_log, {});
          BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
        }
        p.listener.reset();
        p.server_events.conns.clear();
        p.server.reset();
        if (answered) {
          BOOST_REQUIRE(p.progress_until([&] { return client_log.disconnects == 1; }));
        } else {
          BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
          BOOST_TEST(peer_death(client_log.connect_result), client_log.connect_result);
        }
        p.client->close(c);
        p.reset();
      }
      BOOST_TEST(leaks.none());
    }
  }
}

namespace cm_flow_test {

/// Runs a client of the server at `address` in a child process: connects, says so once the
/// server answered (without notifying it), and waits to be killed.
int run_doomed_client(const cm_place& place, const std::string& address, const channel& out) {
  requests events;
  flow_log log;
  tl::cm_params params;
  params.handler = &events;
  std::unique_ptr<tl::cm> client;
  CHILD_CHECK(comm::test::find_component(place.transport)->open_cm(params, client) ==
              status::ok);
  log.then = [&](tl::cm_conn* conn) {
    if (log.connects == 0) (void)conn->connect(given(bytes_of("request")));
  };
  tl::cm_client_params flow;
  flow.address = address;
  flow.handler = &log;
  tl::cm_conn* conn = nullptr;
  CHILD_CHECK(client->resolve(flow, &conn) == status::ok);
  const auto until = clock_type::now() + std::chrono::seconds(20);
  while (log.connects == 0 && clock_type::now() < until) client->progress();
  CHILD_CHECK(log.connect_result == status::ok);
  out.send_word(1);
  while (clock_type::now() < until) client->progress();  // until killed, never notifying
  return 1;
}

}  // namespace cm_flow_test

BOOST_DATA_TEST_CASE(a_client_that_dies_before_it_notifies_fails_the_server, places, name) {
  const cm_place place = place_named(name);
  leak_check leaks;
  {
    cm_pair p(place);
    flow_log server_log;
    if (comm::test::in_process_only_reason(place.transport).empty()) {
      channel from_client;
      const std::string address = p.address();
      const pid_t client =
          fork_child([&] { return run_doomed_client(place, address, from_client); });
      BOOST_REQUIRE(p.progress_until([&] { return !p.server_events.conns.empty(); }));
      tl::cm_conn* s = p.answer(server_log, bytes_of("reply"));
      uint64_t word = 0;
      BOOST_REQUIRE(p.progress_until([&] { return from_client.receive_word(&word, 0); }));
      ::kill(client, SIGKILL);
      BOOST_TEST(wait_child(client) == -1);
      BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
      BOOST_TEST(server_log.notify_result == status::connection_reset);
      p.server->close(s);
    } else {
      flow_log client_log;
      p.request(client_log, bytes_of("request"));
      tl::cm_conn* s = p.answer(server_log, bytes_of("reply"));
      BOOST_REQUIRE(p.progress_until([&] { return client_log.connects == 1; }));
      p.client.reset();  // its process exits before notifying
      BOOST_REQUIRE(p.progress_until([&] { return server_log.notifies == 1; }));
      BOOST_TEST(server_log.notify_result == status::connection_reset);
      p.server->close(s);
    }
    p.reset();
  }
  BOOST_TEST(leaks.none());
}

BOOST_DATA_TEST_CASE(requests_answered_on_the_flow_and_the_short_handshake_side_by_side, places,
                     name) {
  // The short handshake (what libcomm uses) and the flow share a connection manager.
  leak_check leaks;
  {
    cm_pair p(place_named(name));
    const auto data = bytes_of("short");
    tl::cm_conn* short_client = nullptr;
    BOOST_REQUIRE(p.client->connect(p.address(), data.data(), data.size(), 5000, &short_client) ==
                  status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return p.server_events.conns.size() == 1; }));
    tl::cm_conn* short_server = nullptr;
    BOOST_REQUIRE(p.server->accept(std::move(p.server_events.conns.back()), data.data(),
                                   data.size(), 5000, &short_server) == status::ok);
    p.server_events.conns.pop_back();
    flow_log client_log, server_log;
    tl::cm_conn *c = nullptr, *s = nullptr;
    p.establish(client_log, server_log, &c, &s);
    BOOST_REQUIRE(p.progress_until([&] {
      return p.client_events.short_outcomes == 1 && p.server_events.short_outcomes == 1;
    }));
    BOOST_TEST(c->disconnect() == status::in_progress);
    BOOST_REQUIRE(p.progress_until([&] { return server_log.disconnects == 1; }));
    BOOST_TEST(s->disconnect() == status::ok);
    BOOST_REQUIRE(p.progress_until([&] { return client_log.disconnects == 1; }));
    p.client->close(c);
    p.server->close(s);
    p.reset();
  }
  BOOST_TEST(leaks.none());
}
