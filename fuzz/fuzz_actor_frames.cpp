// Fuzzes what the actor node decodes from another node (actors/src/frame.*, payload.*,
// attachments.*): the envelope, the hello, and a message frame's payload with its attachments.
//
// Input: one byte choosing the decoder, then its bytes.
//   0 envelope: what decode_envelope accepts encodes again to the same fields.
//   1 hello:    what decode_hello accepts encodes again (encode_hello) and decodes to the same.
//   2 message:  [flags: 1 byte] [type count: 2 bytes] [attached length: 3 bytes] [payload...]
//               The attachments (up to 128 KiB, so runs above the 32 KiB threshold occur) are the
//               payload's last bytes repeated to that length. A message read_message_payload
//               accepts has the announced element count and writes and reads back the same.
//   3 lends:    what decode_lends accepts encodes again (encode_lends) and decodes to the same.
//   4 releases: what decode_releases accepts encodes again and decodes to the same.
//   5 lent message: as 2, but the attachments arrive as ready runs (lent blobs) of the length
//               the second header byte picks (32 KiB and up): a run is only taken whole.
// The node's down-frame reason is fuzzed by fuzz_actor_down.
#include <comm/actors/blob.hpp>

#include "check.hpp"
#include "actor_env.hpp"
#include "attachments.hpp"
#include "frame.hpp"
#include "lending.hpp"
#include "payload.hpp"
#include "seeds.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace {

using comm::fuzz::fail;
using comm::fuzz::require;

using namespace comm::actors::detail;
using comm::fuzz::env;

/// An envelope: what decodes encodes again to the same fields.
void check_envelope(const uint8_t* data, size_t size) {
  const auto h = decode_envelope(data, size);
  if (!h) return;
  envelope_writer writer;
  const auto again = decode_envelope(writer.encode(*h), envelope_writer::size());
  require(again.has_value(), "a re-encoded envelope is refused");
  require(again->kind == h->kind && again->flags == h->flags && again->status == h->status &&
              again->seq == h->seq && again->sender == h->sender &&
              again->receiver == h->receiver && again->message_id == h->message_id &&
              again->type_count == h->type_count && again->attached == h->attached,
          "a re-encoded envelope reads differently");
}

/// A hello: what decodes encodes again and decodes to the same.
void check_hello(const uint8_t* data, size_t size) {
  const auto hello = decode_hello(env().sys, data, size);
  if (!hello) return;
  const std::vector<uint8_t> bytes = encode_hello(env().sys, *hello);
  const auto again = decode_hello(env().sys, bytes.data(), bytes.size());
  require(again && again->id == hello->id && again->address == hello->address,
          "a re-encoded hello reads differently");
}

/// Lends: what decodes encodes again and decodes to the same.
void check_lends(const uint8_t* data, size_t size) {
  std::vector<lend_descriptor> lends;
  if (!decode_lends(data, size, lends)) return;
  require(!lends.empty() && lends.size() <= max_lends_per_frame, "lends out of bounds accepted");
  std::vector<char> bytes;
  encode_lends(lends, bytes);
  std::vector<lend_descriptor> again;
  require(decode_lends(bytes.data(), bytes.size(), again) && again.size() == lends.size(),
          "re-encoded lends are refused");
  for (size_t i = 0; i < lends.size(); ++i) {
    require(again[i].id == lends[i].id && again[i].address == lends[i].address &&
                again[i].length == lends[i].length && again[i].returned == lends[i].returned &&
                again[i].key == lends[i].key,
            "re-encoded lends read differently");
  }
}

/// Releases: what decodes encodes again and decodes to the same.
void check_releases(const uint8_t* data, size_t size) {
  std::vector<uint64_t> ids;
  if (!decode_releases(data, size, ids)) return;
  require(!ids.empty(), "a release of nothing accepted");
  std::vector<char> bytes;
  encode_releases(ids.data(), ids.size(), bytes);
  std::vector<uint64_t> again;
  require(decode_releases(bytes.data(), bytes.size(), again) && again == ids,
          "re-encoded releases read differently");
}

/// The payload of `msg` as the node writes it, read back; nothing when the node does not write it
/// (a type without a name).
std::optional<std::string> written_and_read(const caf::message& msg) {
  auto elem = caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, msg);
  std::vector<char> buf;
  attachment_list attached;
  content_writer writer;
  if (write_message_payload(&env().ctx, writer, *elem, false, false, buf, attached)) {
    return std::nullopt;
  }
  std::vector<char> runs;
  for (const comm::actors::blob& run : attached.runs) {
    runs.insert(runs.end(), run.data(), run.data() + run.size());
  }
  attachment_source source(runs.data(), runs.size(), nullptr);
  content_reader reader;
  message_payload back;
  require(!read_message_payload(&env().ctx, reader, buf.data(), buf.size(), source, false, false,
                                msg.size(), back),
          "a message the node read cannot be read again after writing it");
  return caf::to_string(back.content);
}

/// A message payload with attachments (see the file comment for the layout); with `lent`, the
/// attachments come as ready runs of a length the header picks.
void check_message(const uint8_t* data, size_t size, bool lent = false) {
  if (size < 6) return;
  const size_t run_length = attach_threshold + (size_t{data[1]} << 8);
  const bool with_sender = data[0] & 1u;
  const bool with_stages = data[0] & 2u;
  const size_t type_count = data[1] | (size_t{data[2]} << 8);
  const size_t attached = (data[3] | (size_t{data[4]} << 8) | (size_t{data[5]} << 16)) % 131073;
  data += 6;
  size -= 6;
  std::vector<char> runs(attached);
  const size_t pattern = std::min<size_t>(size, 64);
  for (size_t i = 0; i < attached && pattern != 0; ++i) {
    runs[i] = static_cast<char>(data[size - pattern + i % pattern]);
  }
  attachment_source source(runs.data(), runs.size(), nullptr);
  if (lent) {
    std::vector<comm::actors::blob> ready;
    for (size_t at = 0; at < attached; at += run_length) {
      ready.emplace_back(runs.data() + at, std::min(run_length, attached - at));
    }
    source = attachment_source(std::move(ready));
  }
  content_reader reader;
  message_payload body;
  const auto err = read_message_payload(&env().ctx, reader, data, size, source, with_sender,
                                        with_stages, type_count, body);
  env().proxies.clear();
  if (err) return;
  require(body.content.size() == type_count, "a message with another element count was accepted");
  const auto again = written_and_read(body.content);
  require(!again || *again == caf::to_string(body.content),
          "a message reads back differently after writing it");
}

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::seed;

/// A message seed: the harness's header (flags, type count, attached length) and the payload the
/// node writes for `msg`.
seed message_seed(const caf::message& msg) {
  auto elem = caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, msg);
  std::vector<char> buf;
  attachment_list attached;
  content_writer writer;
  if (write_message_payload(&env().ctx, writer, *elem, false, false, buf, attached)) {
    fail("cannot write a seed message");
  }
  const size_t runs = attached.bytes();
  seed out{2, 0, static_cast<uint8_t>(msg.size()), static_cast<uint8_t>(msg.size() >> 8),
           static_cast<uint8_t>(runs), static_cast<uint8_t>(runs >> 8),
           static_cast<uint8_t>(runs >> 16)};
  comm::fuzz::append(out, buf.data(), buf.size());
  return out;
}

/// Seeds: an envelope, this node's hello, and message payloads of builtin, user, nested and
/// attached (large) values.
std::vector<seed> make_seeds() {
  std::vector<seed> seeds;
  frame_header h;
  h.set_location(sender_location::sending_node);
  h.seq = 3;
  h.sender = 5;
  h.receiver = 6;
  h.message_id = 7;
  h.type_count = 2;
  envelope_writer writer;
  seeds.push_back({0});
  comm::fuzz::append(seeds.back(), writer.encode(h), envelope_writer::size());
  const auto hello = encode_hello(env().sys, {env().sys.node(), "127.0.0.1:7000"});
  seeds.push_back({1});
  comm::fuzz::append(seeds.back(), hello.data(), hello.size());
  seeds.push_back(message_seed(caf::make_message(int32_t{42}, std::string("hi"), 2.5)));
  seeds.push_back(message_seed(caf::make_message(comm::fuzz::packet{{'a', 'b', 'c'}})));
  seeds.push_back(message_seed(caf::make_message(caf::make_message(int64_t{1}, true))));
  seeds.push_back(message_seed(caf::make_message(std::vector<char>(40000, 'x'))));
  comm::actors::blob large(40000);
  std::memset(large.mutable_data(), 'y', large.size());
  seeds.push_back(message_seed(caf::make_message(large, std::string(100, 'z'))));
  seed lent_message = seeds.back();
  lent_message[0] = 5;
  seeds.push_back(lent_message);
  std::vector<char> bytes;
  encode_lends({lend_descriptor{1, 0x7f0000001000, 40000, {1, 2, 3, 4, 5, 6, 7, 8}, false},
                lend_descriptor{9, 0, 65536, {}, true}},
               bytes);
  seeds.push_back({3});
  comm::fuzz::append(seeds.back(), bytes.data(), bytes.size());
  bytes.clear();
  const uint64_t ids[] = {1, 2, 0xffffffffffffffffull};
  encode_releases(ids, 3, bytes);
  seeds.push_back({4});
  comm::fuzz::append(seeds.back(), bytes.data(), bytes.size());
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  env();
  switch (data[0] % 6) {
    case 0:
      check_envelope(data + 1, size - 1);
      break;
    case 1:
      check_hello(data + 1, size - 1);
      break;
    case 2:
      check_message(data + 1, size - 1);
      break;
    case 3:
      check_lends(data + 1, size - 1);
      break;
    case 4:
      check_releases(data + 1, size - 1);
      break;
    default:
      check_message(data + 1, size - 1, true);
      break;
  }
  return 0;
}
