// The simulator's cluster over libcomm, with the "processes" of a job as threads of this process
// (each with its own context and worker), joined by a bootstrap kept in memory: digests equal the
// one-process run's for 2, 3 and 4 members and several partition counts; and a fake member that
// sends malformed messages makes the run fail with a clear error (and gets an abort notice)
// instead of crashing or hanging.
#define BOOST_TEST_MODULE sim_cluster
#include <boost/test/unit_test.hpp>

#include "comm_phold_model.hpp"
#include "test_util.hpp"
#include "wire.hpp"

#include <comm/bootstrap.hpp>
#include <comm/context.hpp>
#include <comm/sim/cluster.hpp>
#include <comm/sim/engine.hpp>
#include <comm/worker.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

using namespace comm;
using namespace comm::sim;

namespace {

/// The shared side of an in-memory bootstrap: committed values and a fence counter.
struct bootstrap_group {
  explicit bootstrap_group(int n) : size(n) {}
  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::pair<int, std::string>, std::vector<uint8_t>> values;
  int arrived = 0;
  uint64_t generation = 0;
};

/// A bootstrap for threads of one process (the real ones are for processes).
class thread_bootstrap final : public bootstrap {
public:
  thread_bootstrap(bootstrap_group& g, int rank) : group_(g), rank_(rank) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_.size; }
  std::string_view backend_name() const noexcept override { return "threads"; }
  status put(std::string_view key, const void* value, size_t length) override {
    const auto* p = static_cast<const uint8_t*>(value);
    pending_[std::string(key)] = std::vector<uint8_t>(p, p + length);
    return status::ok;
  }
  status commit() override {
    std::lock_guard<std::mutex> lock(group_.mutex);
    for (auto& [key, value] : pending_) group_.values[{rank_, key}] = value;
    pending_.clear();
    return status::ok;
  }
  status fence(int timeout_ms) override {
    std::unique_lock<std::mutex> lock(group_.mutex);
    const uint64_t mine = group_.generation;
    if (++group_.arrived == group_.size) {
      group_.arrived = 0;
      ++group_.generation;
      group_.changed.notify_all();
      return status::ok;
    }
    const auto limit = std::chrono::milliseconds(timeout_ms < 0 ? 30000 : timeout_ms);
    return group_.changed.wait_for(lock, limit, [&] { return group_.generation != mine; })
               ? status::ok
               : status::endpoint_timeout;
  }
  status get(int rank, std::string_view key, std::vector<uint8_t>& out) override {
    std::lock_guard<std::mutex> lock(group_.mutex);
    auto it = group_.values.find({rank, std::string(key)});
    if (it == group_.values.end()) return status::no_elem;
    out = it->second;
    return status::ok;
  }

private:
  bootstrap_group& group_;
  const int rank_;
  std::map<std::string, std::vector<uint8_t>> pending_;
};

/// What one member's run gave.
struct member_result {
  status st = status::no_message;
  std::string why;
  run_result result;
};

/// Joins the group as `rank` and runs PHOLD.
member_result run_member(bootstrap_group& g, int rank, const run_config& cfg,
                         const phold::parameters& p) {
  member_result out;
  thread_bootstrap boot(g, rank);
  std::unique_ptr<cluster> c;
  out.st = cluster::join(boot, {}, &c, &out.why);
  if (out.st != status::ok) return out;
  phold::model m{p};
  engine<phold::model> e(*c, cfg, m);
  out.st = e.run(&out.result, &out.why);
  return out;
}

/// Runs PHOLD with `members` threads; every member's result.
std::vector<member_result> run_threads(int members, const run_config& cfg,
                                       const phold::parameters& p) {
  bootstrap_group g(members);
  std::vector<member_result> results(members);
  std::vector<std::thread> threads;
  for (int r = 0; r < members; ++r) {
    threads.emplace_back([&, r] { results[r] = run_member(g, r, cfg, p); });
  }
  for (auto& t : threads) t.join();
  return results;
}

uint64_t local_digest(const run_config& cfg, const phold::parameters& p, uint64_t* committed) {
  auto c = cluster::local();
  phold::model m{p};
  engine<phold::model> e(*c, cfg, m);
  run_result r;
  std::string why;
  BOOST_REQUIRE(e.run(&r, &why) == status::ok);
  *committed = r.committed;
  return r.digest;
}

}  // namespace

BOOST_AUTO_TEST_CASE(members_agree_with_one_process) {
  phold::parameters spread;
  spread.lookahead = 0.5;
  spread.mean = 2.0;
  spread.start_events = 2;
  for (const phold::parameters& p : {phold::parameters{}, spread}) {
    for (int members : {2, 3, 4}) {
      for (unsigned parts : {1u, 3u}) {
        // 50 LPs: uneven blocks for 3 and 4 members.
        const run_config cfg = phold::configuration(50, parts, p, 200, 11);
        uint64_t committed = 0;
        const uint64_t want = local_digest(cfg, p, &committed);
        const auto results = run_threads(members, cfg, p);
        for (const member_result& m : results) {
          BOOST_REQUIRE_MESSAGE(m.st == status::ok, m.why);
          BOOST_TEST(m.result.digest == want, members << " members x " << parts);
          BOOST_TEST(m.result.committed == committed);
          BOOST_TEST(m.result.processes == members);
          BOOST_TEST(m.result.remote > 0u);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(members_with_another_configuration_are_refused) {
  bootstrap_group g(2);
  const phold::parameters p;
  member_result results[2];
  std::thread other(
      [&] { results[1] = run_member(g, 1, phold::configuration(16, 1, p, 50, 2), p); });
  results[0] = run_member(g, 0, phold::configuration(16, 1, p, 50, 1), p);
  other.join();
  for (const member_result& m : results) {
    BOOST_TEST(m.st != status::ok);
    BOOST_TEST_MESSAGE(m.why);
  }
  BOOST_TEST(results[0].why.find("another configuration") != std::string::npos, results[0].why);
}

// -- a fake member sending malformed messages --------------------------------------------------

namespace {

/// Rank 1 of a two-member group as a bare worker that joins the way a cluster does (address
/// under the cluster's key, fence, connect, barrier). Runs in a thread: failures are recorded, not
/// asserted.
struct fake_member {
  bootstrap_group& group;
  context ctx;
  std::unique_ptr<worker> w;
  endpoint* ep = nullptr;
  int aborts = 0;                ///< abort notices from rank 0
  uint64_t fingerprint = 0;      ///< of rank 0's first round message
  bool joined = false;

  explicit fake_member(bootstrap_group& g) : group(g), w(worker::create(ctx).value()) {}

  static status on_message(void* arg, const void* header, size_t header_length, void*, size_t,
                           const am_recv_params&) {
    auto* self = static_cast<fake_member*>(arg);
    wire::header h;
    if (header_length != sizeof(h)) return status::ok;
    std::memcpy(&h, header, sizeof(h));
    if (h.what == static_cast<uint16_t>(wire::kind::abort)) ++self->aborts;
    if (h.what == static_cast<uint16_t>(wire::kind::round)) self->fingerprint = h.fingerprint;
    return status::ok;
  }

  void join() {
    thread_bootstrap boot(group, 1);
    std::vector<std::vector<uint8_t>> addresses;
    joined = w->set_am_handler(wire::am_id, on_message, this,
                               am_flag_whole_msg | am_flag_fetch_rndv) == status::ok &&
             boot.allgather("comm.sim.worker", w->address(), addresses) == status::ok &&
             w->connect(addresses[0], &ep) == status::ok && boot.barrier() == status::ok;
  }

  void send(const void* header, size_t header_length, const void* data, size_t length) {
    op o = ep->am_send(wire::am_id, header, header_length, data, length);
    if (o.pending()) (void)w->wait(o, 5000);
  }

  /// Closes the worker, as a process that exits would: rank 0 fails (the peer is gone) if it is
  /// still waiting, so that a scenario rank 0 does not refuse ends instead of hanging.
  void leave() {
    ep = nullptr;
    w.reset();
  }

  /// Progresses until `done` or about 20 s.
  template <class Done>
  void progress_until(Done done) {
    for (int i = 0; i < 2000 && !done(); ++i) (void)w->wait(10);
  }
};

/// A round-0 header from rank 1.
wire::header round_zero(uint64_t fingerprint) {
  wire::header h;
  h.what = static_cast<uint16_t>(wire::kind::round);
  h.sender = 1;
  h.fingerprint = fingerprint;
  h.local_min = 1.0;
  return h;
}

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

const phold::parameters defaults{};
const run_config sixteen = phold::configuration(16, 1, defaults, 50, 1);

/// The fingerprint of rank 0's configuration, from its first message to a fake that then tells
/// it to stop.
uint64_t fingerprint_of_rank0() {
  bootstrap_group g(2);
  fake_member fake(g);
  std::thread t([&] {
    fake.join();
    if (!fake.joined) return;
    fake.progress_until([&] { return fake.fingerprint != 0; });
    wire::header h;
    h.what = static_cast<uint16_t>(wire::kind::abort);
    h.sender = 1;
    fake.send(&h, sizeof(h), "done", 4);
    fake.progress_until([&] { return fake.aborts != 0; });  // rank 0's notice: it has stopped
    fake.leave();
  });
  const member_result r = run_member(g, 0, sixteen, defaults);
  t.join();
  BOOST_REQUIRE(fake.joined);
  BOOST_TEST(r.st == status::canceled);
  BOOST_TEST(r.why.find("process 1 stopped: done") != std::string::npos, r.why);
  BOOST_REQUIRE(fake.fingerprint != 0);
  return fake.fingerprint;
}

/// Runs rank 0 (PHOLD, 16 LPs, `cfg`) against a fake rank 1 that sends `header` + `data`; rank 0's
/// outcome and the abort notices the fake got.
member_result against_fake(const std::vector<uint8_t>& header, const std::vector<uint8_t>& data,
                           int* aborts, const run_config& cfg = sixteen) {
  bootstrap_group g(2);
  fake_member fake(g);
  std::thread t([&] {
    fake.join();
    if (!fake.joined) return;
    fake.send(header.data(), header.size(), data.data(), data.size());
    fake.progress_until([&] { return fake.aborts != 0; });
    fake.leave();
  });
  member_result r = run_member(g, 0, cfg, defaults);
  t.join();
  BOOST_REQUIRE(fake.joined);
  *aborts = fake.aborts;
  return r;
}

struct scenario {
  std::vector<uint8_t> header, data;
  const char* words;
};

void expect_protocol_errors(const std::vector<scenario>& cases) {
  for (const scenario& s : cases) {
    int aborts = 0;
    const member_result r = against_fake(s.header, s.data, &aborts);
    BOOST_TEST(r.st == status::protocol_error, s.words);
    BOOST_TEST(r.why.find(s.words) != std::string::npos, r.why);
    BOOST_TEST(aborts == 1, s.words);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(malformed_headers_fail_the_run_cleanly) {
  wire::header bad_magic = round_zero(0), bad_sender = round_zero(0), bad_kind = round_zero(0);
  bad_magic.magic = 0x12345678;
  bad_sender.sender = 7;
  bad_kind.what = 99;
  expect_protocol_errors({
      {bytes_of(&bad_magic, sizeof(bad_magic)), {}, "bad magic"},
      {bytes_of(&bad_sender, sizeof(bad_sender)), {}, "rank 7"},
      {bytes_of(&bad_kind, sizeof(bad_kind)), {}, "unknown kind"},
      {std::vector<uint8_t>(5, 0), {}, "header of 5 bytes"},
  });
}

BOOST_AUTO_TEST_CASE(events_that_cannot_be_ours_fail_the_run_cleanly) {
  using ev = event<phold::model::message>;
  const wire::header h = round_zero(fingerprint_of_rank0());
  wire::header later = h;
  later.round = 5;
  const ev not_ours{2.0, 12, 12, 0, {12}};     // rank 1's own LP
  const ev in_the_past{-1.0, 3, 12, 0, {12}};  // before the window
  expect_protocol_errors({
      {bytes_of(&h, sizeof(h)), bytes_of(&not_ours, sizeof(ev)), "cannot be ours: LP 12"},
      {bytes_of(&h, sizeof(h)), bytes_of(&in_the_past, sizeof(ev)), "cannot be ours: LP 3"},
      {bytes_of(&h, sizeof(h)), std::vector<uint8_t>(sizeof(ev) + 3, 0), "not a whole number"},
      {bytes_of(&later, sizeof(later)), {}, "sent round 5"},
  });
}

BOOST_AUTO_TEST_CASE(more_events_than_the_receiver_may_hold_fail_the_run) {
  // Rank 0 holds its 8 LPs' start events; max_events 10 leaves room for 2 more (the limit is not
  // part of the fingerprint: it bounds one process's memory).
  using ev = event<phold::model::message>;
  run_config small = sixteen;
  small.max_events = 10;
  const wire::header h = round_zero(fingerprint_of_rank0());
  std::vector<uint8_t> three;
  for (lp_id target : {1u, 2u, 3u}) {
    const ev e{2.0, target, 12, target, {12}};
    const std::vector<uint8_t> bytes = bytes_of(&e, sizeof(e));
    three.insert(three.end(), bytes.begin(), bytes.end());
  }
  int aborts = 0;
  const member_result r = against_fake(bytes_of(&h, sizeof(h)), three, &aborts, small);
  BOOST_TEST(r.st == status::exceeds_limit);
  BOOST_TEST(r.why.find("process 1's 3 events go past the limit of 10") != std::string::npos,
             r.why);
  BOOST_TEST(aborts == 1);
}

BOOST_AUTO_TEST_CASE(a_peer_that_skips_a_round_fails_the_run_at_once) {
  // A peer leaves a round only with everybody's message of that round, and its messages arrive
  // in order: round 1 or its totals before its round 0 can only come from a broken peer, which
  // rank 0 would otherwise wait for as long as it lives.
  wire::header skipped = round_zero(fingerprint_of_rank0()), totals = skipped;
  skipped.round = 1;
  totals.what = static_cast<uint16_t>(wire::kind::totals);
  const wire::totals counters{};
  expect_protocol_errors({
      {bytes_of(&skipped, sizeof(skipped)), {}, "sent round 1 before round 0"},
      {bytes_of(&totals, sizeof(totals)), bytes_of(&counters, sizeof(counters)),
       "sent its totals in round 0"},
  });
}

BOOST_AUTO_TEST_CASE(an_earliest_time_before_the_last_window_fails_the_run) {
  // Round 0 says 1.0 (rank 0 then runs [1, 2)); round 1 claims an event at 0.5.
  wire::header zero = round_zero(fingerprint_of_rank0()), one = zero;
  one.round = 1;
  one.local_min = 0.5;
  bootstrap_group g(2);
  fake_member fake(g);
  std::thread t([&] {
    fake.join();
    if (!fake.joined) return;
    fake.send(&zero, sizeof(zero), nullptr, 0);
    fake.send(&one, sizeof(one), nullptr, 0);
    fake.progress_until([&] { return fake.aborts != 0; });
    fake.leave();
  });
  const member_result r = run_member(g, 0, sixteen, defaults);
  t.join();
  BOOST_REQUIRE(fake.joined);
  BOOST_TEST(r.st == status::protocol_error);
  BOOST_TEST(r.why.find("went back from 2") != std::string::npos, r.why);
  BOOST_TEST(fake.aborts == 1);
}
