// Bad input from the wire: a plain libcomm worker connects to a node as if it were one and sends
// frames that are malformed (a short envelope, an unknown kind, frames out of sequence, a
// payload that is not a CAF message, attachments that do not add up), or listens as one and
// answers a node's dial with a hello naming that node itself. The node closes the offending
// connection or answers with an error, and goes on serving everybody else.
#define BOOST_TEST_MODULE actors_wire
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

#include "test_actors_forged.hpp"

#include <atomic>
#include <stdexcept>
#include <thread>

using namespace comm::test::actors;

namespace {

/// The service node, and a client node to check it still serves.
struct node_under_attack {
  caf::actor_system_config service_cfg;
  caf::actor_system_config client_cfg;
  std::unique_ptr<caf::actor_system> service_sys;
  std::unique_ptr<caf::actor_system> client_sys;
  caf::actor svc;

  node_under_attack() {
    configure(service_cfg, "127.0.0.1:0", false);
    configure(client_cfg, "127.0.0.1:0", false);
    service_sys = std::make_unique<caf::actor_system>(service_cfg);
    client_sys = std::make_unique<caf::actor_system>(client_cfg);
    svc = start_service(*service_sys);
  }

  ~node_under_attack() {
    caf::anon_send_exit(svc, caf::exit_reason::user_shutdown);
    svc = nullptr;
  }

  std::string address() const { return node_of(*service_sys).address(); }

  /// The service node still answers a well-behaved node.
  bool still_serves() {
    auto found = node_of(*client_sys).lookup(address(), service_name);
    return found && check_request(*client_sys, *found).empty();
  }
};

/// A plain libcomm worker listening as a node does, whose hello names the node `claimed`.
struct forged_server {
  comm::context ctx;
  std::unique_ptr<comm::worker> worker;
  std::unique_ptr<comm::listener> listener;
  std::vector<uint8_t> hello;
  std::string address;
  std::atomic<bool> stopping{false};
  std::thread progress;  ///< the worker's only user once started

  explicit forged_server(const caf::node_id& claimed)
      : worker(comm::worker::create(ctx).value()), hello(forged_hello(claimed)) {
    comm::listener_params lp;
    lp.address = "127.0.0.1:0";
    lp.on_request = &forged_server::on_request;
    lp.arg = this;
    if (worker->listen(lp, &listener) != comm::status::ok) {
      throw std::runtime_error("the forged server cannot listen");
    }
    address = listener->address();
    progress = std::thread([this] {
      while (!stopping.load()) worker->progress();
    });
  }

  ~forged_server() {
    stopping = true;
    progress.join();
  }

  static void on_request(void* arg, comm::conn_request* request) {
    auto* self = static_cast<forged_server*>(arg);
    comm::endpoint_params p;
    p.private_data = self->hello;
    comm::endpoint* ep = nullptr;
    (void)self->worker->accept(request, p, &ep);
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(wire, node_under_attack)

BOOST_AUTO_TEST_CASE(short_envelope_closes_the_connection) {
  forged_peer peer(address());
  const std::array<uint8_t, 12> junk{1, 2, 3};
  peer.send_raw(junk.data(), junk.size(), {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(unknown_kind_closes_the_connection) {
  forged_peer peer(address());
  peer.send(99, svc.id(), 0, 0, {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(frame_far_out_of_sequence_closes_the_connection) {
  forged_peer peer(address());
  peer.seq = 1u << 30;
  peer.send(kind_message, svc.id(), 0, 1, {'x'});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(garbage_payload_of_a_request_gets_an_error_answer) {
  forged_peer peer(address());
  const std::vector<char> garbage(64, '\x7f');
  peer.send(kind_message, svc.id(), forged_request_id(), 2, garbage);
  BOOST_TEST(peer.progress_until([&] { return peer.state.frames > 0; }));
  BOOST_TEST(peer.state.last_kind == kind_message);  // the error response
  BOOST_TEST((peer.state.failure == comm::status::ok));  // the connection stays
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(overlong_lookup_name_closes_the_connection) {
  forged_peer peer(address());
  peer.send(kind_lookup, 0, 1, 0, std::vector<char>(100000, 'n'));
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

namespace {

/// The payload of the message (echo, blob of `size` bytes) as CAF writes it inline.
std::vector<char> echo_blob_payload(caf::actor_system& sys, size_t size) {
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  auto msg = caf::make_message(echo_atom::value, patterned_blob(size, 7));
  BOOST_REQUIRE(!caf::message::save(sink, msg));
  return bytes;
}

/// Bytes [from, to) of `v`.
std::vector<char> slice(const std::vector<char>& v, size_t from, size_t to) {
  return std::vector<char>(v.begin() + static_cast<long>(from), v.begin() + static_cast<long>(to));
}

}  // namespace

BOOST_AUTO_TEST_CASE(attachments_in_either_layout_are_read) {
  forged_peer peer(address());
  const size_t run = 40 * 1024;
  const auto whole = echo_blob_payload(*service_sys, run);
  // The blob's bytes (the message's end) as an attachment after the payload, in the AM's data.
  peer.send(kind_message, svc.id(), forged_request_id(), 2, whole, run);
  BOOST_TEST(peer.progress_until([&] { return peer.state.attached_messages == 1; }));
  BOOST_TEST(peer.state.last_attached == run);  // the echo, not an error
  // The payload in the AM header, the bytes as the AM's data.
  peer.send_in_header(kind_message, svc.id(), forged_request_id(), 2,
                      slice(whole, 0, whole.size() - run), slice(whole, whole.size() - run,
                                                                 whole.size()));
  BOOST_TEST(peer.progress_until([&] { return peer.state.attached_messages == 2; }));
  BOOST_TEST(peer.state.last_attached == run);
  BOOST_TEST((peer.state.failure == comm::status::ok));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(unused_attachments_get_an_error_answer) {
  forged_peer peer(address());
  auto payload = echo_blob_payload(*service_sys, 5);
  payload.resize(payload.size() + 50000, 'j');  // 50000 bytes nobody reads
  peer.send(kind_message, svc.id(), forged_request_id(), 2, payload, 50000);
  BOOST_TEST(peer.progress_until([&] { return peer.state.frames > 0; }));
  BOOST_TEST(peer.state.last_kind == kind_message);  // the error response
  BOOST_TEST(peer.state.last_attached == 0u);
  BOOST_TEST((peer.state.failure == comm::status::ok));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(attachments_beyond_the_data_close_the_connection) {
  forged_peer peer(address());
  peer.send(kind_message, svc.id(), 0, 1, std::vector<char>(10, 'x'), 1000);
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(attachments_on_a_lookup_close_the_connection) {
  forged_peer peer(address());
  peer.send(kind_lookup, 0, 1, 0, std::vector<char>(100, 'n'), 50);
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(payload_in_the_header_without_attachments_closes_the_connection) {
  forged_peer peer(address());
  peer.send_in_header(kind_message, svc.id(), 0, 1, std::vector<char>(16, 'p'), {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(a_server_whose_hello_names_the_dialling_node_is_refused) {
  auto& client = node_of(*client_sys);
  forged_server impostor(client.id());
  auto found = client.lookup(impostor.address, service_name);
  BOOST_REQUIRE(!found);
  BOOST_TEST((comm::actors::status_of(found.error()) == comm::status::protocol_error));
  BOOST_TEST(client.stats().peers == 0u);
  BOOST_TEST(client.stats().proxies == 0u);
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_SUITE_END()
