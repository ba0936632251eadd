// A forged node for the actor suites that attack a node from the wire: a plain libcomm worker that
// connects with a node's hello and sends hand-made frames (envelope and payload bytes of its
// choosing), and records the frames the node sends back; and hostile payloads in CAF's binary
// format written by hand. It needs no actor system, so a test process that uses it stays free of
// CAF's threads and can still fork.
#pragma once

#include <comm/context.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include <caf/atom.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message_id.hpp>
#include <caf/node_id.hpp>

#include <capnp/serialize.h>

#include "schema/actor.capnp.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm::test::actors {

inline constexpr uint16_t frame_am = 0xAC70;  ///< the node's frame AM id
inline constexpr uint8_t kind_message = 1;
inline constexpr uint8_t kind_down = 3;
inline constexpr uint8_t kind_lookup = 6;
inline constexpr uint8_t kind_lookup_reply = 7;

/// Bytes of an envelope.
inline constexpr size_t envelope_size =
    comm::wire::header_writer<comm::wire::schema::ActorEnvelope>::size();

/// What the forged peer received and saw.
struct forged_state {
  bool connected = false;
  comm::status failure = comm::status::ok;
  int frames = 0;
  int16_t last_kind = 0;
  uint64_t last_attached = 0;    ///< attachment bytes of the last frame
  uint64_t last_receiver = 0;    ///< receiver of the last frame (the actor a lookup found)
  uint64_t last_message_id = 0;  ///< message id of the last frame
  std::vector<char> last_payload;  ///< the AM data of the last frame
  int attached_messages = 0;     ///< message frames with attachments
};

/// Records a frame the node sent.
inline comm::status on_forged_frame(void* arg, const void* header, size_t length, void* data,
                                    size_t data_length, const comm::am_recv_params&) {
  auto* s = static_cast<forged_state*>(arg);
  ++s->frames;
  alignas(8) std::array<uint8_t, envelope_size> words{};
  if (length >= words.size()) std::memcpy(words.data(), header, words.size());
  auto h = comm::wire::read_header<comm::wire::schema::ActorEnvelope>(words.data(),
                                                                      words.size());
  s->last_kind = h ? h->getKind() : -1;
  s->last_attached = h ? h->getAttached() : 0;
  s->last_receiver = h ? h->getReceiver() : 0;
  s->last_message_id = h ? h->getMessageId() : 0;
  const auto* bytes = static_cast<const char*>(data);
  s->last_payload.assign(bytes, bytes + data_length);
  if (s->last_kind == kind_message && s->last_attached != 0) ++s->attached_messages;
  return comm::status::ok;
}

inline void on_forged_connect(void* arg, comm::endpoint*, const uint8_t*, size_t) {
  static_cast<forged_state*>(arg)->connected = true;
}

inline void on_forged_error(void* arg, comm::endpoint*, comm::status reason) {
  static_cast<forged_state*>(arg)->failure = reason;
}

/// A node id of pid 4242 on a made-up host.
inline caf::node_id forged_node_id() {
  caf::node_id::default_data::host_id_type host{};
  host.fill(0x5a);
  return caf::make_node_id(4242, host);
}

/// A hello (connection private data) claiming to be the node `id`.
inline std::vector<uint8_t> forged_hello(caf::node_id id = forged_node_id()) {
  std::vector<char> bytes;
  caf::binary_serializer sink{static_cast<caf::execution_unit*>(nullptr), bytes};
  if (sink(id)) throw std::runtime_error("cannot serialise a node id");
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<comm::wire::schema::ActorNodeHello>();
  root.setMagic(0x434f4d4d41435401ull);
  root.setNodeId(kj::arrayPtr(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  const auto words = capnp::messageToFlatArray(message);
  const auto flat = words.asBytes();
  return std::vector<uint8_t>(flat.begin(), flat.end());
}

/// A request id (CAF's message id of a normal-priority request).
inline uint64_t forged_request_id(uint64_t n = 1) {
  return caf::make_message_id(caf::message_priority::normal).integer_value() | n;
}

// -- payloads in CAF's binary format, written by hand -------------------------------------------

/// Appends `x` in network byte order.
template <class T>
inline void put_int(std::vector<char>& out, T x) {
  for (size_t i = sizeof(T); i-- > 0;) out.push_back(static_cast<char>(x >> (8 * i)));
}

/// Appends a sequence length (CAF's varbyte encoding).
inline void put_size(std::vector<char>& out, uint32_t size) {
  while (size > 0x7f) {
    out.push_back(static_cast<char>((size & 0x7f) | 0x80));
    size >>= 7;
  }
  out.push_back(static_cast<char>(size));
}

/// Appends the start of a CAF message whose elements have the types `names` ("@<>+@i32+...").
inline void put_message_start(std::vector<char>& out, const std::string& names) {
  put_int(out, uint16_t{0});
  put_size(out, static_cast<uint32_t>(names.size()));
  out.insert(out.end(), names.begin(), names.end());
}

/// A message frame's payload: a message holding a message holding ... `depth` times, then (int32
/// 1). Fifteen bytes a level.
inline std::vector<char> nested_messages(size_t depth) {
  std::vector<char> out;
  for (size_t i = 0; i < depth; ++i) put_message_start(out, "@<>+@message");
  put_message_start(out, "@<>+@i32");
  put_int(out, int32_t{1});
  return out;
}

/// A message frame's payload: one config_value, a list holding a list ... `depth` times, then
/// true. Two bytes a level (the variant's index of a list, 7, and the list's length, 1).
inline std::vector<char> nested_lists(size_t depth) {
  std::vector<char> out;
  put_message_start(out, "@<>+@config_value");
  for (size_t i = 0; i < depth; ++i) {
    out.push_back(7);
    put_size(out, 1);
  }
  out.push_back(1);  // a boolean...
  out.push_back(1);  // ...true
  return out;
}

/// A down frame's payload: an exit reason (code, category, context) whose context is a message
/// of one std::vector<char> that claims 2^32 - 1 bytes and has none.
inline std::vector<char> lying_reason() {
  std::vector<char> out;
  out.push_back(1);                                                // code
  put_int(out, static_cast<uint64_t>(caf::atom("system")));        // category
  put_message_start(out, "@<>+@charbuf");                          // context
  put_size(out, UINT32_MAX);
  return out;
}

// -- the forged node ------------------------------------------------------------------------------

/// A plain libcomm worker connected to the node at `address`, sending forged frames.
struct forged_peer {
  comm::context ctx;
  std::deque<std::vector<char>> sent;  ///< payloads sent (outlive the worker)
  std::unique_ptr<comm::worker> worker;
  comm::endpoint* ep = nullptr;
  forged_state state;
  comm::wire::header_writer<comm::wire::schema::ActorEnvelope> envelope;
  uint32_t seq = 0;

  /// Connects; throws when the node does not accept within 5 s.
  explicit forged_peer(const std::string& address) : worker(comm::worker::create(ctx).value()) {
    worker->set_am_handler(frame_am, on_forged_frame, &state,
                           comm::am_flag_whole_msg | comm::am_flag_fetch_rndv);
    comm::endpoint_params p;
    p.private_data = forged_hello();
    p.on_connect = on_forged_connect;
    p.connect_arg = &state;
    p.on_error = on_forged_error;
    p.error_arg = &state;
    if (worker->connect(address, p, &ep) != comm::status::ok ||
        !progress_until([&] { return state.connected; })) {
      throw std::runtime_error("the forged peer cannot connect to " + address);
    }
  }

  /// Progresses until `done` or `seconds` passed.
  template <class Pred>
  bool progress_until(Pred done, int seconds = 5) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done() && std::chrono::steady_clock::now() < until) worker->progress();
    return done();
  }

  /// True once the node closed the connection (or it failed otherwise).
  bool closed() const { return state.failure != comm::status::ok; }

  /// Sends a frame: `header` bytes as the AM header, `length` bytes at `data` as its data, which
  /// must stay valid until the peer goes (a large one is sent by rendezvous, read later).
  void send_from(const void* header, size_t header_length, const void* data, size_t length) {
    comm::request_params rp;
    rp.flags = comm::request_reply_endpoint;
    comm::op o = ep->am_send(frame_am, header, header_length, data, length, rp);
    if (o.pending()) worker->release(o.req);
  }

  /// Sends a frame with a copy of `payload` as its data (kept until the peer goes).
  void send_raw(const void* header, size_t header_length, const std::vector<char>& payload) {
    const auto& kept = sent.emplace_back(payload);
    send_from(header, header_length, kept.data(), kept.size());
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

  /// Fills the envelope with the next sequence number; the sender is actor 7 of this node.
  void fill(uint8_t kind, uint64_t receiver, uint64_t message_id, uint16_t types,
            uint64_t attached, uint64_t sender = 7) {
    auto f = envelope.fields();
    f.setKind(kind);
    f.setFlags(1);  // the sender lives on the sending node
    f.setStatus(0);
    f.setSeq(seq++);
    f.setSender(sender);
    f.setReceiver(receiver);
    f.setMessageId(message_id);
    f.setTypeCount(types);
    f.setAttached(attached);
  }

  /// Asks the node for the actor published as `name`: its id, or 0.
  uint64_t lookup(const std::string& name) {
    const int before = state.frames;
    send(kind_lookup, 0, 1, 0, std::vector<char>(name.begin(), name.end()));
    if (!progress_until([&] { return state.frames > before; })) return 0;
    return state.last_kind == kind_lookup_reply ? state.last_receiver : 0;
  }
};

}  // namespace comm::test::actors
