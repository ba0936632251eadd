// The node's payload codec on its own (actors/src/payload.hpp, attachments.hpp): the direct
// writer and reader of plain messages produce and accept exactly CAF's binary format, large runs
// become attachments and come back, and every truncation of a payload is an error, not a crash.
#define BOOST_TEST_MODULE actors_payload
#include <boost/test/unit_test.hpp>

#include <comm/actors/blob.hpp>
#include <comm/memory.hpp>
#include <comm/transport/shared_heap.hpp>

#include "attachments.hpp"
#include "payload.hpp"
#include "process_harness.hpp"
#include "test_actors_forged.hpp"

#include <caf/all.hpp>

#include <pthread.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace comm::actors::detail;
using comm::actors::blob;

namespace {

using probe_atom = caf::atom_constant<caf::atom("probe")>;

/// A user type with a byte vector inside (CAF sizes it before reading its bytes).
struct packet {
  std::vector<char> bytes;
};

/// Serialisation of packet.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, packet& x) {
  return f(caf::meta::type_name("packet"), x.bytes);
}

/// An actor system and an execution unit for serialisers.
struct codec_fixture {
  codec_fixture()
      : sys(cfg.add_message_type<blob>(comm::actors::blob_type_name)
                .add_message_type<packet>("packet")),
        ctx(&sys) {}

  /// The payload write_message_payload makes for `msg` (plain messages take the direct writer).
  std::vector<char> written(const caf::message& msg, attachment_list& attached) {
    auto elem = caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, msg);
    std::vector<char> buf;
    content_writer writer;
    BOOST_REQUIRE(!write_message_payload(&ctx, writer, *elem, false, false, buf, attached));
    return buf;
  }

  /// What CAF's own binary serialiser writes for `msg` (message::save).
  std::vector<char> written_by_caf(const caf::message& msg) {
    std::vector<char> buf;
    caf::binary_serializer sink{&ctx, buf};
    BOOST_REQUIRE(!caf::message::save(sink, msg));
    return buf;
  }

  /// Reads `payload` (with `attached`) back into a message; false when it is not one.
  bool read(const std::vector<char>& payload, attachment_source attached, size_t count,
            caf::message& out) {
    message_payload body;
    content_reader reader;
    auto err = read_message_payload(&ctx, reader, payload.data(), payload.size(), attached,
                                    false, false, count, body);
    out = body.content;
    return !err;
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scoped_execution_unit ctx;
};

/// Of `samples` random bit patterns read as Real, how many pack_real writes other than CAF's
/// pack754 (normal numbers), or how unpack754 does not read back (subnormals: the value when
/// CAF's format holds it, from 2^-bias up, else zero).
template <class Real>
int pack_real_mismatches(int samples) {
  using trait = caf::detail::ieee_754_trait<Real>;
  using packed = typename trait::packed_type;
  const packed exponent = ((packed{1} << trait::expbits) - 1) << (trait::bits - trait::expbits - 1);
  const Real smallest = std::numeric_limits<Real>::min() / 2;  // exponent bits 0 in CAF's format
  std::mt19937_64 random(11);
  int mismatches = 0;
  for (int i = 0; i < samples; ++i) {
    auto bits = static_cast<packed>(random());
    if (i % 4 == 0) bits &= ~exponent;  // a subnormal (or zero)
    Real x;
    std::memcpy(&x, &bits, sizeof(x));
    if (std::isnormal(x)) {
      mismatches += pack_real(x) != caf::detail::pack754(x);
    } else if (std::isfinite(x)) {
      const Real expected = std::fabs(x) >= smallest ? x : Real{0};
      mismatches += caf::detail::unpack754(pack_real(x)) != expected;
    }
  }
  return mismatches;
}

/// Peak resident memory of this process so far, in KiB.
long peak_rss_kib() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

/// Bytes of this process's address space (VmSize).
rlim_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

/// Runs `body` on a thread of its own with a stack of `bytes` and returns what it returned.
int on_stack_of(size_t bytes, const std::function<int()>& body) {
  struct call {
    const std::function<int()>* body;
    int result;
  } c{&body, -1};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, bytes);
  pthread_t thread;
  const int created = pthread_create(
      &thread, &attr,
      [](void* arg) -> void* {
        auto* c = static_cast<call*>(arg);
        c->result = (*c->body)();
        return nullptr;
      },
      &c);
  pthread_attr_destroy(&attr);
  if (created != 0) return -2;
  pthread_join(thread, nullptr);
  return c.result;
}

/// musl's default thread stack, the smallest in common use.
constexpr size_t small_stack = 128 * 1024;

/// A message with one value of every plain type.
caf::message plain_message() {
  return caf::make_message(probe_atom::value, int8_t{-3}, uint8_t{250}, int16_t{-1234},
                           uint16_t{65000}, int32_t{-123456789}, uint32_t{4000000000u},
                           int64_t{-1234567890123LL}, uint64_t{18000000000000000000ull}, true,
                           false, 1.5f, -2.25e100, std::string("hello"), std::string(),
                           std::vector<char>{'a', '\0', 'z'}, std::string(300, 's'));
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(payload, codec_fixture)

BOOST_AUTO_TEST_CASE(plain_messages_are_written_exactly_as_caf_writes_them) {
  const caf::message msg = plain_message();
  attachment_list attached;
  BOOST_TEST(written(msg, attached) == written_by_caf(msg));
  BOOST_TEST(attached.empty());
}

BOOST_AUTO_TEST_CASE(what_caf_writes_reads_back_equal) {
  const caf::message msg = plain_message();
  caf::message back;
  BOOST_REQUIRE(read(written_by_caf(msg), {}, msg.size(), back));
  BOOST_TEST(caf::to_string(back) == caf::to_string(msg));
  BOOST_TEST(back.get_as<double>(12) == -2.25e100);
  BOOST_TEST(back.get_as<std::string>(16) == std::string(300, 's'));
}

BOOST_AUTO_TEST_CASE(short_plain_messages_read_back_as_caf_would_make_them) {
  const caf::message msg = caf::make_message(probe_atom::value, int64_t{-5}, std::string("s"),
                                             std::vector<char>{'x', 'y'});
  caf::message back;
  BOOST_REQUIRE(read(written_by_caf(msg), {}, msg.size(), back));
  BOOST_TEST(back.type_token() == msg.type_token());
  BOOST_TEST(caf::to_string(back) == caf::to_string(msg));
  BOOST_TEST((back.match_elements<probe_atom, int64_t, std::string, std::vector<char>>()));
  BOOST_TEST(written_by_caf(back) == written_by_caf(msg));
  // Copy on write: changing a shared copy leaves the original alone.
  caf::message copy = back;
  copy.get_mutable_as<int64_t>(1) = 42;
  copy.get_mutable_as<std::string>(2) = "changed";
  BOOST_TEST(back.get_as<int64_t>(1) == -5);
  BOOST_TEST(back.get_as<std::string>(2) == "s");
  BOOST_TEST(copy.get_as<int64_t>(1) == 42);
  // A handler of the same signature takes it.
  bool taken = false;
  caf::message_handler handler{[&](probe_atom, int64_t v, const std::string&,
                                   const std::vector<char>& bytes) {
    taken = v == -5 && bytes.size() == 2;
  }};
  BOOST_TEST(static_cast<bool>(handler(back)));
  BOOST_TEST(taken);
}

BOOST_AUTO_TEST_CASE(large_runs_become_attachments_and_come_back) {
  const std::vector<char> big(40 * 1024, 'v');
  const std::string text(50 * 1024, 't');
  blob b(64 * 1024);
  std::memset(b.mutable_data(), 'b', b.size());
  const caf::message msg = caf::make_message(probe_atom::value, big, int32_t{7}, text, b);
  attachment_list attached;
  const auto payload = written(msg, attached);
  BOOST_REQUIRE_EQUAL(attached.runs.size(), 3u);
  BOOST_TEST(attached.bytes() == big.size() + text.size() + b.size());
  BOOST_TEST(attached.runs[2].data() == b.data());  // a blob is attached by reference
  BOOST_TEST(payload.size() < 200u);                // only lengths stay in the payload
  std::vector<char> all;
  for (const blob& run : attached.runs) all.insert(all.end(), run.data(), run.data() + run.size());
  auto owner = std::make_shared<std::vector<char>>(std::move(all));
  caf::message back;
  BOOST_REQUIRE(read(payload, attachment_source(owner->data(), owner->size(), owner), 5, back));
  BOOST_TEST(back.get_as<std::vector<char>>(1) == big);
  BOOST_TEST(back.get_as<std::string>(3) == text);
  const blob& got = back.get_as<blob>(4);
  BOOST_TEST((got == b));
  BOOST_TEST(got.data() == owner->data() + big.size() + text.size());  // taken over, not copied
}

BOOST_AUTO_TEST_CASE(an_adopted_block_is_freed_with_the_last_copy) {
  const size_t live = comm::tl::shared_heap_snapshot().live_blocks;
  void* block = comm::mem_alloc(64 * 1024);
  BOOST_REQUIRE(block != nullptr);
  std::memset(block, 'a', 64 * 1024);
  {
    blob first = blob::adopt(block, 64 * 1024);
    BOOST_TEST(first.data() == static_cast<const char*>(block));
    BOOST_TEST(first.mutable_data() != nullptr);  // the only copy
    const blob second = first;
    BOOST_TEST(first.mutable_data() == nullptr);  // shared now
    BOOST_TEST(second.view() == std::string(64 * 1024, 'a'));
    BOOST_TEST(comm::tl::shared_heap_snapshot().live_blocks == live + 1);
  }
  BOOST_TEST(comm::tl::shared_heap_snapshot().live_blocks == live);
}

BOOST_AUTO_TEST_CASE(attachments_that_do_not_add_up_are_errors) {
  const std::vector<char> big(40 * 1024, 'v');
  const caf::message msg = caf::make_message(probe_atom::value, big);
  attachment_list attached;
  const auto payload = written(msg, attached);
  std::vector<char> run(attached.runs[0].data(), attached.runs[0].data() + big.size());
  caf::message back;
  // Too short for the run the payload names, or with bytes nobody reads.
  BOOST_TEST(!read(payload, attachment_source(run.data(), run.size() - 1, nullptr), 2, back));
  run.push_back('x');
  BOOST_TEST(!read(payload, attachment_source(run.data(), run.size(), nullptr), 2, back));
  // Without attachments, the payload alone is not a message.
  BOOST_TEST(!read(payload, {}, 2, back));
}

BOOST_AUTO_TEST_CASE(a_huge_blob_length_is_an_error_before_any_allocation) {
  const caf::message msg = caf::make_message(probe_atom::value, blob("12345"));
  auto forged = written_by_caf(msg);
  // The blob's length (one varbyte, 5) becomes 2^28 - 1 with the same five bytes behind it.
  forged.erase(forged.end() - 6);
  const char huge[] = {'\xff', '\xff', '\xff', '\x7f'};
  forged.insert(forged.end() - 5, huge, huge + sizeof(huge));
  // In a child whose address space has no room for 256 MiB more: allocating for the length
  // would fail (and throw), refusing it first does not.
  const pid_t child = comm::test::fork_child([&] {
    const rlimit room{address_space_bytes() + (64u << 20), RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &room) != 0) return 2;
    caf::message back;
    if (read(forged, {}, msg.size(), back)) return 3;  // the node's reader
    // CAF's own reader: the blob refuses the length (CAF drops the message without an error).
    caf::binary_deserializer source{&ctx, forged};
    (void)source(back);
    if (back.match_elements<probe_atom, blob>() || source.remaining() != 5) return 4;
    return 0;
  });
  BOOST_TEST(comm::test::wait_child(child) == 0);
}

BOOST_AUTO_TEST_CASE(a_huge_sequence_length_is_an_error_before_any_allocation) {
  const caf::message msg = caf::make_message(probe_atom::value, packet{{'a', 'b', 'c'}});
  auto forged = written_by_caf(msg);
  // The vector's length (one varbyte, 3) becomes 2^28 - 1 with the same three bytes behind it.
  forged.erase(forged.end() - 4);
  const char huge[] = {'\xff', '\xff', '\xff', '\x7f'};
  forged.insert(forged.end() - 3, huge, huge + sizeof(huge));
  caf::message back;
  BOOST_REQUIRE(read(written_by_caf(msg), {}, msg.size(), back));  // the genuine one reads
  // In a child, so that its peak resident memory tells whether 256 MiB were allocated (and
  // zero-filled) for the length before the missing bytes were noticed.
  const pid_t child = comm::test::fork_child([&] {
    const long peak_before = peak_rss_kib();
    if (read(forged, {}, msg.size(), back)) return 3;
    return peak_rss_kib() - peak_before < (64 << 10) ? 0 : 4;
  });
  BOOST_TEST(comm::test::wait_child(child) == 0);
}

BOOST_AUTO_TEST_CASE(nesting_is_refused_before_it_outgrows_a_small_stack) {
  using comm::test::actors::nested_lists;
  using comm::test::actors::nested_messages;
  // In a child, so that a stack overflow is a failed test rather than the end of this one.
  const pid_t child = comm::test::fork_child([&] {
    return on_stack_of(small_stack, [&] {
      caf::message back;
      if (read(nested_messages(40000), {}, 1, back)) return 3;
      if (read(nested_lists(300000), {}, 1, back)) return 4;
      return 0;
    });
  });
  BOOST_TEST(comm::test::wait_child(child) == 0);
}

BOOST_AUTO_TEST_CASE(nesting_as_deep_as_applications_go_reads_back) {
  // The deepest nesting read on a small stack: deeper is refused (the bound depends on the
  // build's frame sizes; max_read_stack is what is fixed). In a child, as above.
  const auto deepest = [&](std::vector<char> (*make)(size_t)) {
    comm::test::channel depth_of;
    const pid_t child = comm::test::fork_child([&] {
      return on_stack_of(small_stack, [&] {
        caf::message back;
        uint64_t depth = 0;
        while (depth < 100000 && read(make(depth + 1), {}, 1, back)) ++depth;
        depth_of.send_word(depth);
        return 0;
      });
    });
    uint64_t depth = 0;
    const bool told = depth_of.receive_word(&depth);
    return comm::test::wait_child(child) == 0 && told ? depth : 0;
  };
  const uint64_t messages = deepest(comm::test::actors::nested_messages);
  const uint64_t lists = deepest(comm::test::actors::nested_lists);
  BOOST_TEST_MESSAGE("deepest nesting read: " << messages << " messages, " << lists << " lists");
  BOOST_TEST(messages >= 32u);
  BOOST_TEST(lists >= 32u);
  BOOST_TEST(messages < 40000u);
  // What CAF writes for a message 32 deep reads back equal.
  caf::message nested = caf::make_message(int32_t{1});
  for (int i = 0; i < 31; ++i) nested = caf::make_message(nested);
  caf::message back;
  BOOST_REQUIRE(read(written_by_caf(nested), {}, 1, back));
  BOOST_TEST(caf::to_string(back) == caf::to_string(nested));
}

BOOST_AUTO_TEST_CASE(an_error_inside_a_nested_message_fails_the_payload) {
  using comm::test::actors::put_message_start;
  using comm::test::actors::put_size;
  // A message holding a message of one byte vector that claims 1000 bytes and has none: CAF 0.17
  // drops the inner message's error and reads on, which here finds the payload's end.
  std::vector<char> payload;
  put_message_start(payload, "@<>+@message");
  put_message_start(payload, "@<>+@charbuf");
  put_size(payload, 1000);
  caf::message back;
  BOOST_TEST(!read(payload, {}, 1, back));
  // The same with CAF's own reader goes through, holding an empty message.
  caf::binary_deserializer source{&ctx, payload};
  BOOST_TEST(!source(back));
  BOOST_TEST(source.remaining() == 0u);
}

BOOST_AUTO_TEST_CASE(a_reason_reads_back_and_one_claiming_4_gib_is_an_error) {
  const caf::error reason = caf::make_error(caf::sec::runtime_error, std::string("why"));
  std::vector<char> payload;
  BOOST_REQUIRE(!write_reason_payload(&ctx, reason, payload));
  caf::error back;
  BOOST_REQUIRE(!read_reason_payload(&ctx, payload.data(), payload.size(), back));
  BOOST_TEST((back == reason));
  BOOST_TEST(sys.render(back) == sys.render(reason));
  payload.push_back(0);
  BOOST_TEST(static_cast<bool>(read_reason_payload(&ctx, payload.data(), payload.size(), back)));
  // In a child, so that its peak resident memory tells whether the claimed 4 GiB were filled.
  const auto lying = comm::test::actors::lying_reason();
  const pid_t child = comm::test::fork_child([&] {
    const long peak_before = peak_rss_kib();
    if (!read_reason_payload(&ctx, lying.data(), lying.size(), back)) return 3;
    return peak_rss_kib() - peak_before < (64 << 10) ? 0 : 4;
  });
  BOOST_TEST(comm::test::wait_child(child) == 0);
}

BOOST_AUTO_TEST_CASE(what_the_reader_remembers_of_type_names_stays_small) {
  // 300 messages, each naming a different list of 8,000 types: a reader that remembered every
  // list (256 at a time) would keep 2 million default values, about 100 MB.
  content_reader reader;
  for (int list = 0; list < 300; ++list) {
    std::string names = "@<>";
    for (int i = 0; i < 8000; ++i) names += i == list ? "+@u8" : "+@i8";
    std::vector<char> payload;
    comm::test::actors::put_message_start(payload, names);
    payload.resize(payload.size() + 8000, '\1');
    message_payload body;
    attachment_source none;
    BOOST_REQUIRE(!read_message_payload(&ctx, reader, payload.data(), payload.size(), none, false,
                                        false, 8000, body));
    BOOST_REQUIRE(body.content.size() == 8000u);
  }
  BOOST_TEST(reader.remembered_values() == 0u);
  // Short lists are still remembered.
  const auto two = written_by_caf(caf::make_message(int32_t{1}, int32_t{2}));
  message_payload body;
  attachment_source none;
  BOOST_REQUIRE(!read_message_payload(&ctx, reader, two.data(), two.size(), none, false, false, 2,
                                      body));
  BOOST_TEST(reader.remembered_values() == 2u);
}

BOOST_AUTO_TEST_CASE(infinities_and_nans_are_written_and_read_back) {
  const double inf = std::numeric_limits<double>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // In a child given 20 s: CAF 0.17.6's pack754 never returns for an infinity.
  const pid_t child = comm::test::fork_child([&] {
    // Plain (the direct writer), then with a nested message (CAF's serialiser), then as a reason.
    const caf::message plain = caf::make_message(inf, -inf, nan, -1.5f);
    const caf::message nested = caf::make_message(plain, -inf);
    for (const caf::message& msg : {plain, nested}) {
      auto elem = caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, msg);
      std::vector<char> payload;
      content_writer writer;
      attachment_list attached;
      if (write_message_payload(&ctx, writer, *elem, false, false, payload, attached)) return 2;
      caf::message back;
      if (!read(payload, {}, msg.size(), back)) return 3;
      const caf::message& values = msg.size() == 4 ? back : back.get_as<caf::message>(0);
      if (values.get_as<double>(0) != inf || values.get_as<double>(1) != -inf) return 4;
      if (!std::isinf(values.get_as<float>(2)) || values.get_as<float>(3) != -1.5f) return 5;
      if (msg.size() == 2 && back.get_as<double>(1) != -inf) return 6;
    }
    std::vector<char> reason;
    if (write_reason_payload(&ctx, caf::make_error(caf::sec::runtime_error, inf), reason)) return 7;
    caf::error back;
    if (read_reason_payload(&ctx, reason.data(), reason.size(), back)) return 8;
    if (back.context().get_as<double>(0) != inf) return 9;
    return 0;
  });
  BOOST_TEST(comm::test::wait_child(child) == 0);
}

BOOST_AUTO_TEST_CASE(finite_reals_are_written_in_cafs_format) {
  // Normal numbers as CAF writes them (the wire is unchanged); subnormals, which pack754 turns
  // into huge numbers of the other sign, as close as CAF's format holds them.
  BOOST_TEST(pack_real_mismatches<double>(200000) == 0);
  BOOST_TEST(pack_real_mismatches<float>(200000) == 0);
  // 1.5 x 2^-1023, a subnormal CAF's format holds exactly.
  const double tiny = std::numeric_limits<double>::denorm_min() * (uint64_t{3} << 50);
  BOOST_TEST(caf::detail::unpack754(pack_real(-tiny)) == -tiny);
  BOOST_TEST(pack_real(std::numeric_limits<double>::denorm_min()) == 0u);
  BOOST_TEST(pack_real(-0.0f) == 0u);
}

BOOST_AUTO_TEST_CASE(durations_of_unknown_units_are_refused) {
  using comm::test::actors::put_int;
  using comm::test::actors::put_message_start;
  // CAF's to_string(duration) reads the unit's name from a table indexed by the unit.
  const auto duration_payload = [](uint32_t unit) {
    std::vector<char> out;
    put_message_start(out, "@<>+@duration");
    put_int(out, unit);
    put_int(out, uint64_t{5});
    return out;
  };
  caf::message back;
  BOOST_TEST(read(duration_payload(3), {}, 1, back));
  BOOST_TEST(caf::to_string(back) == "(5ms)");
  // Errors and exit reasons without a context are looked into too.
  const auto none = caf::make_message(caf::error{}, caf::exit_msg{}, caf::down_msg{});
  BOOST_TEST(read(written_by_caf(none), {}, 3, back));
  caf::error no_reason;
  std::vector<char> normal;
  BOOST_REQUIRE(!write_reason_payload(&ctx, caf::exit_reason::normal, normal));
  BOOST_TEST(!read_reason_payload(&ctx, normal.data(), normal.size(), no_reason));
  BOOST_TEST(!read(duration_payload(0xfe3ee39a), {}, 1, back));
  std::vector<char> nested;
  put_message_start(nested, "@<>+@message");
  const auto bad = duration_payload(6);
  nested.insert(nested.end(), bad.begin(), bad.end());
  BOOST_TEST(!read(nested, {}, 1, back));
  // In a down frame's reason: an error whose context holds that message.
  std::vector<char> reason;
  reason.push_back(1);
  put_int(reason, static_cast<uint64_t>(caf::atom("system")));
  reason.insert(reason.end(), nested.begin(), nested.end());
  caf::error read_back;
  BOOST_TEST(static_cast<bool>(read_reason_payload(&ctx, reason.data(), reason.size(), read_back)));
}

BOOST_AUTO_TEST_CASE(durations_inside_stream_messages_are_refused) {
  // CAF's stream handshake and stream frames carry a message or an error too, and an actor that
  // does not stream prints an open_stream_msg it receives (print_and_drop), nested message and all.
  const caf::duration bad{static_cast<caf::time_unit>(0x7ffffff0), 5};
  const caf::duration good{caf::time_unit::milliseconds, 5};
  const auto in_error = [](const caf::duration& d) {
    return caf::make_error(caf::sec::runtime_error, caf::make_message(d));
  };
  const auto open = [](const caf::duration& d) {
    return caf::make_message(caf::open_stream_msg{caf::stream_slot{1}, caf::make_message(d),
                                                  nullptr, nullptr, caf::stream_priority::normal});
  };
  const auto batch = [](const caf::duration& d) {
    return caf::make_message(caf::downstream_msg{
        caf::stream_slots{1, 2}, nullptr, caf::downstream_msg::batch{1, caf::make_message(d), 1}});
  };
  const auto closed = [&](const caf::duration& d) {
    return caf::make_message(caf::downstream_msg{caf::stream_slots{1, 2}, nullptr,
                                                 caf::downstream_msg::forced_close{in_error(d)}});
  };
  const auto dropped = [&](const caf::duration& d) {
    return caf::make_message(caf::upstream_msg{caf::stream_slots{1, 2}, nullptr,
                                               caf::upstream_msg::forced_drop{in_error(d)}});
  };
  caf::message back;
  for (const caf::message& fine : {open(good), batch(good), closed(good), dropped(good)}) {
    BOOST_TEST(read(written_by_caf(fine), {}, 1, back));
  }
  for (const caf::message& forged : {open(bad), batch(bad), closed(bad), dropped(bad)}) {
    BOOST_TEST(!read(written_by_caf(forged), {}, 1, back));
  }
}

BOOST_AUTO_TEST_CASE(every_truncation_and_a_wrong_count_are_errors) {
  const caf::message msg = plain_message();
  const auto whole = written_by_caf(msg);
  caf::message back;
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    const std::vector<char> part(whole.begin(), whole.begin() + static_cast<long>(cut));
    BOOST_TEST_CONTEXT("first " << cut << " bytes") {
      BOOST_TEST(!read(part, {}, msg.size(), back));
    }
  }
  BOOST_TEST(!read(whole, {}, msg.size() + 1, back));
  auto longer = whole;
  longer.push_back('\0');
  BOOST_TEST(!read(longer, {}, msg.size(), back));
}

BOOST_AUTO_TEST_CASE(an_interface_reads_back_and_broken_ones_are_refused) {
  const interface ifs{"caf::replies_to<@atom, @i32, @i32>::with<@i32>", "", std::string(70, 'x')};
  std::vector<char> buf;
  encode_interface(ifs, buf);
  interface back;
  BOOST_TEST(decode_interface(buf.data(), buf.size(), back));
  BOOST_TEST((back == ifs));
  interface none;
  BOOST_TEST(decode_interface(nullptr, 0, none));
  BOOST_TEST(none.empty());
  // A cut between two signatures is a shorter interface; a cut inside a length, or a length
  // claiming more than is left, is refused.
  std::set<size_t> between;
  size_t at = 0;
  for (const auto& signature : ifs) between.insert(at += 4 + signature.size());
  for (size_t cut = 1; cut < buf.size(); ++cut) {
    interface part;
    BOOST_TEST_CONTEXT("first " << cut << " bytes") {
      BOOST_TEST(decode_interface(buf.data(), cut, part) == (between.count(cut) != 0));
    }
  }
  std::vector<char> huge(max_interface_bytes + 1, '\0');
  interface refused;
  BOOST_TEST(!decode_interface(huge.data(), huge.size(), refused));
}

BOOST_AUTO_TEST_SUITE_END()
