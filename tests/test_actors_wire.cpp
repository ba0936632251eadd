// Bad input from the wire: a plain libcomm worker connects to a node as if it were one and sends
// frames that are malformed (a short envelope, an unknown kind, frames out of sequence, a
// payload that is not a CAF message, attachments that do not add up). The node closes the
// offending connection or answers with an error, and goes on serving everybody else.
#define BOOST_TEST_MODULE actors_wire
#include <boost/test/unit_test.hpp>

#include "test_actors_scenarios.hpp"

#include <comm/context.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include <capnp/serialize.h>

#include "schema/actor.capnp.h"

#include <array>
#include <deque>

using namespace comm::test::actors;

namespace {

constexpr uint16_t frame_am = 0xAC70;   // the node's frame AM id
constexpr uint8_t kind_message = 1;
constexpr uint8_t kind_lookup = 6;

/// What the forged peer received and saw.
struct forged_state {
  bool connected = false;
  comm::status failure = comm::status::ok;
  int frames = 0;
  int16_t last_kind = 0;
  uint64_t last_attached = 0;  ///< attachment bytes of the last frame
  int attached_messages = 0;   ///< message frames with attachments
};

/// Bytes of an envelope.
constexpr size_t envelope_size =
    comm::wire::header_writer<comm::wire::schema::ActorEnvelope>::size();

comm::status on_frame(void* arg, const void* header, size_t length, void*, size_t,
                      const comm::am_recv_params&) {
  auto* s = static_cast<forged_state*>(arg);
  ++s->frames;
  alignas(8) std::array<uint8_t, envelope_size> words{};
  if (length >= words.size()) std::memcpy(words.data(), header, words.size());
  auto h = comm::wire::read_header<comm::wire::schema::ActorEnvelope>(words.data(),
                                                                      words.size());
  s->last_kind = h ? h->getKind() : -1;
  s->last_attached = h ? h->getAttached() : 0;
  if (s->last_kind == kind_message && s->last_attached != 0) ++s->attached_messages;
  return comm::status::ok;
}

void on_connect(void* arg, comm::endpoint*, const uint8_t*, size_t) {
  static_cast<forged_state*>(arg)->connected = true;
}

void on_error(void* arg, comm::endpoint*, comm::status reason) {
  static_cast<forged_state*>(arg)->failure = reason;
}

/// A hello (connection private data) claiming to be a node of pid 4242.
std::vector<uint8_t> forged_hello(caf::actor_system& sys) {
  caf::node_id::default_data::host_id_type host{};
  host.fill(0x5a);
  caf::node_id id = caf::make_node_id(4242, host);
  std::vector<char> bytes;
  caf::binary_serializer sink{sys, bytes};
  BOOST_REQUIRE(!sink(id));
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<comm::wire::schema::ActorNodeHello>();
  root.setMagic(0x434f4d4d41435401ull);
  root.setNodeId(kj::arrayPtr(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  const auto words = capnp::messageToFlatArray(message);
  const auto flat = words.asBytes();
  return std::vector<uint8_t>(flat.begin(), flat.end());
}

/// A plain libcomm worker connected to the node at `address`, sending forged frames.
struct forged_peer {
  comm::context ctx;
  std::deque<std::vector<char>> sent;  ///< payloads sent (outlive the worker)
  std::unique_ptr<comm::worker> worker;
  comm::endpoint* ep = nullptr;
  forged_state state;
  comm::wire::header_writer<comm::wire::schema::ActorEnvelope> envelope;
  uint32_t seq = 0;

  forged_peer(caf::actor_system& sys, const std::string& address)
      : worker(comm::worker::create(ctx)) {
    worker->set_am_handler(frame_am, on_frame, &state, comm::am_flag_whole_msg);
    comm::endpoint_params p;
    p.private_data = forged_hello(sys);
    p.on_connect = on_connect;
    p.connect_arg = &state;
    p.on_error = on_error;
    p.error_arg = &state;
    BOOST_REQUIRE(worker->connect(address, p, &ep) == comm::status::ok);
    BOOST_REQUIRE(progress_until([&] { return state.connected; }));
  }

  /// Progresses until `done` or 5 s passed.
  template <class Pred>
  bool progress_until(Pred done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < until) worker->progress();
    return done();
  }

  /// Sends a frame: `header` bytes as the AM header, `payload` as its data (kept until the peer
  /// goes: a large one is sent by rendezvous, read after this returns).
  void send_raw(const void* header, size_t header_length, const std::vector<char>& payload) {
    const auto& kept = sent.emplace_back(payload);
    comm::request_params rp;
    rp.flags = comm::request_reply_endpoint;
    comm::op o = ep->am_send(frame_am, header, header_length, kept.data(), kept.size(), rp);
    if (o.pending()) worker->release(o.req);
  }

  /// Sends a well-formed envelope (next sequence number) with `payload`, whose last `attached`
  /// bytes it declares attachments.
  void send(uint8_t kind, uint64_t receiver, uint64_t message_id, uint16_t types,
            const std::vector<char>& payload, uint64_t attached = 0) {
    fill(kind, receiver, message_id, types, attached);
    send_raw(envelope.bytes(), envelope.size(), payload);
  }

  /// Sends an envelope declaring `attachment` as attachments, followed by `payload` in the AM
  /// header; the attachment is the AM's data.
  void send_in_header(uint8_t kind, uint64_t receiver, uint64_t message_id, uint16_t types,
                      const std::vector<char>& payload, const std::vector<char>& attachment) {
    fill(kind, receiver, message_id, types, attachment.size());
    std::vector<char> header(envelope_size);
    std::memcpy(header.data(), envelope.bytes(), envelope_size);
    header.insert(header.end(), payload.begin(), payload.end());
    send_raw(header.data(), header.size(), attachment);
  }

  /// Fills the envelope with the next sequence number.
  void fill(uint8_t kind, uint64_t receiver, uint64_t message_id, uint16_t types,
            uint64_t attached) {
    auto f = envelope.fields();
    f.setKind(kind);
    f.setFlags(1);  // the sender lives on the sending node
    f.setStatus(0);
    f.setSeq(seq++);
    f.setSender(7);
    f.setReceiver(receiver);
    f.setMessageId(message_id);
    f.setTypeCount(types);
    f.setAttached(attached);
  }
};

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

}  // namespace

BOOST_FIXTURE_TEST_SUITE(wire, node_under_attack)

BOOST_AUTO_TEST_CASE(short_envelope_closes_the_connection) {
  forged_peer peer(*service_sys, address());
  const std::array<uint8_t, 12> junk{1, 2, 3};
  peer.send_raw(junk.data(), junk.size(), {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(unknown_kind_closes_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.send(99, svc.id(), 0, 0, {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(frame_far_out_of_sequence_closes_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.seq = 1u << 30;
  peer.send(kind_message, svc.id(), 0, 1, {'x'});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(garbage_payload_of_a_request_gets_an_error_answer) {
  forged_peer peer(*service_sys, address());
  const std::vector<char> garbage(64, '\x7f');
  const uint64_t request = caf::make_message_id(caf::message_priority::normal)
                               .integer_value() | 1;  // a request id
  peer.send(kind_message, svc.id(), request, 2, garbage);
  BOOST_TEST(peer.progress_until([&] { return peer.state.frames > 0; }));
  BOOST_TEST(peer.state.last_kind == kind_message);  // the error response
  BOOST_TEST((peer.state.failure == comm::status::ok));  // the connection stays
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(overlong_lookup_name_closes_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.send(kind_lookup, 0, 1, 0, std::vector<char>(100000, 'n'));
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

namespace {

/// A request id.
uint64_t request_id() {
  return caf::make_message_id(caf::message_priority::normal).integer_value() | 1;
}

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
  forged_peer peer(*service_sys, address());
  const size_t run = 40 * 1024;
  const auto whole = echo_blob_payload(*service_sys, run);
  // The blob's bytes (the message's end) as an attachment after the payload, in the AM's data.
  peer.send(kind_message, svc.id(), request_id(), 2, whole, run);
  BOOST_TEST(peer.progress_until([&] { return peer.state.attached_messages == 1; }));
  BOOST_TEST(peer.state.last_attached == run);  // the echo, not an error
  // The payload in the AM header, the bytes as the AM's data.
  peer.send_in_header(kind_message, svc.id(), request_id(), 2,
                      slice(whole, 0, whole.size() - run), slice(whole, whole.size() - run,
                                                                 whole.size()));
  BOOST_TEST(peer.progress_until([&] { return peer.state.attached_messages == 2; }));
  BOOST_TEST(peer.state.last_attached == run);
  BOOST_TEST((peer.state.failure == comm::status::ok));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(unused_attachments_get_an_error_answer) {
  forged_peer peer(*service_sys, address());
  auto payload = echo_blob_payload(*service_sys, 5);
  payload.resize(payload.size() + 50000, 'j');  // 50000 bytes nobody reads
  peer.send(kind_message, svc.id(), request_id(), 2, payload, 50000);
  BOOST_TEST(peer.progress_until([&] { return peer.state.frames > 0; }));
  BOOST_TEST(peer.state.last_kind == kind_message);  // the error response
  BOOST_TEST(peer.state.last_attached == 0u);
  BOOST_TEST((peer.state.failure == comm::status::ok));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(attachments_beyond_the_data_close_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.send(kind_message, svc.id(), 0, 1, std::vector<char>(10, 'x'), 1000);
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(attachments_on_a_lookup_close_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.send(kind_lookup, 0, 1, 0, std::vector<char>(100, 'n'), 50);
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_CASE(payload_in_the_header_without_attachments_closes_the_connection) {
  forged_peer peer(*service_sys, address());
  peer.send_in_header(kind_message, svc.id(), 0, 1, std::vector<char>(16, 'p'), {});
  BOOST_TEST(peer.progress_until([&] { return peer.state.failure != comm::status::ok; }));
  BOOST_TEST(still_serves());
}

BOOST_AUTO_TEST_SUITE_END()
