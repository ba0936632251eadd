// Blobs lent over shm (actors/src/lending.hpp): a blob sent to a node in another process is read
// there in place, in the sender's memory, and the sender frees it only once the receiver's last
// copy is gone; the lent bytes per connection are bounded; a killed receiver or sender leaves
// nothing behind and nothing dangling; lends and releases forged by a hostile peer close its
// connection and nothing else. A holder node and a lender node each run in a forked child; this
// process stays single-threaded (it forks, and speaks libcomm as the forged peer).
#define BOOST_TEST_MODULE actors_blob_lend
#include <boost/test/unit_test.hpp>

#include "test_actors_forged.hpp"
#include "test_actors_scenarios.hpp"
#include "test_util.hpp"
#include "rkey_edit.hpp"

#include "schema/wire.capnp.h"

#include <comm/memory.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <thread>

using namespace comm::test::actors;
using comm::test::fork_child;
using comm::test::wait_child;

namespace {

using lkeep_atom = caf::atom_constant<caf::atom("lkeep")>;
using ldigest_atom = caf::atom_constant<caf::atom("ldigest")>;
using ldrop_atom = caf::atom_constant<caf::atom("ldrop")>;
using lgive_atom = caf::atom_constant<caf::atom("lgive")>;
using lstats_atom = caf::atom_constant<caf::atom("lstats")>;
using lecho_atom = caf::atom_constant<caf::atom("lecho")>;
using lforward_atom = caf::atom_constant<caf::atom("lforward")>;

const std::string holder_name = "holder";
constexpr size_t mib = size_t{1} << 20;
constexpr auto timeout = std::chrono::seconds(20);

/// The holder's state: the blobs it keeps.
struct holder_state {
  std::vector<blob> held;
};

/// The counters of a node that concern lending.
using lend_counters = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>;

lend_counters counters_of(caf::actor_system& sys) {
  const auto s = node_of(sys).stats();
  return {s.blobs_lent, s.lent_now, s.blobs_borrowed, s.borrowed_copied};
}

/// Keeps blobs, digests them, drops them, gives out blobs of its own and echoes.
caf::behavior holder(caf::stateful_actor<holder_state>* self) {
  return {
      [self](lkeep_atom, blob& b) {
        self->state.held.push_back(b);
        return digest_of(b.data(), b.size());
      },
      [self](ldigest_atom, int32_t i) -> caf::result<uint64_t> {
        if (i < 0 || static_cast<size_t>(i) >= self->state.held.size()) {
          return caf::make_error(caf::sec::invalid_argument, "no such blob");
        }
        const blob& b = self->state.held[static_cast<size_t>(i)];
        return digest_of(b.data(), b.size());
      },
      [self](ldrop_atom) {
        self->state.held.clear();
        return int32_t{0};
      },
      [](lgive_atom, uint32_t size, uint32_t seed) { return patterned_blob(size, seed); },
      [](lecho_atom, blob& b) { return b; },
      // Sends `b` on to the holder at `address` to keep, from an actor of its own thread (a
      // lookup blocks); answers with that holder's digest. Keeps nothing itself.
      [self](lforward_atom, blob& b, std::string& address) -> caf::result<uint64_t> {
        auto rp = self->make_response_promise<uint64_t>();
        self->spawn<caf::detached>([rp, b, address](caf::event_based_actor* fwd) mutable {
          auto next = node_of(fwd->home_system()).lookup(address, holder_name);
          if (!next) {
            rp.deliver(next.error());
            fwd->quit();
            return caf::behavior{[](int32_t) {}};
          }
          fwd->request(*next, timeout, lkeep_atom::value, std::move(b))
              .then(
                  [rp, fwd](uint64_t d) mutable {
                    rp.deliver(d);
                    fwd->quit();
                  },
                  [rp, fwd](caf::error& e) mutable {
                    rp.deliver(std::move(e));
                    fwd->quit();
                  });
          return caf::behavior{[](int32_t) {}};
        });
        return rp;
      },
      [self](lstats_atom) -> caf::result<uint64_t, uint64_t, uint64_t, uint64_t> {
        auto [lent, now, borrowed, copied] = counters_of(self->home_system());
        return {lent, now, borrowed, copied};
      },
  };
}

/// Body of the holder node: the service (for still_serves) and the holder, published; stops on
/// anything arriving on `in` (or after 60 s).
int holder_process(const channel& out, const channel& in, const node_tweak& tweak) {
  caf::actor_system_config cfg;
  cfg.add_message_type<lend_counters>("lend_counters");
  configure(cfg, "127.0.0.1:0", false, tweak);
  caf::actor_system sys{cfg};
  auto svc = start_service(sys);
  auto h = sys.spawn(holder);
  if (node_of(sys).publish(h, holder_name)) return 2;
  out.send(bytes_of(node_of(sys).address()));
  std::vector<uint8_t> stop;
  in.receive(&stop, 60000);
  caf::anon_send_exit(svc, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  return 0;
}

/// The holder node in a child process.
struct holder_child : node_child {
  explicit holder_child(const node_tweak& tweak = {})
      : node_child([&](const channel& from, const channel& to) {
          return holder_process(from, to, tweak);
        }) {}
};

/// A lender's test body: its system, the holder's handle, and the channel to the parent.
using lender_body = std::function<std::string(caf::actor_system&, const caf::actor&)>;

/// Runs `body` in a lender node in a child process against the holder at `address`.
pid_t start_lender(const std::string& address, const lender_body& body,
                   const node_tweak& tweak = {}) {
  return fork_child([=] {
    return client_process(
        address,
        [&](caf::actor_system& sys, const std::string& at) {
          auto found = node_of(sys).lookup(at, holder_name);
          if (!found) return describe(sys, "lookup", found.error());
          return body(sys, *found);
        },
        "127.0.0.1:0", tweak);
  });
}

/// Polls `done` every millisecond for up to 10 s.
template <class Pred>
bool eventually(Pred done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// A mem_alloc block of `size` patterned bytes as a blob whose owner sets `*freed` when the last
/// copy goes (and frees the block).
blob tracked_blob(size_t size, unsigned seed, std::shared_ptr<std::atomic<bool>> freed,
                  char** raw) {
  void* block = comm::mem_alloc(size);
  if (block == nullptr) throw std::bad_alloc{};
  auto* bytes = static_cast<char*>(block);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131 + (i >> 12) + seed);
  *raw = bytes;
  std::shared_ptr<const void> owner(block, [freed](const void* p) {
    freed->store(true);
    comm::mem_free(const_cast<void*>(p));
  });
  return blob::share(std::move(owner), bytes, size);
}

/// The holder's lend counters; an error string in `failure` when it does not answer.
lend_counters holder_counters(caf::scoped_actor& self, const caf::actor& h, std::string& failure) {
  lend_counters out{};
  self->request(h, timeout, lstats_atom::value)
      .receive([&](uint64_t a, uint64_t b, uint64_t c, uint64_t d) { out = {a, b, c, d}; },
               [&](caf::error& e) { failure = "holder stats: " + caf::to_string(e); });
  return out;
}

/// Asks the holder to keep `b`; the digest it computed, or 0.
uint64_t keep(caf::scoped_actor& self, const caf::actor& h, const blob& b, std::string& failure) {
  uint64_t d = 0;
  self->request(h, timeout, lkeep_atom::value, b)
      .receive([&](uint64_t x) { d = x; },
               [&](caf::error& e) { failure = "keep: " + caf::to_string(e); });
  return d;
}

/// The holder's digest of its blob `i`, or 0.
uint64_t held_digest(caf::scoped_actor& self, const caf::actor& h, int32_t i,
                     std::string& failure) {
  uint64_t d = 0;
  self->request(h, timeout, ldigest_atom::value, i)
      .receive([&](uint64_t x) { d = x; },
               [&](caf::error& e) { failure = "digest: " + caf::to_string(e); });
  return d;
}

std::string drop_all(caf::scoped_actor& self, const caf::actor& h) {
  std::string failure;
  self->request(h, timeout, ldrop_atom::value)
      .receive([](int32_t) {}, [&](caf::error& e) { failure = "drop: " + caf::to_string(e); });
  return failure;
}

#define LEND_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) return std::string("check failed: ") + #cond;         \
  } while (0)

}  // namespace

BOOST_AUTO_TEST_CASE(a_blob_is_read_in_place_and_freed_after_the_last_copy) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  const pid_t lender = start_lender(node.address, [](caf::actor_system& sys, const caf::actor& h) {
    caf::scoped_actor self{sys};
    std::string failure;
    auto freed = std::make_shared<std::atomic<bool>>(false);
    char* raw = nullptr;
    blob b = tracked_blob(mib, 7, freed, &raw);
    const uint64_t sent_digest = digest_of(b.data(), b.size());
    LEND_CHECK(keep(self, h, b, failure) == sent_digest);
    LEND_CHECK(failure.empty());
    auto [lent, now, borrowed, copied] = counters_of(sys);
    LEND_CHECK(lent == 1 && now == 1 && node_of(sys).stats().lent_bytes_now == mib);
    auto theirs = holder_counters(self, h, failure);
    LEND_CHECK(std::get<2>(theirs) == 1 && std::get<3>(theirs) == 0);
    // Our last copy goes: the lend keeps the block.
    b = blob{};
    LEND_CHECK(!freed->load());
    // Writing into a lent block breaks the contract; here it shows that the holder reads our
    // bytes in place: its digest follows.
    raw[12345] = static_cast<char>(~raw[12345]);
    const uint64_t changed = digest_of(raw, mib);
    LEND_CHECK(changed != sent_digest);
    LEND_CHECK(held_digest(self, h, 0, failure) == changed);
    LEND_CHECK(!freed->load());
    failure = drop_all(self, h);
    if (!failure.empty()) return failure;
    LEND_CHECK(eventually([&] { return freed->load(); }));
    LEND_CHECK(node_of(sys).stats().lent_now == 0 && node_of(sys).stats().lent_bytes_now == 0);
    return failure;
  });
  BOOST_TEST(wait_child(lender) == 0);
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_blob_sent_back_to_its_lender_is_its_own_buffer) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  const pid_t lender = start_lender(node.address, [](caf::actor_system& sys, const caf::actor& h) {
    caf::scoped_actor self{sys};
    std::string failure;
    const blob b = patterned_blob(mib + 3, 9);
    for (int round = 0; round < 20 && failure.empty(); ++round) {
      self->request(h, timeout, lecho_atom::value, b)
          .receive(
              [&](const blob& back) {
                if (back.data() != b.data() || back != b) failure = "not our own buffer back";
              },
              [&](caf::error& e) { failure = "echo: " + caf::to_string(e); });
    }
    if (!failure.empty()) return failure;
    auto theirs = holder_counters(self, h, failure);
    // The holder borrowed every round's blob and lent nothing: each came back by id.
    LEND_CHECK(std::get<0>(theirs) == 0 && std::get<2>(theirs) == 20);
    LEND_CHECK(std::get<0>(counters_of(sys)) == 20);
    LEND_CHECK(eventually([&] { return node_of(sys).stats().lent_now == 0; }));
    return failure;
  });
  BOOST_TEST(wait_child(lender) == 0);
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(blobs_beyond_the_lent_bytes_limit_are_copied) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  const auto limit = [](comm::actors::node_params& p) { p.max_lent_bytes = mib + mib / 2; };
  const pid_t lender = start_lender(
      node.address,
      [](caf::actor_system& sys, const caf::actor& h) {
        caf::scoped_actor self{sys};
        std::string failure;
        blob first = patterned_blob(mib, 1);
        blob second = patterned_blob(mib, 2);
        char* raw = second.mutable_data();
        const uint64_t second_digest = digest_of(second.data(), mib);
        LEND_CHECK(keep(self, h, first, failure) == digest_of(first.data(), mib));
        LEND_CHECK(keep(self, h, second, failure) == second_digest);
        LEND_CHECK(failure.empty());
        // Only the first fitted the limit; the second was copied to the holder.
        LEND_CHECK(std::get<0>(counters_of(sys)) == 1 && std::get<1>(counters_of(sys)) == 1);
        auto theirs = holder_counters(self, h, failure);
        LEND_CHECK(std::get<2>(theirs) == 1);
        raw[99] = static_cast<char>(~raw[99]);  // the holder's copy does not follow
        LEND_CHECK(held_digest(self, h, 1, failure) == second_digest);
        failure = drop_all(self, h);
        if (!failure.empty()) return failure;
        LEND_CHECK(eventually([&] { return node_of(sys).stats().lent_now == 0; }));
        // With the limit free again, the next blob is lent.
        LEND_CHECK(keep(self, h, second, failure) == digest_of(second.data(), mib));
        LEND_CHECK(std::get<0>(counters_of(sys)) == 2);
        return failure;
      },
      limit);
  BOOST_TEST(wait_child(lender) == 0);
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(with_lending_off_blobs_are_copied) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  const auto off = [](comm::actors::node_params& p) { p.lend_blobs = false; };
  const pid_t lender = start_lender(
      node.address,
      [](caf::actor_system& sys, const caf::actor& h) {
        caf::scoped_actor self{sys};
        std::string failure;
        const blob b = patterned_blob(2 * mib, 3);
        LEND_CHECK(keep(self, h, b, failure) == digest_of(b.data(), b.size()));
        LEND_CHECK(std::get<0>(counters_of(sys)) == 0);
        auto theirs = holder_counters(self, h, failure);
        LEND_CHECK(std::get<2>(theirs) == 0);
        return failure;
      },
      off);
  BOOST_TEST(wait_child(lender) == 0);
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_killed_borrower_leaves_no_lend_behind) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  channel report, go;
  const pid_t lender = start_lender(node.address, [&](caf::actor_system& sys, const caf::actor& h) {
    caf::scoped_actor self{sys};
    std::string failure;
    auto freed = std::make_shared<std::atomic<bool>>(false);
    char* raw = nullptr;
    blob b = tracked_blob(4 * mib, 5, freed, &raw);
    LEND_CHECK(keep(self, h, b, failure) == digest_of(b.data(), b.size()));
    b = blob{};
    LEND_CHECK(node_of(sys).stats().lent_now == 1 && !freed->load());
    report.send(bytes_of("ready"));
    // The parent kills the holder: its connection fails, and the lend goes with it.
    LEND_CHECK(eventually([&] { return freed->load(); }));
    LEND_CHECK(node_of(sys).stats().lent_now == 0 && node_of(sys).stats().lent_bytes_now == 0);
    return failure;
  });
  BOOST_REQUIRE(receive_string(report) == "ready");
  node.kill();
  BOOST_TEST(wait_child(lender) == 0);
}

BOOST_AUTO_TEST_CASE(a_borrowed_blob_outlives_its_killed_lender) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  channel report;
  const pid_t borrower =
      start_lender(node.address, [&](caf::actor_system& sys, const caf::actor& h) {
        caf::scoped_actor self{sys};
        std::string failure;
        blob given;
        self->request(h, timeout, lgive_atom::value, uint32_t(2 * mib), uint32_t(11))
            .receive([&](blob& b) { given = std::move(b); },
                     [&](caf::error& e) { failure = "give: " + caf::to_string(e); });
        if (!failure.empty()) return failure;
        const uint64_t expected = digest_of(patterned_blob(2 * mib, 11).data(), 2 * mib);
        LEND_CHECK(digest_of(given.data(), given.size()) == expected);
        LEND_CHECK(node_of(sys).stats().blobs_borrowed == 1);
        LEND_CHECK(given.mutable_data() == nullptr);  // the lender's bytes are never ours
        report.send(bytes_of("ready"));
        LEND_CHECK(eventually([&] { return node_of(sys).stats().peers == 0; }));
        // The lender is gone: the blob still holds its mapping of the lender's memory.
        LEND_CHECK(digest_of(given.data(), given.size()) == expected);
        const blob kept = given;
        given = blob{};
        LEND_CHECK(digest_of(kept.data(), kept.size()) == expected);
        return failure;
      });
  BOOST_REQUIRE(receive_string(report) == "ready");
  node.kill();
  BOOST_TEST(wait_child(borrower) == 0);
}

BOOST_AUTO_TEST_CASE(a_connection_closed_on_purpose_keeps_lent_bytes_until_the_borrower_exits) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  channel report;
  const std::string at = node.address;
  const auto limit = [](comm::actors::node_params& p) { p.max_lent_bytes = 6 * mib; };
  const pid_t lender = start_lender(
      node.address,
      [&](caf::actor_system& sys, const caf::actor& h) {
        caf::scoped_actor self{sys};
        std::string failure;
        auto freed = std::make_shared<std::atomic<bool>>(false);
        char* raw = nullptr;
        blob b = tracked_blob(4 * mib, 13, freed, &raw);
        const uint64_t sent = digest_of(b.data(), b.size());
        LEND_CHECK(keep(self, h, b, failure) == sent);
        b = blob{};
        LEND_CHECK(node_of(sys).stats().lent_now == 1);
        // Closed on purpose while the holder keeps the blob: its process lives, so the block
        // stays allocated (counted as kept) instead of going back to the heap.
        LEND_CHECK(!node_of(sys).disconnect(at));
        LEND_CHECK(eventually([&] { return node_of(sys).stats().peers == 0; }));
        auto s = node_of(sys).stats();
        LEND_CHECK(s.lent_now == 1 && s.lent_bytes_now == 4 * mib);
        LEND_CHECK(s.lent_kept_now == 1 && s.lent_kept_bytes_now == 4 * mib);
        LEND_CHECK(!freed->load());
        // Blocks of the same size, written over: had the lent block been freed, the heap would
        // hand it out again here.
        std::vector<void*> fresh;
        for (int i = 0; i < 4; ++i) {
          void* q = comm::mem_alloc(4 * mib);
          LEND_CHECK(q != nullptr && q != static_cast<void*>(raw));
          std::memset(q, 0xa5, 4 * mib);
          fresh.push_back(q);
        }
        // The holder, over a new connection, still reads the bytes it was lent.
        auto again = node_of(sys).lookup(at, holder_name);
        if (!again) return describe(sys, "lookup again", again.error());
        LEND_CHECK(held_digest(self, *again, 0, failure) == sent);
        // The bytes kept for the holder count against max_lent_bytes (6 MiB) of the new
        // connection: a 4 MiB blob is copied, a 1 MiB one still fits and is lent.
        const blob big = patterned_blob(4 * mib, 14);
        LEND_CHECK(keep(self, *again, big, failure) == digest_of(big.data(), big.size()));
        LEND_CHECK(node_of(sys).stats().blobs_lent == 1);
        const blob small = patterned_blob(mib, 15);
        LEND_CHECK(keep(self, *again, small, failure) == digest_of(small.data(), small.size()));
        LEND_CHECK(node_of(sys).stats().blobs_lent == 2);
        for (void* q : fresh) comm::mem_free(q);
        report.send(bytes_of("ready"));
        // The parent stops the holder: once its process is gone, nothing is kept any more.
        LEND_CHECK(eventually([&] { return freed->load(); }));
        const bool none = eventually([&] {
          const auto t = node_of(sys).stats();
          return t.lent_now == 0 && t.lent_bytes_now == 0 && t.lent_kept_now == 0 &&
                 t.lent_kept_bytes_now == 0;
        });
        const auto t = node_of(sys).stats();
        if (!none) {
          return "still lent: " + std::to_string(t.lent_now) + " (" +
                 std::to_string(t.lent_bytes_now) + " bytes), kept " +
                 std::to_string(t.lent_kept_now) + " (" + std::to_string(t.lent_kept_bytes_now) +
                 " bytes), peers " + std::to_string(t.peers);
        }
        return failure;
      },
      limit);
  BOOST_REQUIRE(receive_string(report) == "ready");
  BOOST_TEST(node.stop() == 0);
  BOOST_TEST(wait_child(lender) == 0);
}

BOOST_AUTO_TEST_CASE(a_borrowed_blob_forwarded_to_a_third_node_arrives_whole) {
  holder_child middle;  // borrows from the lender, forwards
  holder_child over_shm;
  holder_child over_tcp([](comm::actors::node_params& p) { p.transport.transports = {"tcp"}; });
  BOOST_REQUIRE(!middle.address.empty() && !over_shm.address.empty() &&
                !over_tcp.address.empty());
  const std::string shm_at = over_shm.address, tcp_at = over_tcp.address;
  const pid_t lender = start_lender(middle.address, [&](caf::actor_system& sys,
                                                        const caf::actor& h) {
    caf::scoped_actor self{sys};
    std::string failure;
    auto freed = std::make_shared<std::atomic<bool>>(false);
    char* raw = nullptr;
    blob b = tracked_blob(2 * mib + 5, 17, freed, &raw);
    const uint64_t sent = digest_of(b.data(), b.size());
    for (const std::string& to : {shm_at, tcp_at}) {
      uint64_t d = 0;
      self->request(h, timeout, lforward_atom::value, b, to)
          .receive([&](uint64_t x) { d = x; },
                   [&](caf::error& e) { failure = "forward to " + to + ": " + caf::to_string(e); });
      if (!failure.empty()) return failure;
      LEND_CHECK(d == sent);
    }
    // The middle node borrowed our blob twice (read in place) and lent its own copy on over shm.
    auto middle_counts = holder_counters(self, h, failure);
    LEND_CHECK(std::get<2>(middle_counts) == 2);
    LEND_CHECK(std::get<0>(middle_counts) == 1);
    b = blob{};
    // The third nodes hold copies, not our block: it is freed once the middle node let go.
    LEND_CHECK(eventually([&] { return freed->load(); }));
    LEND_CHECK(eventually([&] { return node_of(sys).stats().lent_now == 0; }));
    for (const std::string& to : {shm_at, tcp_at}) {
      auto third = node_of(sys).lookup(to, holder_name);
      if (!third) return describe(sys, ("lookup " + to).c_str(), third.error());
      LEND_CHECK(held_digest(self, *third, 0, failure) == sent);
      failure = drop_all(self, *third);
      if (!failure.empty()) return failure;
    }
    // Their copies gone, the middle node has nothing lent any more.
    LEND_CHECK(eventually([&] {
      std::string ignored;
      return std::get<1>(holder_counters(self, h, ignored)) == 0 && ignored.empty();
    }));
    return failure;
  });
  BOOST_TEST(wait_child(lender) == 0);
  BOOST_TEST(over_tcp.stop() == 0);
  BOOST_TEST(over_shm.stop() == 0);
  BOOST_TEST(middle.stop() == 0);
}

// -- forged lends and releases ------------------------------------------------------------------

namespace {

constexpr uint8_t kind_release = 8;
constexpr uint8_t flag_lent = 1u << 3;

/// An envelope of a lent message (or, with `kind_release`, a release) with the peer's next
/// sequence number, followed by `payload`.
std::vector<char> lent_header(forged_peer& peer, uint8_t kind, uint64_t attached,
                              const std::vector<char>& payload = {}) {
  peer.fill(kind, 1, 0, 0, attached);
  auto f = peer.envelope.fields();
  if (kind == kind_message) f.setFlags(static_cast<uint8_t>(1u | flag_lent));
  std::vector<char> header(envelope_size);
  std::memcpy(header.data(), peer.envelope.bytes(), envelope_size);
  header.insert(header.end(), payload.begin(), payload.end());
  return header;
}

/// The flat array of `message`.
std::vector<char> flat(capnp::MessageBuilder& message) {
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asChars();
  return std::vector<char>(bytes.begin(), bytes.end());
}

/// An ActorLends of one run.
std::vector<char> one_lend(uint64_t id, uint64_t address, uint64_t length,
                           const std::vector<uint8_t>& key, bool returned) {
  capnp::MallocMessageBuilder message;
  auto run = message.initRoot<comm::wire::schema::ActorLends>().initRuns(1)[0];
  run.setId(id);
  run.setAddress(address);
  run.setLength(length);
  run.setReturned(returned);
  if (!key.empty()) run.setKey(kj::arrayPtr(key.data(), key.size()));
  return flat(message);
}

/// An ActorReleases of `ids`.
std::vector<char> releases(const std::vector<uint64_t>& ids) {
  capnp::MallocMessageBuilder message;
  auto list = message.initRoot<comm::wire::schema::ActorReleases>().initIds(
      static_cast<unsigned>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) list.set(static_cast<unsigned>(i), ids[i]);
  return flat(message);
}

/// True when the node closes `peer`'s connection after it sent a frame with `header` and `data`.
bool closes(forged_peer& peer, const std::vector<char>& header, const std::vector<char>& data) {
  peer.send_raw(header.data(), header.size(), data);
  return peer.progress_until([&] { return peer.closed(); }, 10);
}

/// A region of the forged peer's memory, registered, and its packed key.
struct forged_region {
  void* block = nullptr;
  size_t size = 0;
  comm::memh_ptr registration;
  std::vector<uint8_t> key;

  /// In the shared heap (comm::mem_alloc), or (`shared` false) in plain heap memory, which a
  /// peer cannot map.
  forged_region(comm::worker& w, size_t bytes, bool shared = true)
      : block(shared ? comm::mem_alloc(bytes) : std::malloc(bytes)), size(bytes) {
    std::memset(block, 0x5a, bytes);
    registration = w.mem_map(comm::mutable_bytes(block, bytes)).value();
    key = w.rkey_pack(*registration).value();
  }
  ~forged_region() {
    registration.reset();
    comm::mem_free(block);  // takes malloc'd blocks too
  }
  uint64_t address() const { return reinterpret_cast<uintptr_t>(block); }
};

/// A well-behaved node, in a child process, gets an answer from the service at `address`.
bool still_serves(const std::string& address) {
  const pid_t client = fork_child([&] {
    return client_process(address, [](caf::actor_system& sys, const std::string& at) {
      return run_checks(sys, at, {check_request});
    });
  });
  return wait_child(client) == 0;
}

}  // namespace

BOOST_AUTO_TEST_CASE(forged_lends_and_releases_close_the_connection) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  const uint64_t size = 64 * 1024;
  struct attack {
    const char* what;
    std::function<bool(forged_peer&)> run;
  };
  const std::vector<attack> attacks = {
      {"lends that are not a Cap'n Proto message",
       [&](forged_peer& p) {
         return closes(p, lent_header(p, kind_message, size, {'x'}), std::vector<char>(64, 'x'));
       }},
      {"a lend whose key is garbage",
       [&](forged_peer& p) {
         return closes(p, lent_header(p, kind_message, size, {'x'}),
                       one_lend(1, 4096, size, std::vector<uint8_t>(48, 0x11), false));
       }},
      {"a lend beyond the region its key names",
       [&](forged_peer& p) {
         forged_region region(*p.worker, size);
         return closes(p, lent_header(p, kind_message, 2 * size, {'x'}),
                       one_lend(1, region.address(), 2 * size, region.key, false));
       }},
      {"a lend before the region its key names",
       [&](forged_peer& p) {
         forged_region region(*p.worker, size);
         return closes(p, lent_header(p, kind_message, size, {'x'}),
                       one_lend(1, region.address() - 4096, size, region.key, false));
       }},
      {"a lend shorter than an attachment",
       [&](forged_peer& p) {
         forged_region region(*p.worker, size);
         return closes(p, lent_header(p, kind_message, 100, {'x'}),
                       one_lend(1, region.address(), 100, region.key, false));
       }},
      {"lends that add up to other than the envelope says",
       [&](forged_peer& p) {
         forged_region region(*p.worker, size);
         return closes(p, lent_header(p, kind_message, size + 1, {'x'}),
                       one_lend(1, region.address(), size, region.key, false));
       }},
      {"a blob returned that the node never lent",
       [&](forged_peer& p) {
         return closes(p, lent_header(p, kind_message, size, {'x'}),
                       one_lend(77, 0, size, {}, true));
       }},
      {"a release of a blob the node never lent (or released already)",
       [&](forged_peer& p) {
         return closes(p, lent_header(p, kind_release, 0, {}), releases({1}));
       }},
      {"a release naming nothing",
       [&](forged_peer& p) {
         return closes(p, lent_header(p, kind_release, 0, {}), releases({}));
       }},
  };
  for (const attack& a : attacks) {
    BOOST_TEST_CONTEXT(a.what) {
      forged_peer peer(node.address);
      BOOST_TEST(a.run(peer));
      BOOST_TEST(still_serves(node.address));
    }
  }
  BOOST_TEST(node.stop() == 0);
}

namespace {

/// Lends `size` bytes of `peer`'s memory (shared or not) as id `id` beside a message that does
/// not read them (unreadable, dropped); true when the node releases exactly that id and keeps
/// the connection.
bool lent_and_released(forged_peer& peer, uint64_t id, size_t size, bool shared) {
  forged_region region(*peer.worker, size, shared);
  std::vector<char> payload;
  put_message_start(payload, "@<>+@i32");
  put_int(payload, int32_t{5});
  peer.state.last_kind = 0;
  peer.send_raw(lent_header(peer, kind_message, size, payload).data(),
                envelope_size + payload.size(),
                one_lend(id, region.address(), size, region.key, false));
  peer.progress_until([&] { return peer.state.last_kind == kind_release || peer.closed(); }, 10);
  std::vector<uint64_t> ids;
  const bool read = comm::wire::read_checked_message<comm::wire::schema::ActorReleases>(
      peer.state.last_payload.data(), peer.state.last_payload.size(),
      [&](comm::wire::schema::ActorReleases::Reader r) {
        for (uint64_t x : r.getIds()) ids.push_back(x);
      });
  return !peer.closed() && peer.state.last_kind == kind_release && read &&
         ids == std::vector<uint64_t>{id};
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_forged_lend_the_node_cannot_map_is_copied_and_released) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  BOOST_REQUIRE(peer.lookup(service_name) != 0);
  // Plain heap memory is in no shared segment: the node copies it (endpoint::get) and releases
  // the lend at once.
  BOOST_TEST(lent_and_released(peer, 43, 64 * 1024, false));
  BOOST_TEST(lent_and_released(peer, 44, 64 * 1024, true));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

BOOST_AUTO_TEST_CASE(a_genuine_forged_lend_is_read_in_place_and_released) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  BOOST_REQUIRE(peer.lookup(service_name) != 0);
  // The node maps the lent run and reads the message (which does not use the run: unreadable,
  // dropped), then releases the lend.
  BOOST_TEST(lent_and_released(peer, 42, 64 * 1024, true));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

namespace {

/// The one run a lend announced: its id, the lender's address and the packed key.
struct lent_run {
  uint64_t id = 0;
  uint64_t address = 0;
  std::vector<uint8_t> key;
};

/// Asks the service `svc` to echo a blob of `size` bytes of 'e' (sent as a plain attachment)
/// and returns the run its answer lends to `peer`.
lent_run echo_lent_back(forged_peer& peer, uint64_t svc, size_t size) {
  std::vector<char> payload;
  put_message_start(payload, "@<>+@atom+comm::actors::blob");
  put_int(payload, static_cast<uint64_t>(caf::atom("echo")));
  put_size(payload, static_cast<uint32_t>(size));
  peer.send_in_header(kind_message, svc, forged_request_id(9), 2, payload,
                      std::vector<char>(size, 'e'));
  peer.progress_until([&] { return peer.state.attached_messages > 0 || peer.closed(); }, 10);
  BOOST_REQUIRE(!peer.closed());
  BOOST_REQUIRE(peer.state.last_kind == kind_message);
  lent_run run;
  BOOST_TEST_REQUIRE(comm::wire::read_checked_message<comm::wire::schema::ActorLends>(
      peer.state.last_payload.data(), peer.state.last_payload.size(),
      [&](comm::wire::schema::ActorLends::Reader r) {
        if (r.getRuns().size() != 1 || r.getRuns()[0].getLength() != size) return;
        run.id = r.getRuns()[0].getId();
        run.address = r.getRuns()[0].getAddress();
        const auto key = r.getRuns()[0].getKey();
        run.key.assign(key.begin(), key.end());
      }));
  BOOST_TEST_REQUIRE(run.id != 0);
  return run;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_lend_is_released_once) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // A request to echo a 64 KiB blob (sent as a plain attachment): the answer lends it to us.
  const lent_run run = echo_lent_back(peer, svc, 64 * 1024);
  const uint64_t id = run.id;
  // The first release is taken, and the connection goes on; the second closes it.
  auto release = releases({id});
  auto header = lent_header(peer, kind_release, 0, {});
  peer.send_raw(header.data(), header.size(), release);
  BOOST_TEST(peer.lookup(service_name) == svc);
  BOOST_TEST(!peer.closed());
  BOOST_TEST(closes(peer, lent_header(peer, kind_release, 0, {}), release));
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}

namespace {

/// True when every one of `size` bytes at `data` is `value`.
bool all_bytes_are(const void* data, size_t size, char value) {
  const auto* p = static_cast<const char*>(data);
  return std::all_of(p, p + size, [value](char c) { return c == value; });
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_hostile_borrower_cannot_write_into_a_lent_blob) {
  holder_child node;
  BOOST_REQUIRE(!node.address.empty());
  forged_peer peer(node.address);
  const uint64_t svc = peer.lookup(service_name);
  BOOST_REQUIRE(svc != 0);
  // The service echoes a 64 KiB blob: the answer lends its copy to us, read-only.
  const size_t size = 64 * 1024;
  const lent_run run = echo_lent_back(peer, svc, size);
  const uint64_t address = run.address;
  const std::vector<uint8_t>& packed = run.key;
  auto key = peer.ep->rkey_unpack(comm::const_bytes(packed.data(), packed.size()));
  BOOST_TEST_REQUIRE(key.has_value());
  auto here = peer.ep->rkey_local_address(**key, address, size);
  BOOST_TEST_REQUIRE(here.has_value());
  BOOST_TEST(all_bytes_are(here->data, size, 'e'));
  // Mapped read-only: a write through the borrowed address faults.
  BOOST_TEST(comm::test::mapping_protection(here->data) == "r--s");
  BOOST_TEST(comm::test::signal_of_a_child_writing(here->data) == SIGSEGV);
  // A put through the key is refused, and through a key forged to claim the right to write too.
  const std::vector<char> evil(4096, 'X');
  const comm::iov_entry from{const_cast<char*>(evil.data()), evil.size()};
  BOOST_TEST(peer.ep->put(&from, 1, address, key->get()).st == comm::status::privileges_violation);
  const std::vector<uint8_t> claims_write = comm::test::reencoded(packed, [](auto bundle) {
    bundle.setAccess(comm::mem_remote_read | comm::mem_remote_write);
  });
  auto forged = peer.ep->rkey_unpack(comm::const_bytes(claims_write.data(), claims_write.size()));
  BOOST_TEST_REQUIRE(forged.has_value());
  const comm::op o = peer.ep->put(&from, 1, address, forged->get());
  comm::status written = o.st;
  if (o.pending()) {
    peer.progress_until(
        [&] { return peer.worker->request_status(o.req) != comm::status::in_progress; });
    written = peer.worker->request_status(o.req);
    peer.worker->release(o.req);
  }
  BOOST_TEST(written == comm::status::privileges_violation, comm::to_string(written));
  BOOST_TEST(all_bytes_are(here->data, size, 'e'));  // the lender's bytes are unchanged
  forged->reset();
  key->reset();
  // Released, the connection goes on; the node serves others.
  auto release = releases({run.id});
  auto header = lent_header(peer, kind_release, 0, {});
  peer.send_raw(header.data(), header.size(), release);
  BOOST_TEST(peer.lookup(service_name) == svc);
  BOOST_TEST(!peer.closed());
  BOOST_TEST(still_serves(node.address));
  BOOST_TEST(node.stop() == 0);
}
