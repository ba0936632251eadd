// Tag matching on the transport interface (UCT's tag offload, seed 000), run over every transport
// the registry has a device for (tests/transport_list.hpp). A transport whose interface reports no
// cap_tag_* flag must answer unsupported everywhere and report zero tag limits; one that reports
// them must match posted receives in post order by tag and mask, deliver eager short, bcopy and
// zcopy messages into them (or to the unexpected handler, in FIRST/MORE fragments beyond one FIFO
// element), fetch a rendezvous into a matching receive or hand its address, length and key to the
// unexpected handler, and cancel receives and rendezvous as the seed says; every tagged send
// answers no_resource on a full queue and parked ones resume in order; callbacks run inside
// their interface's progress (or post, or cancel) and may send, post and cancel themselves; an
// eager zcopy of no entries is an empty message. Cases needing another
// process skip transports whose interfaces another process cannot reach, and say so. The shm cases
// at the end write malformed tagged cells into a receiver's FIFO.
// Every wait is bounded in iterations and time; nothing asserts on timing.
#define BOOST_TEST_MODULE transport_tag
#include "process_harness.hpp"
#include "test_util.hpp"
#include "tl_helpers.hpp"
#include "transport_list.hpp"
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include "../transports/shm/shm_segment.hpp"
#include "shm/shm.capnp.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace comm;
using namespace std::chrono_literals;
using comm::test::channel;
using comm::test::completion_probe;
using comm::test::connect;
using comm::test::fork_child;
using comm::test::receive_addresses;
using comm::test::send_addresses;
using comm::test::wait_child;

namespace tagtest {

// -- interfaces and progress ----------------------------------------------------------------------

/// Opens an interface of `transport` on its first device (`fifo_size` receive queue entries, 0
/// for the transport's default).
std::unique_ptr<tl::iface> open_iface(const std::string& transport, size_t fifo_size = 0) {
  tl::component* component = comm::test::find_component(transport);
  if (component == nullptr || component->devices().empty()) {
    throw std::runtime_error("no device for " + transport);
  }
  tl::iface_params params;
  params.device = component->devices().front();
  params.fifo_size = fifo_size;
  std::unique_ptr<tl::iface> iface;
  const status st = component->open(params, iface);
  if (st != status::ok) throw std::runtime_error("open " + transport + ": " + to_string(st));
  return iface;
}

/// True when `iface` offers tag matching.
bool has_tags(const tl::iface& iface) { return (iface.attr().caps & tl::cap_tag_any) != 0; }

using iface_list = std::vector<tl::iface*>;

/// Calls progress on `ifaces` until `done()` holds, at most `limit` long and 50 M rounds.
bool progress_until(const iface_list& ifaces, const std::function<bool()>& done,
                    std::chrono::milliseconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (uint64_t round = 0; round < 50'000'000; ++round) {
    for (tl::iface* iface : ifaces) iface->progress();
    if (done()) return true;
    if ((round & 255) == 0 && std::chrono::steady_clock::now() > deadline) return false;
  }
  return false;
}

/// Progresses `ifaces` `rounds` times.
void progress_rounds(const iface_list& ifaces, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    for (tl::iface* iface : ifaces) iface->progress();
  }
}

/// Retries `send` while it answers no_resource, progressing `ifaces`; returns its last answer.
status retry_while_busy(const iface_list& ifaces, const std::function<status()>& send) {
  status st = status::no_resource;
  progress_until(ifaces, [&] {
    st = send();
    return st != status::no_resource;
  });
  return st;
}

// -- data -----------------------------------------------------------------------------------------

std::vector<uint8_t> pattern(size_t length, uint32_t seed) {
  std::vector<uint8_t> bytes(length);
  for (size_t i = 0; i < length; ++i) {
    bytes[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 8) + (i >> 16));
  }
  return bytes;
}

/// 0, 1, 7, 8, 9, powers of two with neighbours up to `max`, and `max`.
std::vector<size_t> some_sizes(size_t max) {
  std::set<size_t> sizes = {0, max};
  for (size_t s : {size_t{1}, size_t{7}, size_t{8}, size_t{9}}) {
    if (s <= max) sizes.insert(s);
  }
  for (size_t p = 64; p <= max; p *= 4) {
    for (size_t s : {p - 1, p, p + 1}) {
      if (s <= max) sizes.insert(s);
    }
  }
  if (max > 0) sizes.insert(max - 1);
  return {sizes.begin(), sizes.end()};
}

/// Writes a byte vector in tag_eager_bcopy's pack callback.
size_t pack_vector(void* dest, void* arg) {
  const auto* bytes = static_cast<const std::vector<uint8_t>*>(arg);
  if (!bytes->empty()) std::memcpy(dest, bytes->data(), bytes->size());
  return bytes->size();
}

/// `data` as `pieces` iov entries of about equal length.
std::vector<tl::iov> split(const std::vector<uint8_t>& data, size_t pieces) {
  std::vector<tl::iov> out;
  const size_t step = pieces == 0 ? data.size() : (data.size() + pieces - 1) / pieces;
  for (size_t offset = 0; offset < data.size(); offset += std::max<size_t>(step, 1)) {
    const size_t n = std::min(std::max<size_t>(step, 1), data.size() - offset);
    out.push_back({data.data() + offset, n});
  }
  return out;
}

// -- a posted receive -----------------------------------------------------------------------------

/// A posted receive that records its callbacks (tag_context with a buffer of its own).
struct posted : tl::tag_context {
  std::vector<uint8_t> buffer;
  std::vector<tl::iov> entries;
  int consumed = 0;            ///< tag_consumed calls
  int completions = 0;         ///< completed calls
  int rndv_calls = 0;          ///< rndv calls
  bool consumed_first = true;  ///< tag_consumed came before completed/rndv
  tl::tag_t stag = 0;
  uint64_t imm = 0;
  size_t length = 0;
  status result = status::ok;
  std::vector<uint8_t> header;  ///< what rndv was given
  std::function<void()> on_complete;  ///< run at completion, when set

  /// A receive of `size` bytes in `pieces` iov entries.
  explicit posted(size_t size, size_t pieces = 1) : buffer(size, 0xee) {
    entries = split(buffer, pieces);
    tag_consumed = [](tl::tag_context* self) { ++static_cast<posted*>(self)->consumed; };
    completed = [](tl::tag_context* self, tl::tag_t stag, uint64_t imm, size_t length,
                   status result) {
      auto* p = static_cast<posted*>(self);
      if (p->consumed == 0 && result != status::canceled) p->consumed_first = false;
      ++p->completions;
      p->stag = stag;
      p->imm = imm;
      p->length = length;
      p->result = result;
      if (p->on_complete) p->on_complete();
    };
    rndv = [](tl::tag_context* self, tl::tag_t stag, const void* header, size_t length,
              status result) {
      auto* p = static_cast<posted*>(self);
      if (p->consumed == 0) p->consumed_first = false;
      ++p->rndv_calls;
      p->stag = stag;
      p->result = result;
      const auto* h = static_cast<const uint8_t*>(header);
      p->header.assign(h, h + length);
    };
  }
  posted(const posted&) = delete;
  posted& operator=(const posted&) = delete;

  /// Posts this receive for `tag` under `mask` on `iface`.
  status post(tl::iface& iface, tl::tag_t tag, tl::tag_t mask = ~tl::tag_t{0}) {
    return iface.tag_recv_zcopy(tag, mask, entries.data(), entries.size(), this);
  }
  /// True once completed or handed a rendezvous request.
  bool done() const { return completions + rndv_calls > 0; }
  /// The first `n` bytes of the buffer.
  std::vector<uint8_t> first(size_t n) const {
    const auto end = static_cast<std::ptrdiff_t>(std::min(n, buffer.size()));
    return {buffer.begin(), buffer.begin() + end};
  }
};

// -- unexpected messages --------------------------------------------------------------------------

/// Records what the unexpected handlers get: eager messages reassembled through the per-message
/// context (with every fragment's flags checked), rendezvous with their header, address, length
/// and key.
struct unexpected_log {
  /// One unexpected eager message, reassembled.
  struct message {
    tl::tag_t tag = 0;
    uint64_t imm = 0;
    std::vector<uint8_t> bytes;
    std::vector<unsigned> flags;  ///< each fragment's, without am_flag_desc
  };
  /// One unexpected rendezvous.
  struct rndv {
    tl::tag_t tag = 0;
    std::vector<uint8_t> header;
    uint64_t address = 0;
    size_t length = 0;
    std::vector<uint8_t> rkey;
    unsigned flags = 0;
  };
  std::vector<message> messages;
  std::vector<rndv> rendezvous;
  uint64_t bad_context = 0;   ///< fragments whose context was not what the first one set
  uint64_t bad_flags = 0;     ///< fragments with FIRST/MORE not as their position says
  uint64_t fragments = 0;
  bool keep = false;          ///< keep single-fragment messages offered as descriptors
  std::vector<std::pair<void*, std::vector<uint8_t>>> kept;  ///< kept descriptors and their bytes
  uint64_t open = 0;          ///< messages begun and not yet ended

  /// Installs both handlers on `iface`.
  void install(tl::iface& iface) {
    BOOST_REQUIRE(iface.set_tag_handlers(&on_eager, this, &on_rndv, this) == status::ok);
  }
  /// Releases every kept descriptor.
  void release_all(tl::iface& iface) {
    for (auto& k : kept) iface.release_am_desc(k.first);
    kept.clear();
  }
  /// True when every kept descriptor still holds its bytes.
  bool kept_intact() const {
    for (const auto& k : kept) {
      if (std::memcmp(k.first, k.second.data(), k.second.size()) != 0) return false;
    }
    return true;
  }

private:
  static status on_eager(void* arg, void* data, size_t length, unsigned flags, tl::tag_t stag,
                         uint64_t imm, void** context) {
    auto* self = static_cast<unexpected_log*>(arg);
    ++self->fragments;
    const auto* p = static_cast<const uint8_t*>(data);
    const bool first = (flags & tl::tag_flag_first) != 0;
    const bool more = (flags & tl::tag_flag_more) != 0;
    message* m = nullptr;
    if (first) {
      if (*context != nullptr) ++self->bad_context;
      m = new message{stag, imm, {}, {}};
      ++self->open;
      if (more) *context = m;  // a single fragment needs no context
    } else {
      m = static_cast<message*>(*context);
      if (m == nullptr) {
        ++self->bad_context;
        return status::ok;
      }
      if (m->tag != stag || m->imm != imm) ++self->bad_flags;
    }
    m->bytes.insert(m->bytes.end(), p, p + length);
    m->flags.push_back(flags & (tl::tag_flag_first | tl::tag_flag_more));
    if (more) return status::ok;
    self->messages.push_back(std::move(*m));
    if (!first || more) *context = nullptr;
    delete m;
    --self->open;
    if (self->keep && first && (flags & tl::am_flag_desc) != 0) {
      self->kept.emplace_back(data, std::vector<uint8_t>(p, p + length));
      return status::in_progress;
    }
    return status::ok;
  }

  static status on_rndv(void* arg, unsigned flags, tl::tag_t stag, const void* header,
                        size_t header_length, uint64_t remote_address, size_t length,
                        const void* rkey, size_t rkey_length) {
    auto* self = static_cast<unexpected_log*>(arg);
    const auto* h = static_cast<const uint8_t*>(header);
    const auto* k = static_cast<const uint8_t*>(rkey);
    self->rendezvous.push_back({stag, std::vector<uint8_t>(h, h + header_length), remote_address,
                                length, std::vector<uint8_t>(k, k + rkey_length), flags});
    return status::ok;
  }
};

/// The FIRST/MORE flags a message of `length` bytes should come with in fragments of `fragment`.
std::vector<unsigned> expected_flags(size_t length, size_t fragment) {
  std::vector<unsigned> out;
  size_t offset = 0;
  do {
    const size_t n = std::min(fragment, length - offset);
    out.push_back((offset == 0 ? tl::tag_flag_first : 0u) |
                  (offset + n < length ? tl::tag_flag_more : 0u));
    offset += n;
  } while (offset < length);
  return out;
}

// -- sending --------------------------------------------------------------------------------------

/// The kinds of eager send.
enum class eager { short_, bcopy, zcopy };

const char* name_of(eager kind) {
  switch (kind) {
    case eager::short_: return "short";
    case eager::bcopy: return "bcopy";
    case eager::zcopy: return "zcopy";
  }
  return "?";
}

/// The largest eager send of `kind` on `iface`.
size_t max_of(const tl::iface& iface, eager kind) {
  const tl::tag_limits& t = iface.attr().tag;
  return kind == eager::short_ ? t.eager.max_short
                               : kind == eager::bcopy ? t.eager.max_bcopy : t.eager.max_zcopy;
}

/// Sends `data` tagged `tag` with `kind`, retrying while busy; waits for a zcopy's completion
/// when `wait` (progressing `ifaces`). Returns the send's final status.
status send_eager(const iface_list& ifaces, tl::ep& ep, eager kind, tl::tag_t tag, uint64_t imm,
                  const std::vector<uint8_t>& data, bool wait = true) {
  switch (kind) {
    case eager::short_:
      return retry_while_busy(ifaces,
                              [&] { return ep.tag_eager_short(tag, data.data(), data.size()); });
    case eager::bcopy: {
      auto copy = data;
      return retry_while_busy(ifaces, [&] {
        const ssize_t n = ep.tag_eager_bcopy(tag, imm, &pack_vector, &copy);
        return n < 0 ? static_cast<status>(n) : status::ok;
      });
    }
    case eager::zcopy: {
      const auto entries = split(data, 3);
      completion_probe done;
      const status st = retry_while_busy(ifaces, [&] {
        return ep.tag_eager_zcopy(tag, imm, entries.data(), entries.size(), &done);
      });
      if (st != status::in_progress) return st;
      if (!wait) return st;
      if (!progress_until(ifaces, [&] { return done.calls == 1; })) return status::timed_out;
      return done.result;
    }
  }
  return status::invalid_param;
}

auto each_transport() { return boost::unit_test::data::make(comm::test::transports_under_test()); }

/// True when the case runs over `iface`'s transport; otherwise says why not, with what the
/// interface's info() says about tag matching (verbs: what the device offers, and that the
/// transport does not drive it).
bool runs_over(const tl::iface& iface, const std::string& transport) {
  if (has_tags(iface)) return true;
  const std::string info = iface.info();
  const size_t at = info.find("tag matching:");
  const std::string why =
      at == std::string::npos ? std::string() : "; " + info.substr(at, info.find('\n', at) - at);
  BOOST_TEST_MESSAGE("skipped over " << transport << ": no cap_tag_* flag" << why);
  return false;
}

bool readable(int fd, int timeout_ms) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, timeout_ms) == 1;
}

/// Two interfaces of a transport, an endpoint from the first to the second, and the second's
/// unexpected handlers installed.
struct pair {
  std::unique_ptr<tl::iface> sender;
  std::unique_ptr<tl::iface> receiver;
  std::unique_ptr<tl::ep> ep;
  unexpected_log unexpected;

  explicit pair(const std::string& transport)
      : sender(open_iface(transport)), receiver(open_iface(transport)) {
    if (!has_tags(*receiver)) return;
    unexpected.install(*receiver);
    ep = connect(*sender, *receiver);
  }
  iface_list both() const { return {sender.get(), receiver.get()}; }
};

}  // namespace tagtest

using namespace tagtest;

// -- capabilities ---------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(tag_limits_agree_with_the_flags_and_the_rest_answer_unsupported,
                     each_transport(), transport) {
  auto a = open_iface(transport);
  auto b = open_iface(transport);
  auto ep = connect(*a, *b);
  const tl::iface_attr& attr = a->attr();
  const tl::tag_limits& t = attr.tag;
  posted recv(8);
  if (!has_tags(*a)) {
    BOOST_TEST_MESSAGE(transport << " reports no tag matching");
    if (transport == "verbs") {
      // What the device offers is reported (the verbs test device: nothing).
      BOOST_TEST(a->info().find("tag matching: the device offers none") != std::string::npos,
                 a->info());
    }
    BOOST_TEST(t.eager.max_short == 0u);
    BOOST_TEST(t.eager.max_bcopy == 0u);
    BOOST_TEST(t.eager.max_zcopy == 0u);
    BOOST_TEST(t.rndv.max_zcopy == 0u);
    BOOST_TEST(t.recv.max_outstanding == 0u);
    BOOST_TEST(a->set_tag_handlers(nullptr, nullptr, nullptr, nullptr) == status::unsupported);
    BOOST_TEST(recv.post(*a, 1) == status::unsupported);
    BOOST_TEST(a->tag_recv_cancel(&recv, true) == status::unsupported);
    BOOST_TEST(ep->tag_eager_short(1, "x", 1) == status::unsupported);
    std::vector<uint8_t> data(4);
    BOOST_TEST(ep->tag_eager_bcopy(1, 0, &pack_vector, &data) ==
               static_cast<ssize_t>(status::unsupported));
    const tl::iov entry{data.data(), data.size()};
    BOOST_TEST(ep->tag_eager_zcopy(1, 0, &entry, 1, nullptr) == status::unsupported);
    uint64_t handle = 0;
    BOOST_TEST(ep->tag_rndv_zcopy(1, nullptr, 0, &entry, 1, nullptr, &handle) ==
               status::unsupported);
    BOOST_TEST(ep->tag_rndv_cancel(1) == status::unsupported);
    BOOST_TEST(ep->tag_rndv_request(1, nullptr, 0) == status::unsupported);
    return;
  }
  BOOST_TEST(((attr.caps & tl::cap_tag_any) == tl::cap_tag_any), "all four tag flags");
  BOOST_TEST(t.eager.max_short > 0u);
  BOOST_TEST(t.eager.max_bcopy >= t.eager.max_short);
  // shm and self take zcopy sends beyond one FIFO element (delivered unexpected in fragments);
  // verbs as large as one receive buffer, where an unexpected one lands whole.
  BOOST_TEST(t.eager.max_zcopy >= t.eager.max_bcopy);
  BOOST_TEST(t.eager.max_iov >= 1u);
  BOOST_TEST(t.rndv.max_zcopy >= t.eager.max_zcopy);
  BOOST_TEST(t.rndv.max_hdr >= 64u);
  BOOST_TEST(t.rndv.max_iov == 1u);
  BOOST_TEST(t.recv.max_iov >= 1u);
  BOOST_TEST(t.recv.max_zcopy >= t.rndv.max_zcopy);
  BOOST_TEST(t.recv.max_outstanding >= 16u);
  // Out of bounds: refused, nothing sent.
  const std::vector<uint8_t> big(t.eager.max_short + 1);
  BOOST_TEST(ep->tag_eager_short(1, big.data(), big.size()) == status::invalid_param);
  std::vector<tl::iov> many(t.eager.max_iov + 1, tl::iov{big.data(), 1});
  BOOST_TEST(ep->tag_eager_zcopy(1, 0, many.data(), many.size(), nullptr) == status::invalid_param);
  const std::vector<uint8_t> header(t.rndv.max_hdr + 1);
  uint64_t handle = 0;
  BOOST_TEST(ep->tag_rndv_request(1, header.data(), header.size()) == status::invalid_param);
  BOOST_TEST(ep->tag_rndv_zcopy(1, header.data(), header.size(), many.data(), 1, nullptr,
                                &handle) == status::invalid_param);
  BOOST_TEST(ep->tag_rndv_zcopy(1, nullptr, 0, many.data(), 2, nullptr, &handle) ==
             status::invalid_param);
  BOOST_TEST(ep->tag_rndv_cancel(12345) == status::no_elem);
  BOOST_TEST(b->tag_recv_cancel(&recv, false) == status::no_elem, "never posted");
  BOOST_TEST(recv.completions == 0);
  std::vector<tl::iov> wide(t.recv.max_iov + 1, tl::iov{recv.buffer.data(), 1});
  BOOST_TEST(b->tag_recv_zcopy(1, ~0ull, wide.data(), wide.size(), &recv) == status::invalid_param);
  BOOST_TEST(a->info().find(": tag: 0 of ") != std::string::npos);
}

// -- eager, matched -------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(eager_short_bcopy_and_zcopy_land_in_a_matching_posted_receive,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  uint32_t seed = 1;
  for (eager kind : {eager::short_, eager::bcopy, eager::zcopy}) {
    for (size_t size : some_sizes(max_of(*p.sender, kind))) {
      BOOST_TEST_CONTEXT(name_of(kind) << " of " << size << " bytes") {
        const auto data = pattern(size, ++seed);
        const uint64_t imm = kind == eager::short_ ? 0 : 0x1000 + seed;
        const tl::tag_t tag = 0xabc000 + seed;
        posted recv(size + 16, 3);
        BOOST_REQUIRE(recv.post(*p.receiver, tag) == status::ok);
        const status sent = send_eager(p.both(), *p.ep, kind, tag, imm, data);
        BOOST_TEST((sent == status::ok || sent == status::in_progress));
        BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
        BOOST_TEST(recv.completions == 1);
        BOOST_TEST(recv.consumed == 1);
        BOOST_TEST(recv.consumed_first);
        BOOST_TEST(recv.result == status::ok);
        BOOST_TEST(recv.stag == tag);
        BOOST_TEST(recv.imm == imm);
        BOOST_TEST(recv.length == size);
        BOOST_TEST((recv.first(size) == data));
        BOOST_TEST(recv.buffer[size] == 0xee, "nothing written past the message");
      }
    }
  }
  BOOST_TEST(p.unexpected.messages.empty());
  BOOST_TEST(p.unexpected.fragments == 0u);
}

BOOST_DATA_TEST_CASE(immediate_values_arrive_as_sent_and_short_sends_carry_zero,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto data = pattern(32, 3);
  for (uint64_t imm : {uint64_t{0}, uint64_t{1}, uint64_t{0x8000000000000000}, ~uint64_t{0}}) {
    for (eager kind : {eager::bcopy, eager::zcopy}) {
      posted recv(64);
      BOOST_REQUIRE(recv.post(*p.receiver, 7) == status::ok);
      send_eager(p.both(), *p.ep, kind, 7, imm, data);
      BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
      BOOST_TEST(recv.imm == imm, name_of(kind));
      // And unexpected.
      send_eager(p.both(), *p.ep, kind, 8, imm, data);
      BOOST_TEST(progress_until(p.both(), [&] { return !p.unexpected.messages.empty(); }));
      BOOST_TEST(p.unexpected.messages.back().imm == imm, name_of(kind));
      p.unexpected.messages.clear();
    }
  }
  posted recv(64);
  BOOST_REQUIRE(recv.post(*p.receiver, 9) == status::ok);
  send_eager(p.both(), *p.ep, eager::short_, 9, 0, data);
  BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
  BOOST_TEST(recv.imm == 0u);
}

// -- eager, unexpected ----------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(unexpected_eager_arrives_whole_or_in_first_more_fragments_with_its_context,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  // One FIFO element holds what a bcopy may pack: a message larger than that comes in fragments.
  const size_t fragment = p.sender->attr().tag.eager.max_bcopy;
  uint32_t seed = 40;
  for (eager kind : {eager::short_, eager::bcopy, eager::zcopy}) {
    std::vector<size_t> sizes = some_sizes(max_of(*p.sender, kind));
    if (kind == eager::zcopy) {
      for (size_t s : {fragment - 1, fragment, fragment + 1, 2 * fragment, 3 * fragment + 1234}) {
        if (s <= max_of(*p.sender, kind)) sizes.push_back(s);
      }
    }
    for (size_t size : sizes) {
      BOOST_TEST_CONTEXT(name_of(kind) << " of " << size << " bytes") {
        const auto data = pattern(size, ++seed);
        const tl::tag_t tag = 0x55000 + seed;
        const uint64_t imm = kind == eager::short_ ? 0 : seed;
        p.unexpected.messages.clear();
        send_eager(p.both(), *p.ep, kind, tag, imm, data);
        BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.messages.size() == 1; }));
        BOOST_REQUIRE(p.unexpected.messages.size() == 1u);
        const auto& m = p.unexpected.messages[0];
        BOOST_TEST(m.tag == tag);
        BOOST_TEST(m.imm == imm);
        BOOST_TEST((m.bytes == data));
        BOOST_TEST((m.flags == expected_flags(size, fragment)));
      }
    }
  }
  BOOST_TEST(p.unexpected.bad_context == 0u);
  BOOST_TEST(p.unexpected.bad_flags == 0u);
  BOOST_TEST(p.unexpected.open == 0u);
}

BOOST_DATA_TEST_CASE(fragments_of_messages_from_two_senders_keep_their_own_context,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  auto other = open_iface(transport);
  auto ep2 = connect(*other, *p.receiver);
  const size_t size = std::min<size_t>(3 * p.sender->attr().tag.eager.max_bcopy + 100,
                                       p.sender->attr().tag.eager.max_zcopy);
  const auto a = pattern(size, 1);
  const auto b = pattern(size, 2);
  const auto ea = split(a, 2);
  const auto eb = split(b, 2);
  completion_probe da, db;
  const iface_list all{p.sender.get(), other.get(), p.receiver.get()};
  // no_resource while a connection is still being set up (verbs): retried.
  BOOST_TEST(retry_while_busy(all, [&] {
               return ep2->tag_eager_zcopy(2, 22, eb.data(), eb.size(), &db);
             }) == status::in_progress);
  BOOST_TEST(retry_while_busy(all, [&] {
               return p.ep->tag_eager_zcopy(1, 11, ea.data(), ea.size(), &da);
             }) == status::in_progress);
  BOOST_TEST(progress_until(all,
                            [&] { return da.calls == 1 && db.calls == 1; }));
  BOOST_TEST(da.result == status::ok);
  BOOST_TEST(db.result == status::ok);
  BOOST_REQUIRE(p.unexpected.messages.size() == 2u);
  for (const auto& m : p.unexpected.messages) {
    BOOST_TEST((m.bytes == (m.tag == 1 ? a : b)));
    BOOST_TEST(m.imm == (m.tag == 1 ? 11u : 22u));
  }
  BOOST_TEST(p.unexpected.bad_context == 0u);
  BOOST_TEST(p.unexpected.open == 0u);
}

BOOST_DATA_TEST_CASE(an_unexpected_eager_message_kept_as_a_descriptor_stays_intact,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  p.unexpected.keep = true;
  const size_t size = p.sender->attr().tag.eager.max_bcopy;
  for (uint32_t i = 0; i < 4; ++i) {
    send_eager(p.both(), *p.ep, eager::bcopy, 100 + i, i, pattern(size, 60 + i));
  }
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.messages.size() == 4; }));
  BOOST_TEST(p.unexpected.kept.size() == 4u, "bcopy messages offered as descriptors");
  // Much more traffic through the same FIFO: the kept ones must not be reused meanwhile.
  p.unexpected.keep = false;
  for (uint32_t i = 0; i < 300; ++i) {
    send_eager(p.both(), *p.ep, eager::bcopy, 200, i, pattern(size, 70 + i));
  }
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.messages.size() == 304; }));
  BOOST_TEST(p.unexpected.kept_intact());
  const std::string lent = "4 of " + std::to_string(p.receiver->attr().max_am_descs);
  BOOST_TEST(p.receiver->info().find(lent) != std::string::npos, p.receiver->info());
  p.unexpected.release_all(*p.receiver);
  const std::string none = "0 of " + std::to_string(p.receiver->attr().max_am_descs);
  BOOST_TEST(p.receiver->info().find(none) != std::string::npos, p.receiver->info());
}

// -- matching -------------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(receives_match_by_tag_and_mask_in_post_order, each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  // Posted in this order: exact 0x12, any tag with low byte 0x34, anything, exact 0x1234.
  posted exact(16), low(16), any(16), late_exact(16);
  BOOST_REQUIRE(exact.post(*p.receiver, 0x12) == status::ok);
  BOOST_REQUIRE(low.post(*p.receiver, 0x34, 0xff) == status::ok);
  BOOST_REQUIRE(any.post(*p.receiver, 0, 0) == status::ok);
  BOOST_REQUIRE(late_exact.post(*p.receiver, 0x1234, ~0ull) == status::ok);
  const auto send = [&](tl::tag_t tag, uint8_t value) {
    const std::vector<uint8_t> data{value};
    send_eager(p.both(), *p.ep, eager::short_, tag, 0, data);
    progress_rounds(p.both(), 200);
  };
  send(0x1234, 1);  // low (posted before late_exact) takes it, not late_exact
  BOOST_TEST(progress_until(p.both(), [&] { return low.done(); }));
  BOOST_TEST(low.stag == 0x1234u);
  BOOST_TEST(late_exact.completions == 0);
  send(0x99, 2);    // any
  BOOST_TEST(progress_until(p.both(), [&] { return any.done(); }));
  BOOST_TEST(any.stag == 0x99u);
  send(0x1234, 3);  // now late_exact
  BOOST_TEST(progress_until(p.both(), [&] { return late_exact.done(); }));
  BOOST_TEST(late_exact.buffer[0] == 3);
  send(0x1234, 4);  // nothing posted for it: unexpected
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.messages.size() == 1; }));
  BOOST_TEST(exact.completions == 0);
  send(0x12, 5);
  BOOST_TEST(progress_until(p.both(), [&] { return exact.done(); }));
  BOOST_TEST(exact.buffer[0] == 5);
  // Identical receives complete in the order they were posted.
  std::vector<std::unique_ptr<posted>> same;
  for (int i = 0; i < 5; ++i) {
    same.push_back(std::make_unique<posted>(8));
    BOOST_REQUIRE(same.back()->post(*p.receiver, 0x77) == status::ok);
  }
  for (uint8_t i = 0; i < 5; ++i) send(0x77, i);
  BOOST_TEST(progress_until(p.both(), [&] { return same.back()->done(); }));
  for (uint8_t i = 0; i < 5; ++i) BOOST_TEST(same[i]->buffer[0] == i);
}

BOOST_DATA_TEST_CASE(a_message_longer_than_the_receive_is_truncated, each_transport(),
                     transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  for (eager kind : {eager::short_, eager::bcopy, eager::zcopy}) {
    const size_t size = std::min<size_t>(max_of(*p.sender, kind), 3000);
    const auto data = pattern(size, 9);
    posted recv(size / 2, 2);
    BOOST_REQUIRE(recv.post(*p.receiver, 5) == status::ok);
    send_eager(p.both(), *p.ep, kind, 5, 0, data);
    BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
    BOOST_TEST(recv.result == status::message_truncated, name_of(kind));
    BOOST_TEST(recv.length == size);
    BOOST_TEST((recv.buffer == std::vector<uint8_t>(data.begin(), data.begin() + size / 2)));
  }
}

BOOST_DATA_TEST_CASE(max_outstanding_receives_then_exceeds_limit, each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const size_t limit = p.receiver->attr().tag.recv.max_outstanding;
  std::vector<std::unique_ptr<posted>> receives;
  for (size_t i = 0; i < limit; ++i) {
    receives.push_back(std::make_unique<posted>(8));
    BOOST_REQUIRE(receives.back()->post(*p.receiver, i) == status::ok);
  }
  posted one_more(8);
  BOOST_TEST(one_more.post(*p.receiver, 9999) == status::exceeds_limit);
  BOOST_TEST(receives[3]->post(*p.receiver, 3) == status::invalid_param, "posted twice");
  // A matched one frees its place.
  send_eager(p.both(), *p.ep, eager::short_, 3, 0, {1, 2, 3});
  BOOST_TEST(progress_until(p.both(), [&] { return receives[3]->done(); }));
  BOOST_TEST(one_more.post(*p.receiver, 9999) == status::ok);
  BOOST_TEST(receives[4]->post(*p.receiver, 4) == status::invalid_param);
  // So does a canceled one.
  BOOST_TEST(p.receiver->tag_recv_cancel(receives[5].get(), true) == status::ok);
  posted another(8);
  BOOST_TEST(another.post(*p.receiver, 5) == status::ok);
  BOOST_TEST(another.post(*p.receiver, 5) == status::invalid_param);
  for (auto& r : receives) p.receiver->tag_recv_cancel(r.get(), true);
  p.receiver->tag_recv_cancel(&one_more, true);
  p.receiver->tag_recv_cancel(&another, true);
  BOOST_TEST(p.receiver->info().find(": tag: 0 of ") != std::string::npos);
}

// -- cancel ---------------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(a_canceled_receive_reports_canceled_unless_forced_and_matches_nothing,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  posted reported(16), forced(16), matched(16);
  BOOST_REQUIRE(reported.post(*p.receiver, 1) == status::ok);
  BOOST_REQUIRE(forced.post(*p.receiver, 2) == status::ok);
  BOOST_REQUIRE(matched.post(*p.receiver, 3) == status::ok);
  BOOST_TEST(p.receiver->tag_recv_cancel(&reported, false) == status::ok);
  BOOST_TEST(reported.completions == 1);
  BOOST_TEST(reported.result == status::canceled);
  BOOST_TEST(reported.consumed == 0);
  BOOST_TEST(p.receiver->tag_recv_cancel(&forced, true) == status::ok);
  BOOST_TEST(forced.completions == 0);
  BOOST_TEST(p.receiver->tag_recv_cancel(&reported, false) == status::no_elem);
  BOOST_TEST(reported.completions == 1);
  // Messages for the canceled tags go unexpected; a matched receive cannot be canceled after.
  for (tl::tag_t tag : {1, 2, 3}) send_eager(p.both(), *p.ep, eager::short_, tag, 0, {7});
  BOOST_TEST(progress_until(p.both(), [&] {
    return p.unexpected.messages.size() == 2 && matched.done();
  }));
  BOOST_TEST(p.receiver->tag_recv_cancel(&matched, false) == status::no_elem);
  BOOST_TEST(matched.completions == 1);
  BOOST_TEST(matched.result == status::ok);
  BOOST_TEST(forced.completions == 0);
  // A canceled context may be posted again.
  BOOST_TEST(reported.post(*p.receiver, 1) == status::ok);
  send_eager(p.both(), *p.ep, eager::short_, 1, 0, {8});
  BOOST_TEST(progress_until(p.both(), [&] { return reported.completions == 2; }));
  BOOST_TEST(reported.result == status::ok);
  BOOST_TEST(reported.buffer[0] == 8);
}

// -- rendezvous -----------------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(a_matched_rendezvous_is_fetched_into_the_posted_iov_and_completes_both,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  uint32_t seed = 80;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{100'000}, size_t{1} << 20}) {
    BOOST_TEST_CONTEXT(size << " bytes") {
      const auto data = pattern(size, ++seed);
      const std::vector<uint8_t> header = pattern(40, seed + 1);
      posted recv(size + 8, 4);
      BOOST_REQUIRE(recv.post(*p.receiver, 0xfeed) == status::ok);
      const tl::iov entry{data.data(), data.size()};
      completion_probe done;
      uint64_t handle = 0;
      const status st = retry_while_busy(p.both(), [&] {
        return p.ep->tag_rndv_zcopy(0xfeed, header.data(), header.size(), &entry, 1, &done,
                                    &handle);
      });
      BOOST_REQUIRE(st == status::in_progress);
      BOOST_TEST(handle != 0u);
      BOOST_TEST(progress_until(p.both(), [&] { return recv.done() && done.calls == 1; }));
      BOOST_TEST(done.result == status::ok);
      BOOST_TEST(recv.result == status::ok);
      BOOST_TEST(recv.consumed == 1);
      BOOST_TEST(recv.consumed_first);
      BOOST_TEST(recv.length == size);
      BOOST_TEST(recv.stag == 0xfeedu);
      BOOST_TEST((recv.first(size) == data));
      BOOST_TEST(p.unexpected.rendezvous.empty());
      // Completed: no longer outstanding.
      BOOST_TEST(p.ep->tag_rndv_cancel(handle) == status::no_elem);
      BOOST_TEST(p.ep->flush(nullptr) == status::ok);
      BOOST_TEST(done.calls == 1);
    }
  }
  // Longer than the receive: truncated, the sender's part done.
  const auto data = pattern(5000, 3);
  posted small(1000);
  BOOST_REQUIRE(small.post(*p.receiver, 1) == status::ok);
  const tl::iov entry{data.data(), data.size()};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(p.ep->tag_rndv_zcopy(1, nullptr, 0, &entry, 1, &done, &handle) ==
                status::in_progress);
  BOOST_TEST(progress_until(p.both(), [&] { return small.done() && done.calls == 1; }));
  BOOST_TEST(small.result == status::message_truncated);
  BOOST_TEST(small.length == 5000u);
  BOOST_TEST((small.buffer == std::vector<uint8_t>(data.begin(), data.begin() + 1000)));
  BOOST_TEST(done.result == status::ok);
}

BOOST_DATA_TEST_CASE(an_unexpected_rendezvous_gives_address_length_and_key_to_fetch_it_with,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto data = pattern(300'000, 17);
  const auto header = pattern(p.sender->attr().tag.rndv.max_hdr, 18);
  const tl::iov entry{data.data(), data.size()};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
                  return p.ep->tag_rndv_zcopy(0x42, header.data(), header.size(), &entry, 1,
                                              &done, &handle);
                }) == status::in_progress);
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.rendezvous.size() == 1; }));
  const auto& r = p.unexpected.rendezvous[0];
  BOOST_TEST(r.tag == 0x42u);
  BOOST_TEST((r.header == header));
  BOOST_TEST(r.address == reinterpret_cast<uintptr_t>(data.data()));
  BOOST_TEST(r.length == data.size());
  BOOST_TEST(!r.rkey.empty());
  // The receiver fetches it itself, through an endpoint of its own to the sender.
  auto back = connect(*p.receiver, *p.sender);
  tl::remote_key key;
  BOOST_REQUIRE(p.receiver->memory_domain()->rkey_unpack(r.rkey.data(), r.rkey.size(), &key) ==
                status::ok);
  std::vector<uint8_t> got(r.length);
  const tl::iov into{got.data(), got.size()};
  completion_probe fetched;
  const status st = back->get_zcopy(&into, 1, r.address, key, &fetched);
  if (st == status::in_progress) {
    BOOST_TEST(progress_until(p.both(), [&] { return fetched.calls == 1; }));
  } else {
    BOOST_TEST(st == status::ok);
  }
  BOOST_TEST((got == data));
  p.receiver->memory_domain()->rkey_release(&key);
  // The sender's operation stays outstanding (flush waits) until it cancels it.
  progress_rounds(p.both(), 1000);
  BOOST_TEST(done.calls == 0);
  completion_probe flushed;
  BOOST_TEST(p.ep->flush(&flushed) == status::in_progress);
  BOOST_TEST(p.ep->tag_rndv_cancel(handle) == status::ok);
  BOOST_TEST(progress_until(p.both(), [&] { return flushed.calls == 1; }));
  BOOST_TEST(flushed.result == status::ok);
  BOOST_TEST(p.ep->tag_rndv_cancel(handle) == status::no_elem);
  progress_rounds(p.both(), 1000);
  BOOST_TEST(done.calls == 0, "a canceled rendezvous never completes");
  // Its key no longer grants anything.
  tl::remote_key stale;
  BOOST_REQUIRE(p.receiver->memory_domain()->rkey_unpack(r.rkey.data(), r.rkey.size(), &stale) ==
                status::ok);
  completion_probe refused;
  status again = back->get_zcopy(&into, 1, r.address, stale, &refused);
  if (again == status::in_progress) {
    // Refused by the sender's device (RC: the error fails the connection).
    BOOST_TEST(progress_until(p.both(), [&] { return refused.calls == 1; }));
    again = refused.result;
  }
  BOOST_TEST(is_error(again), "get with the key of a canceled rendezvous: " << again);
  p.receiver->memory_domain()->rkey_release(&stale);
}

BOOST_DATA_TEST_CASE(a_rendezvous_canceled_before_the_receiver_looked_is_never_seen,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto data = pattern(50'000, 4);
  const tl::iov entry{data.data(), data.size()};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
                  return p.ep->tag_rndv_zcopy(0x66, "h", 1, &entry, 1, &done, &handle);
                }) == status::in_progress);
  BOOST_TEST(p.ep->tag_rndv_cancel(handle) == status::ok);
  BOOST_TEST(p.ep->tag_rndv_cancel(handle) == status::no_elem);
  // Posted after the cancel, before the receiver progressed: it does not take the canceled one.
  posted recv(data.size());
  BOOST_REQUIRE(recv.post(*p.receiver, 0x66) == status::ok);
  if (comm::test::canceled_rendezvous_may_arrive(transport)) {
    // The receiver's device holds it already: the receive may take it, and its fetch fails.
    progress_until(p.both(), [&] { return recv.done(); }, 5s);
    BOOST_TEST_MESSAGE(transport << ": the canceled rendezvous reached the receiver; its fetch "
                                 << (recv.done() ? to_string(recv.result) : "was not tried"));
    BOOST_TEST((!recv.done() || is_error(recv.result)), "never delivered as data");
    BOOST_TEST(done.calls == 0, "a canceled rendezvous never completes");
    return;
  }
  progress_rounds(p.both(), 2000);
  BOOST_TEST(!recv.done());
  BOOST_TEST(p.unexpected.rendezvous.empty());
  BOOST_TEST(done.calls == 0);
  completion_probe flushed;
  const status fl = p.ep->flush(&flushed);
  BOOST_TEST((fl == status::ok || fl == status::in_progress));
  if (fl == status::in_progress) {
    BOOST_TEST(progress_until(p.both(), [&] { return flushed.calls == 1; }));
  }
  // The next one, not canceled, takes the receive.
  BOOST_REQUIRE(p.ep->tag_rndv_zcopy(0x66, "h", 1, &entry, 1, &done, &handle) ==
                status::in_progress);
  BOOST_TEST(progress_until(p.both(), [&] { return recv.done() && done.calls == 1; }));
  BOOST_TEST((recv.buffer == data));
  BOOST_TEST(p.receiver->info().find("1 rendezvous canceled before delivery") !=
             std::string::npos);
}

BOOST_DATA_TEST_CASE(a_rendezvous_request_reaches_the_receives_rndv_callback_or_the_handler,
                     each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto header = pattern(100, 5);
  // Room for the whole header: a device that matches the request puts it in the receive's iov.
  posted recv(128);
  BOOST_REQUIRE(recv.post(*p.receiver, 0x10, 0xf0) == status::ok);
  BOOST_TEST(retry_while_busy(p.both(), [&] {
               return p.ep->tag_rndv_request(0x1a, header.data(), header.size());
             }) == status::ok);
  BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
  BOOST_TEST(recv.rndv_calls == 1);
  BOOST_TEST(recv.completions == 0);
  BOOST_TEST(recv.consumed == 1);
  BOOST_TEST(recv.consumed_first);
  BOOST_TEST(recv.stag == 0x1au);
  BOOST_TEST((recv.header == header));
  BOOST_TEST(p.receiver->tag_recv_cancel(&recv, false) == status::no_elem);
  // Unmatched: the unexpected rendezvous handler, without address, length or key.
  BOOST_TEST(p.ep->tag_rndv_request(0x2b, header.data(), 0) == status::ok);
  BOOST_TEST(p.ep->tag_rndv_request(0x2c, header.data(), header.size()) == status::ok);
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.rendezvous.size() == 2; }));
  for (const auto& r : p.unexpected.rendezvous) {
    BOOST_TEST(r.address == 0u);
    BOOST_TEST(r.length == 0u);
    BOOST_TEST(r.rkey.empty());
  }
  BOOST_TEST(p.unexpected.rendezvous[0].tag == 0x2bu);
  BOOST_TEST(p.unexpected.rendezvous[0].header.empty());
  BOOST_TEST((p.unexpected.rendezvous[1].header == header));
  BOOST_TEST(p.unexpected.messages.empty());
}

BOOST_DATA_TEST_CASE(flush_waits_for_rendezvous_and_eager_zcopy, each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto data = pattern(20'000, 6);
  const tl::iov entry{data.data(), data.size()};
  const tl::iov eager{data.data(), std::min(data.size(), p.sender->attr().tag.eager.max_zcopy)};
  completion_probe z, r, flushed;
  uint64_t handle = 0;
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
                  return p.ep->tag_eager_zcopy(1, 0, &eager, 1, &z);
                }) == status::in_progress);
  BOOST_REQUIRE(p.ep->tag_rndv_zcopy(2, nullptr, 0, &entry, 1, &r, &handle) ==
                status::in_progress);
  BOOST_TEST(p.ep->flush(&flushed) == status::in_progress);
  posted recv(data.size());
  progress_rounds({p.sender.get()}, 100);
  BOOST_TEST(flushed.calls == 0);
  BOOST_REQUIRE(recv.post(*p.receiver, 2) == status::ok);
  BOOST_TEST(progress_until(p.both(), [&] { return flushed.calls == 1; }));
  BOOST_TEST(z.calls == 1);
  BOOST_TEST(r.calls == 1);
  BOOST_TEST(recv.done());
  BOOST_TEST(p.unexpected.messages.size() == 1u);
}

BOOST_DATA_TEST_CASE(event_fd_wakes_a_sender_for_its_rendezvous_completion, each_transport(),
                     transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  if ((p.sender->attr().caps & tl::cap_event_fd) == 0) return;
  const auto data = pattern(10'000, 7);
  const tl::iov entry{data.data(), data.size()};
  posted recv(data.size());
  BOOST_REQUIRE(recv.post(*p.receiver, 3) == status::ok);
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
                  return p.ep->tag_rndv_zcopy(3, nullptr, 0, &entry, 1, &done, &handle);
                }) == status::in_progress);
  if (comm::test::acknowledged_by_device(transport)) {
    // The receiver's device matches and fetches it without the receiver's progress: the sender
    // may be told at once. If it was not yet, its event fd wakes it when it is.
    BOOST_TEST(progress_until({p.sender.get()}, [&] {
      return done.calls == 1 || p.sender->event_arm() == status::ok;
    }));
    if (done.calls == 0) BOOST_TEST(readable(p.sender->event_fd(), 10000));
    BOOST_TEST(progress_until({p.sender.get()}, [&] { return done.calls == 1; }));
    BOOST_TEST(progress_until({p.receiver.get()}, [&] { return recv.done(); }));
    BOOST_TEST((recv.buffer == data));
    return;
  }
  BOOST_TEST(progress_until({p.sender.get()}, [&] { return p.sender->event_arm() == status::ok; }));
  BOOST_TEST(!readable(p.sender->event_fd(), 0));
  BOOST_TEST(progress_until({p.receiver.get()}, [&] { return recv.done(); }));
  BOOST_TEST(readable(p.sender->event_fd(), 10000));
  BOOST_TEST(progress_until({p.sender.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST((recv.buffer == data));
}

BOOST_DATA_TEST_CASE(destroying_an_endpoint_cancels_its_rendezvous, each_transport(), transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  const auto data = pattern(4096, 8);
  const tl::iov entry{data.data(), data.size()};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
                  return p.ep->tag_rndv_zcopy(9, nullptr, 0, &entry, 1, &done, &handle);
                }) == status::in_progress);
  p.ep.reset();
  posted recv(data.size());
  BOOST_REQUIRE(recv.post(*p.receiver, 9) == status::ok);
  if (comm::test::canceled_rendezvous_may_arrive(transport)) {
    // The receiver's device holds it already: the receive may take it, and its fetch fails.
    progress_until(p.both(), [&] { return recv.done(); }, 5s);
    BOOST_TEST((!recv.done() || is_error(recv.result)), "never delivered as data");
    BOOST_TEST(done.calls == 0);
    return;
  }
  progress_rounds(p.both(), 2000);
  BOOST_TEST(!recv.done());
  BOOST_TEST(done.calls == 0);
  const std::string released = transport + ": md: 0 regions registered";
  BOOST_TEST(p.sender->info().find(released) != std::string::npos, p.sender->info());
}

// -- resources ----------------------------------------------------------------------------------

namespace tagtest {

/// A parked tag_eager_short carrying its sequence number; counts how often it was dispatched.
struct parked_tag_send : tl::pending_req {
  tl::ep* ep = nullptr;
  tl::tag_t tag = 0;
  uint64_t seq = 0;
  int calls = 0;
  parked_tag_send() {
    func = [](tl::pending_req* self) {
      auto* req = static_cast<parked_tag_send*>(self);
      ++req->calls;
      return req->ep->tag_eager_short(req->tag, &req->seq, sizeof(req->seq));
    };
  }
};

}  // namespace tagtest

BOOST_DATA_TEST_CASE(every_tagged_send_answers_no_resource_when_full_and_parked_ones_resume,
                     each_transport(), transport) {
  auto sender = open_iface(transport);
  auto receiver = open_iface(transport, 8);  // a small receive queue fills quickly
  if (!runs_over(*receiver, transport)) return;
  unexpected_log unexpected;
  unexpected.install(*receiver);
  auto ep = connect(*sender, *receiver);
  const iface_list both{sender.get(), receiver.get()};
  // A first message, so that a connection still being set up (no_resource too) is up.
  BOOST_REQUIRE(retry_while_busy(both, [&] { return ep->tag_eager_short(49, "w", 1); }) ==
                status::ok);
  BOOST_REQUIRE(progress_until(both, [&] { return unexpected.messages.size() == 1; }));
  unexpected.messages.clear();
  // Numbered short sends until the receiver's queue is full (nobody progresses it).
  uint64_t seq = 0;
  while (seq < 100'000 && ep->tag_eager_short(50, &seq, sizeof(seq)) == status::ok) ++seq;
  BOOST_TEST_REQUIRE(seq < 100'000u, "never answered no_resource");
  BOOST_TEST(seq > 0u);
  // Every tagged send answers no_resource now, and none of them is delivered later.
  BOOST_TEST(ep->tag_eager_short(51, &seq, sizeof(seq)) == status::no_resource);
  auto bytes = pattern(16, 4);
  BOOST_TEST(ep->tag_eager_bcopy(51, 1, &pack_vector, &bytes) ==
             static_cast<ssize_t>(status::no_resource));
  const tl::iov entry{bytes.data(), bytes.size()};
  completion_probe zcopy_done, rndv_done;
  BOOST_TEST(ep->tag_eager_zcopy(51, 1, &entry, 1, &zcopy_done) == status::no_resource);
  uint64_t handle = 0;
  BOOST_TEST(ep->tag_rndv_zcopy(51, "h", 1, &entry, 1, &rndv_done, &handle) ==
             status::no_resource);
  BOOST_TEST(ep->tag_rndv_request(51, "h", 1) == status::no_resource);
  // Parked tagged sends go out after the ones queued before, in order.
  std::vector<parked_tag_send> parked(10);
  for (auto& req : parked) {
    req.ep = ep.get();
    req.tag = 50;
    req.seq = seq++;
    BOOST_TEST(ep->pending_add(&req) == status::ok);
  }
  BOOST_TEST(ep->tag_eager_short(50, &seq, sizeof(seq)) == status::no_resource,
             "a send does not overtake parked ones");
  BOOST_TEST(progress_until(both, [&] { return unexpected.messages.size() == seq; }));
  progress_rounds(both, 200);
  BOOST_REQUIRE(unexpected.messages.size() == seq);
  for (uint64_t i = 0; i < seq; ++i) {
    const auto& m = unexpected.messages[i];
    BOOST_TEST_CONTEXT("message " << i) {
      BOOST_TEST(m.tag == 50u);
      BOOST_TEST(comm::test::sequence_of(m.bytes) == i);
    }
  }
  for (const auto& req : parked) BOOST_TEST(req.calls >= 1);
  BOOST_TEST(unexpected.rendezvous.empty());
  BOOST_TEST(zcopy_done.calls == 0);
  BOOST_TEST(rndv_done.calls == 0);
  // Room again and nothing parked: sends go at once, and nothing stays registered.
  BOOST_TEST(ep->tag_eager_short(52, &seq, sizeof(seq)) == status::ok);
  BOOST_TEST(progress_until(both, [&] { return unexpected.messages.size() == seq + 1; }));
  // Each transport words its registrations its own way (verbs: user and cached ones).
  const std::string released =
      transport == "verbs" ? "registrations 0 user" : transport + ": md: 0 regions registered";
  BOOST_TEST(sender->info().find(released) != std::string::npos, sender->info());
}

BOOST_DATA_TEST_CASE(an_eager_zcopy_of_no_entries_is_an_empty_message, each_transport(),
                     transport) {
  pair p(transport);
  if (!runs_over(*p.receiver, transport)) return;
  posted recv(8);
  BOOST_REQUIRE(recv.post(*p.receiver, 21) == status::ok);
  completion_probe done;
  const status st = retry_while_busy(
      p.both(), [&] { return p.ep->tag_eager_zcopy(21, 0x55, nullptr, 0, &done); });
  BOOST_TEST((st == status::ok || st == status::in_progress), to_string(st));
  if (st == status::in_progress) {
    BOOST_TEST(progress_until(p.both(), [&] { return done.calls == 1; }));
    BOOST_TEST(done.result == status::ok);
  }
  BOOST_TEST(progress_until(p.both(), [&] { return recv.done(); }));
  BOOST_TEST(recv.completions == 1);
  BOOST_TEST(recv.result == status::ok);
  BOOST_TEST(recv.stag == 21u);
  BOOST_TEST(recv.imm == 0x55u);
  BOOST_TEST(recv.length == 0u);
  BOOST_TEST(recv.buffer[0] == 0xee, "nothing written");
  // Unexpected: one fragment, FIRST without MORE, no bytes.
  BOOST_REQUIRE(retry_while_busy(p.both(), [&] {
    return p.ep->tag_eager_zcopy(22, 0x66, nullptr, 0, nullptr);
  }) != status::no_resource);
  BOOST_TEST(progress_until(p.both(), [&] { return p.unexpected.messages.size() == 1; }));
  BOOST_REQUIRE(p.unexpected.messages.size() == 1u);
  const auto& m = p.unexpected.messages[0];
  BOOST_TEST(m.tag == 22u);
  BOOST_TEST(m.imm == 0x66u);
  BOOST_TEST(m.bytes.empty());
  BOOST_TEST((m.flags == std::vector<unsigned>{tl::tag_flag_first}));
  completion_probe flushed;
  if (p.ep->flush(&flushed) == status::in_progress) {
    BOOST_TEST(progress_until(p.both(), [&] { return flushed.calls == 1; }));
  }
}

// -- callbacks and the progress that runs them ----------------------------------------------------

namespace tagtest {

/// Two interfaces with an endpoint each way, progressed only through progress_until(), which
/// records whose progress() (or post or cancel call) is running: every callback checks that it
/// runs inside a call of the interface it belongs to, on the test's thread.
struct two_way {
  std::unique_ptr<tl::iface> a, b;
  std::unique_ptr<tl::ep> ab, ba;
  const tl::iface* inside = nullptr;  ///< the interface whose call is running
  std::thread::id thread = std::this_thread::get_id();
  int wrong_context = 0;              ///< callbacks outside their interface's calls
  std::vector<std::string> steps;     ///< callbacks in the order they ran

  explicit two_way(const std::string& transport)
      : a(open_iface(transport)), b(open_iface(transport)) {
    if (!has_tags(*a)) return;
    ab = connect(*a, *b);
    ba = connect(*b, *a);
    // One message each way (no handlers yet: dropped), so that connections still being set up
    // are up before the chain starts.
    const iface_list both{a.get(), b.get()};
    retry_while_busy(both, [&] { return ab->tag_eager_short(100, "w", 1); });
    retry_while_busy(both, [&] { return ba->tag_eager_short(100, "w", 1); });
    progress_rounds(both, 200);
  }
  /// Records that callback `step` runs and checks it runs inside a call of `iface`.
  void ran(const std::string& step, const tl::iface& iface) {
    steps.push_back(step);
    if (inside != &iface || std::this_thread::get_id() != thread) {
      ++wrong_context;
      BOOST_TEST_MESSAGE(step << " ran outside its interface's progress");
    }
  }
  /// Runs `call` (a post or a cancel on `iface`) marked as inside `iface`.
  template <typename F> auto on(tl::iface& iface, F call) {
    const tl::iface* before = inside;
    inside = &iface;
    auto result = call();
    inside = before;
    return result;
  }
  /// Progresses both interfaces once each, marking whose progress runs.
  void round() {
    on(*a, [&] { return a->progress(); });
    on(*b, [&] { return b->progress(); });
  }
  /// Rounds until `done()`, bounded as tagtest::progress_until.
  bool progress_until(const std::function<bool()>& done) {
    return tagtest::progress_until({}, [&] {
      round();
      return done();
    });
  }
};

/// What the chain of callbacks shares.
struct chain {
  two_way* w = nullptr;
  posted* second = nullptr;  ///< posted on b by the ping handler
  posted* spare = nullptr;   ///< posted on b by the test, canceled from a callback
  int pings = 0;
};

/// b's unexpected eager handler: on the ping, posts a receive and answers from inside.
status on_ping(void* arg, void* data, size_t length, unsigned, tl::tag_t stag, uint64_t,
               void**) {
  auto* c = static_cast<chain*>(arg);
  c->w->ran("ping", *c->w->b);
  ++c->pings;
  if (stag != 1 || length != 4 || std::memcmp(data, "ping", 4) != 0) return status::ok;
  // Post a receive and send an answer, both from inside the handler.
  if (c->second->post(*c->w->b, 2) != status::ok) c->w->steps.push_back("post failed");
  if (c->w->ba->tag_eager_short(3, "pong", 4) != status::ok) c->w->steps.push_back("send failed");
  return status::ok;
}

}  // namespace tagtest

BOOST_DATA_TEST_CASE(callbacks_run_inside_their_interfaces_progress_and_may_send_and_post,
                     each_transport(), transport) {
  two_way w(transport);
  if (!runs_over(*w.a, transport)) return;
  posted pong(8), second(8), last(128), spare(8);
  completion_probe zcopy_done;
  const std::vector<uint8_t> tail = pattern(100, 12);
  const tl::iov tail_entry{tail.data(), tail.size()};
  chain c{&w, &second, &spare};
  BOOST_REQUIRE(w.b->set_tag_handlers(&on_ping, &c, nullptr, nullptr) == status::ok);
  BOOST_REQUIRE(spare.post(*w.b, 99) == status::ok);
  // a's answer arrives: from its completion, post the last receive and send to the second.
  pong.on_complete = [&] {
    w.ran("pong", *w.a);
    if (last.post(*w.a, 4) != status::ok) w.steps.push_back("post failed");
    auto bytes = pattern(6, 13);
    if (w.ab->tag_eager_bcopy(2, 7, &pack_vector, &bytes) != 6) w.steps.push_back("send failed");
  };
  // b's second receive completes: cancel the spare (its callback runs inside the cancel) and
  // send a zcopy whose completion b's progress reports.
  second.on_complete = [&] {
    w.ran("second", *w.b);
    if (w.b->tag_recv_cancel(&spare, false) != status::ok) w.steps.push_back("cancel failed");
    zcopy_done.on_call = [&] { w.ran("zcopy", *w.b); };
    const status st = w.ba->tag_eager_zcopy(4, 9, &tail_entry, 1, &zcopy_done);
    if (st != status::in_progress) w.steps.push_back(std::string("zcopy ") + to_string(st));
  };
  spare.on_complete = [&] { w.ran("spare", *w.b); };
  last.on_complete = [&] { w.ran("last", *w.a); };
  BOOST_REQUIRE(w.on(*w.a, [&] { return pong.post(*w.a, 3); }) == status::ok);
  BOOST_REQUIRE(w.ab->tag_eager_short(1, "ping", 4) == status::ok);
  BOOST_TEST(w.progress_until([&] { return last.done() && zcopy_done.calls == 1; }));
  for (int i = 0; i < 200; ++i) w.round();  // nothing more runs
  BOOST_TEST(w.wrong_context == 0);
  BOOST_TEST(c.pings == 1);
  BOOST_TEST(pong.completions == 1);
  BOOST_TEST((pong.first(4) == std::vector<uint8_t>{'p', 'o', 'n', 'g'}));
  BOOST_TEST(second.completions == 1);
  BOOST_TEST(second.imm == 7u);
  BOOST_TEST((second.first(6) == pattern(6, 13)));
  BOOST_TEST(spare.completions == 1);
  BOOST_TEST(spare.result == status::canceled);
  BOOST_TEST(last.completions == 1);
  BOOST_TEST(last.imm == 9u);
  BOOST_TEST(last.length == tail.size());
  BOOST_TEST((last.first(tail.size()) == tail));
  const std::vector<std::string> order{"ping", "pong", "second", "spare", "zcopy", "last"};
  const std::vector<std::string> order_late{"ping", "pong", "second", "spare", "last", "zcopy"};
  std::string steps;
  for (const std::string& step : w.steps) steps += step + " ";
  BOOST_TEST((w.steps == order || w.steps == order_late), "steps: " << steps);
}

// -- between processes ----------------------------------------------------------------------------

BOOST_DATA_TEST_CASE(tagged_eager_and_rendezvous_between_two_processes, each_transport(),
                     transport) {
  {
    auto probe = open_iface(transport);
    if (!runs_over(*probe, transport)) return;
  }
  const std::string why = comm::test::cannot_reach_other_processes(transport);
  if (!why.empty()) {
    BOOST_TEST_MESSAGE("skipped over " << transport << ": " << why);
    return;
  }
  constexpr size_t big = 200'000;
  channel to_parent, to_child;
  // The child receives: three posted (short, zcopy, rendezvous), the rest unexpected; it fetches
  // the unexpected rendezvous itself and reports what it got.
  const pid_t child = fork_child([&]() -> int {
    auto receiver = open_iface(transport);
    unexpected_log unexpected;
    unexpected.install(*receiver);
    posted a(64), b(big, 3), c(big, 2);
    CHILD_CHECK(a.post(*receiver, 1) == status::ok);
    CHILD_CHECK(b.post(*receiver, 2) == status::ok);
    CHILD_CHECK(c.post(*receiver, 3) == status::ok);
    send_addresses(to_parent, *receiver);
    std::vector<uint8_t> device, address;
    CHILD_CHECK(receive_addresses(to_child, &device, &address));
    auto back = connect(*receiver, device, address);
    CHILD_CHECK(progress_until({receiver.get()}, [&] {
      return a.done() && b.done() && c.done() && unexpected.messages.size() == 2 &&
             unexpected.rendezvous.size() == 1;
    }));
    CHILD_CHECK(a.result == status::ok && b.result == status::ok && c.result == status::ok);
    CHILD_CHECK(a.first(a.length) == pattern(a.length, 1));
    CHILD_CHECK(b.first(b.length) == pattern(big, 2) && b.imm == 22);
    CHILD_CHECK(c.first(c.length) == pattern(big, 3));
    for (const auto& m : unexpected.messages) {
      CHILD_CHECK(m.bytes == pattern(m.bytes.size(), static_cast<uint32_t>(m.tag)));
      CHILD_CHECK(m.imm == m.tag * 11);
    }
    CHILD_CHECK(unexpected.bad_context == 0 && unexpected.bad_flags == 0);
    const auto& r = unexpected.rendezvous[0];
    CHILD_CHECK(r.tag == 6 && r.length == big && r.header == pattern(8, 6));
    tl::remote_key key;
    CHILD_CHECK(receiver->memory_domain()->rkey_unpack(r.rkey.data(), r.rkey.size(), &key) ==
                status::ok);
    std::vector<uint8_t> got(r.length);
    const tl::iov into{got.data(), got.size()};
    CHILD_CHECK(back->get_zcopy(&into, 1, r.address, key, nullptr) == status::ok);
    receiver->memory_domain()->rkey_release(&key);
    CHILD_CHECK(got == pattern(big, 6));
    to_parent.send({1});
    std::vector<uint8_t> done;
    CHILD_CHECK(to_child.receive(&done));
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  auto sender = open_iface(transport);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  send_addresses(to_child, *sender);
  auto ep = connect(*sender, device, address);
  const auto a = pattern(std::min<size_t>(40, sender->attr().tag.eager.max_short), 1);
  BOOST_TEST(send_eager({sender.get()}, *ep, eager::short_, 1, 0, a) == status::ok);
  BOOST_TEST(send_eager({sender.get()}, *ep, eager::zcopy, 2, 22, pattern(big, 2)) == status::ok);
  const auto c = pattern(big, 3);
  const tl::iov centry{c.data(), c.size()};
  completion_probe cdone;
  uint64_t chandle = 0;
  BOOST_TEST(ep->tag_rndv_zcopy(3, "x", 1, &centry, 1, &cdone, &chandle) == status::in_progress);
  BOOST_TEST(send_eager({sender.get()}, *ep, eager::bcopy, 4, 44,
                        pattern(sender->attr().tag.eager.max_bcopy, 4)) == status::ok);
  BOOST_TEST(send_eager({sender.get()}, *ep, eager::zcopy, 5, 55, pattern(big, 5)) == status::ok);
  const auto f = pattern(big, 6);
  const tl::iov fentry{f.data(), f.size()};
  completion_probe fdone;
  uint64_t fhandle = 0;
  const auto fheader = pattern(8, 6);
  BOOST_TEST(ep->tag_rndv_zcopy(6, fheader.data(), fheader.size(), &fentry, 1, &fdone, &fhandle) ==
             status::in_progress);
  BOOST_TEST(progress_until({sender.get()}, [&] { return cdone.calls == 1; }));
  BOOST_TEST(cdone.result == status::ok);
  std::vector<uint8_t> report;
  bool reported = false;
  progress_until({sender.get()}, [&] {
    pollfd pfd{to_parent.fds[0], POLLIN, 0};
    if (::poll(&pfd, 1, 0) == 1) reported = to_parent.receive(&report);
    return reported;
  });
  BOOST_TEST((reported && report == std::vector<uint8_t>{1}));
  BOOST_TEST(fdone.calls == 0);
  BOOST_TEST(ep->tag_rndv_cancel(fhandle) == status::ok);
  to_child.send({1});
  BOOST_TEST(wait_child(child) == 0);
}

BOOST_DATA_TEST_CASE(a_dead_receiver_fails_outstanding_tagged_zcopy_and_rendezvous,
                     each_transport(), transport) {
  {
    auto probe = open_iface(transport);
    if (!runs_over(*probe, transport)) return;
    if ((probe->attr().caps & tl::cap_peer_failure) == 0) {
      BOOST_TEST_MESSAGE("skipped over " << transport << ": no cap_peer_failure");
      return;
    }
  }
  const std::string why = comm::test::cannot_reach_other_processes(transport);
  if (!why.empty()) {
    BOOST_TEST_MESSAGE("skipped over " << transport << ": " << why);
    return;
  }
  channel to_parent, to_child;
  const pid_t child = fork_child([&]() -> int {
    auto receiver = open_iface(transport);
    send_addresses(to_parent, *receiver);
    std::vector<uint8_t> never;
    to_child.receive(&never, 30000);  // never progresses; killed
    return 0;
  });
  BOOST_REQUIRE(child > 0);
  auto sender = open_iface(transport);
  comm::test::failure_log failures;
  failures.install(*sender);
  std::vector<uint8_t> device, address;
  BOOST_REQUIRE(receive_addresses(to_parent, &device, &address));
  auto ep = connect(*sender, device, address);
  const auto data = pattern(50'000, 1);
  const tl::iov entry{data.data(), data.size()};
  completion_probe eager_done, rndv_done, flushed;
  uint64_t handle = 0;
  BOOST_TEST(ep->tag_eager_zcopy(1, 0, &entry, 1, &eager_done) == status::in_progress);
  BOOST_TEST(ep->tag_rndv_zcopy(2, nullptr, 0, &entry, 1, &rndv_done, &handle) ==
             status::in_progress);
  BOOST_TEST(ep->flush(&flushed) == status::in_progress);
  progress_rounds({sender.get()}, 100);
  ::kill(child, SIGKILL);
  BOOST_TEST(wait_child(child) == -1);
  BOOST_TEST(progress_until({sender.get()}, [&] {
    return eager_done.calls == 1 && rndv_done.calls == 1 && flushed.calls == 1;
  }));
  BOOST_TEST(eager_done.result == status::connection_reset);
  BOOST_TEST(rndv_done.result == status::connection_reset);
  BOOST_TEST(failures.entries.size() == 1u);
  BOOST_TEST(ep->tag_rndv_cancel(handle) == status::no_elem);
  ep.reset();
  const std::string released = transport + ": md: 0 regions registered";
  BOOST_TEST(sender->info().find(released) != std::string::npos, sender->info());
}

// -- shm: a hostile peer's tagged cells -----------------------------------------------------------

namespace {

/// A rogue sender writing tagged cells straight into a mapped shm segment.
struct rogue {
  tl::shm::segment seg;
  explicit rogue(tl::iface& receiver) {
    const auto address = tl::shm::iface_addr::unpack(receiver.iface_address());
    BOOST_REQUIRE(address.has_value());
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
    BOOST_REQUIRE(pidfd >= 0);
    BOOST_REQUIRE(tl::shm::segment::attach(pidfd, *address, &seg) == status::ok);
    ::close(pidfd);
  }
  uint64_t claim() {
    return tl::shm::shared_word(seg.control().head).fetch_add(1) & ~tl::shm::head_armed;
  }
  void publish(uint64_t index, tl::shm::cell_meta meta) {
    tl::shm::cell_header* cell = seg.cell(index);
    cell->meta = meta.pack();
    tl::shm::shared_word(cell->seq).store(index + 1, std::memory_order_release);
  }
  uint8_t* data(uint64_t index) { return tl::shm::segment::cell_data(seg.cell(index)); }
  uint64_t ack(uint64_t index) { return tl::shm::shared_word(*seg.ack(index)).load(); }
  /// Writes a good tag header for `tag` at the start of the cell's data.
  void good_header(uint64_t index, tl::tag_t tag) {
    wire::header_writer<wire::schema::ShmTagHeader> writer;
    writer.fields().setTag(tag);
    writer.fields().setImm(0);
    writer.copy_to(data(index));
  }
  /// Copies a built message's only segment into the cell's buffer; returns its words.
  uint16_t put(uint64_t index, capnp::MessageBuilder& message) {
    const auto words = message.getSegmentsForOutput()[0];
    std::memcpy(seg.buffer(index), words.begin(), words.size() * 8);
    return static_cast<uint16_t>(words.size());
  }
};

size_t malformed_cells(const tl::iface& iface) {
  const std::string info = iface.info();
  const size_t at = info.find("shm: malformed cells ");
  const size_t skip = std::strlen("shm: malformed cells ");
  return at == std::string::npos ? ~size_t{0} : std::stoul(info.substr(at + skip));
}

}  // namespace

BOOST_AUTO_TEST_CASE(shm_malformed_tagged_cells_are_skipped_and_consume_no_receive) {
  if (comm::test::find_component("shm") == nullptr || !comm::test::requested("shm")) return;
  using tl::shm::cell_meta;
  namespace shm = tl::shm;
  auto sender = open_iface("shm");
  auto receiver = open_iface("shm");
  unexpected_log unexpected;
  unexpected.install(*receiver);
  posted recv(64);
  BOOST_REQUIRE(recv.post(*receiver, 0, 0) == status::ok);  // would take any tagged message
  rogue bad(*receiver);
  const size_t before = malformed_cells(*receiver);
  size_t bad_cells = 0;

  // Inline: shorter than its header, longer than the cell, a header that is not one.
  uint64_t i = bad.claim();
  bad.good_header(i, 1);
  bad.publish(i, cell_meta{0, shm::cell_tag_inline, 0, 8});
  ++bad_cells;
  i = bad.claim();
  bad.good_header(i, 1);
  bad.publish(i, cell_meta{0, shm::cell_tag_inline, 0, 5000});
  ++bad_cells;
  i = bad.claim();
  std::memset(bad.data(i), 0xff, 24);  // root pointer with pointers in it
  bad.publish(i, cell_meta{0, shm::cell_tag_inline, 0, 30});
  ++bad_cells;
  i = bad.claim();
  const uint64_t wrong_root = uint64_t{1} << 32;  // claims one data word: shorter than the header
  std::memcpy(bad.data(i), &wrong_root, 8);
  bad.publish(i, cell_meta{0, shm::cell_tag_inline, 0, 24});
  ++bad_cells;
  // Bcopy and request: longer than the buffer / the largest header.
  i = bad.claim();
  bad.good_header(i, 1);
  bad.publish(i, cell_meta{0, shm::cell_tag_bcopy, 0, 1u << 30});
  ++bad_cells;
  i = bad.claim();
  bad.good_header(i, 1);
  bad.publish(i, cell_meta{0, shm::cell_tag_request, 0, 100'000});
  ++bad_cells;
  // Tagged zcopy: descriptor size, garbage, a lie about its cell, too many iov entries.
  const uint64_t z1 = bad.claim();
  bad.publish(z1, cell_meta{0, shm::cell_tag_zcopy, 1000, 8000});
  ++bad_cells;
  const uint64_t z2 = bad.claim();
  std::memset(bad.seg.buffer(z2), 0xab, 64);
  bad.publish(z2, cell_meta{0, shm::cell_tag_zcopy, 4, 32});
  ++bad_cells;
  const uint64_t z3 = bad.claim();
  {
    capnp::MallocMessageBuilder message;
    auto d = message.initRoot<wire::schema::ShmTagZcopyDescriptor>();
    d.setSenderPid(::getpid());
    d.setCompletionSeq(z3 + 7);
    d.setTag(1);
    const uint16_t words = bad.put(z3, message);
    bad.publish(z3, cell_meta{0, shm::cell_tag_zcopy, words, words * 8u});
    ++bad_cells;
  }
  const uint64_t z4 = bad.claim();
  {
    capnp::MallocMessageBuilder message;
    auto d = message.initRoot<wire::schema::ShmTagZcopyDescriptor>();
    d.setSenderPid(::getpid());
    d.setCompletionSeq(z4 + 1);
    d.initIov(shm::zcopy_max_iov + 1);
    const uint16_t words = bad.put(z4, message);
    bad.publish(z4, cell_meta{0, shm::cell_tag_zcopy, words, words * 8u});
    ++bad_cells;
  }
  // A zcopy naming memory that is not mapped: acked with an error, nothing delivered.
  const uint64_t z5 = bad.claim();
  {
    capnp::MallocMessageBuilder message;
    auto d = message.initRoot<wire::schema::ShmTagZcopyDescriptor>();
    d.setSenderPid(::getpid());
    d.setCompletionSeq(z5 + 1);
    d.setTag(1);
    auto list = d.initIov(1);
    list[0].setAddress(8);
    list[0].setLength(4096);
    const uint16_t words = bad.put(z5, message);
    bad.publish(z5, cell_meta{0, shm::cell_tag_zcopy, words, words * 8u});
  }
  // Rendezvous: garbage, header length lies, slot out of range, a key with no length, a sender
  // address that names nobody.
  const auto rndv = [&](const std::function<void(wire::schema::ShmTagRndvDescriptor::Builder)>&
                            edit,
                        size_t header_length) {
    const uint64_t at = bad.claim();
    capnp::MallocMessageBuilder message;
    auto d = message.initRoot<wire::schema::ShmTagRndvDescriptor>();
    const auto own = shm::iface_addr::unpack(sender->iface_address());
    d.setSenderPid(own->pid);
    d.setSenderFd(own->fd);
    d.setSenderIfaceId(own->iface_id);
    d.setSenderFifoSize(own->fifo_size);
    d.setSenderCellSize(own->cell_size);
    d.setSenderSegSize(own->segment_size);
    d.setOpSlot(3);
    d.setOpGeneration(1);
    d.setTag(1);
    d.setHeaderLength(static_cast<uint32_t>(header_length));
    edit(d);
    const uint16_t words = bad.put(at, message);
    bad.publish(at, cell_meta{0, shm::cell_tag_rndv, words,
                              static_cast<uint32_t>(words * 8u + header_length)});
  };
  const uint64_t r1 = bad.claim();
  std::memset(bad.seg.buffer(r1), 0x5a, 128);
  bad.publish(r1, cell_meta{0, shm::cell_tag_rndv, 8, 64});
  ++bad_cells;
  rndv([](auto d) { d.setHeaderLength(17); }, 4);
  ++bad_cells;
  rndv([](auto d) { d.setOpSlot(shm::rndv_slots); }, 0);
  ++bad_cells;
  rndv([](auto d) { d.setLength(4096); }, 0);
  ++bad_cells;
  rndv([](auto d) { d.setSenderFifoSize(3); }, 0);
  ++bad_cells;
  // Well formed, naming a slot the sender never posted: claimed by nobody, skipped quietly.
  rndv([](auto) {}, 0);
  // And a kind past the tagged ones.
  i = bad.claim();
  bad.publish(i, cell_meta{0, 42, 0, 0});
  ++bad_cells;

  progress_rounds({receiver.get(), sender.get()}, 200);
  BOOST_TEST(malformed_cells(*receiver) == before + bad_cells);
  BOOST_TEST(!recv.done(), "a bad cell consumed a posted receive");
  BOOST_TEST(unexpected.messages.empty());
  BOOST_TEST(unexpected.rendezvous.empty());
  for (uint64_t z : {z1, z2, z3, z4, z5}) {
    BOOST_TEST((bad.ack(z) >> shm::ack_shift) == z + 1);
    BOOST_TEST((bad.ack(z) & shm::ack_code_mask) != 0u, "zcopy at " << z << " acked with an error");
  }
  // A good peer is not disturbed: its message takes the receive.
  auto ep = connect(*sender, *receiver);
  BOOST_TEST(send_eager({sender.get(), receiver.get()}, *ep, eager::short_, 77, 0, {1, 2, 3}) ==
             status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return recv.done(); }));
  BOOST_TEST(recv.stag == 77u);
  BOOST_TEST(recv.result == status::ok);
  const auto data = pattern(30'000, 12);
  posted second(data.size());
  BOOST_REQUIRE(second.post(*receiver, 78) == status::ok);
  const tl::iov entry{data.data(), data.size()};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(ep->tag_rndv_zcopy(78, nullptr, 0, &entry, 1, &done, &handle) ==
                status::in_progress);
  BOOST_TEST(progress_until({receiver.get(), sender.get()},
                            [&] { return second.done() && done.calls == 1; }));
  BOOST_TEST((second.buffer == data));
  BOOST_TEST(done.result == status::ok);
}

BOOST_AUTO_TEST_CASE(shm_a_rendezvous_whose_buffer_is_gone_fails_the_sender_and_keeps_the_receive) {
  if (comm::test::find_component("shm") == nullptr || !comm::test::requested("shm")) return;
  auto sender = open_iface("shm");
  auto receiver = open_iface("shm");
  auto ep = connect(*sender, *receiver);
  const size_t size = 4 * 4096;
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  BOOST_REQUIRE(mapped != MAP_FAILED);
  std::memset(mapped, 7, size);
  posted recv(size);
  BOOST_REQUIRE(recv.post(*receiver, 5) == status::ok);
  const tl::iov entry{mapped, size};
  completion_probe done;
  uint64_t handle = 0;
  BOOST_REQUIRE(ep->tag_rndv_zcopy(5, nullptr, 0, &entry, 1, &done, &handle) ==
                status::in_progress);
  ::munmap(mapped, size);  // still registered, no longer there: the receiver's read fails
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return done.calls == 1; }));
  BOOST_TEST(done.result == status::io_error);
  BOOST_TEST(!recv.done(), "a failed fetch ended the receive");
  BOOST_TEST(receiver->info().find("1 failed fetches") != std::string::npos, receiver->info());
  // The receive is still there for the next message.
  BOOST_TEST(send_eager({sender.get(), receiver.get()}, *ep, eager::short_, 5, 0, {9}) ==
             status::ok);
  BOOST_TEST(progress_until({receiver.get(), sender.get()}, [&] { return recv.done(); }));
  BOOST_TEST(recv.buffer[0] == 9);
}
