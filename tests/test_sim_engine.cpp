// The simulation engine in one process: random streams, the pending-event calendar against a
// plain reference, PHOLD's results across partition counts and seeds, the deterministic order of
// simultaneous events, and the rules a handler can break (each refused with a clear error).
#define BOOST_TEST_MODULE sim_engine
#include <boost/test/unit_test.hpp>

#include "comm_phold_model.hpp"
#include "test_util.hpp"

#include <comm/sim/cluster.hpp>
#include <comm/sim/detail/future_events.hpp>
#include <comm/sim/engine.hpp>
#include <comm/sim/report.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <bit>
#include <cmath>
#include <functional>
#include <queue>
#include <set>
#include <string>
#include <vector>

using namespace comm;
using namespace comm::sim;

namespace {

/// Runs PHOLD in this process; returns the result (the run must succeed).
run_result run_phold(uint64_t lps, unsigned partitions, const phold::parameters& p, double end,
                     uint64_t seed, sync_mode sync = sync_mode::conservative) {
  auto c = cluster::local();
  run_config cfg = phold::configuration(lps, partitions, p, end, seed);
  cfg.sync = sync;
  phold::model m{p};
  engine<phold::model> e(*c, cfg, m);
  run_result r;
  std::string why;
  const status st = e.run(&r, &why);
  BOOST_REQUIRE_MESSAGE(st == status::ok, why);
  return r;
}

phold::parameters ross_defaults() { return phold::parameters{}; }

phold::parameters spread_delays() {
  phold::parameters p;
  p.lookahead = 0.5;
  p.mean = 3.0;
  p.remote = 0.5;
  p.start_events = 3;
  return p;
}

}  // namespace

// -- random streams ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(random_streams_are_functions_of_seed_stream_and_count) {
  random_stream a(7, 3), b(7, 3), other_stream(7, 4), other_seed(8, 3);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = a.next();
    BOOST_TEST(x == b.next());
    BOOST_TEST(x != other_stream.next());
    BOOST_TEST(x != other_seed.next());
    seen.insert(x);
  }
  BOOST_TEST(seen.size() == 1000u);
  a.rewind(10);  // draw 991 comes again
  random_stream c(7, 3);
  for (int i = 0; i < 990; ++i) c.next();
  BOOST_TEST(a.next() == c.next());
}

BOOST_AUTO_TEST_CASE(random_distributions_stay_in_range) {
  random_stream r(1, 1);
  double sum = 0;
  std::vector<int> hits(5, 0);
  constexpr int draws = 200000;
  for (int i = 0; i < draws; ++i) {
    const double u = r.uniform();
    BOOST_REQUIRE(u >= 0.0);
    BOOST_REQUIRE(u < 1.0);
    const uint64_t k = r.integer(10, 14);
    BOOST_REQUIRE(k >= 10u);
    BOOST_REQUIRE(k <= 14u);
    ++hits[k - 10];
    sum += r.exponential(2.0);
  }
  for (int h : hits) BOOST_TEST(std::abs(h - draws / 5) < draws / 50);  // within 10 %
  BOOST_TEST(std::abs(sum / draws - 2.0) < 0.05);
  BOOST_TEST(r.exponential(0.0) == 0.0);
  const uint64_t before = r.draws();
  BOOST_TEST(r.integer(5, 5) == 5u);
  BOOST_TEST(r.integer(0, ~uint64_t{0}) != r.integer(0, ~uint64_t{0}));
  BOOST_TEST(r.draws() == before + 3);
}

// -- the calendar of pending events ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(calendar_windows_match_a_sorted_reference) {
  struct message {
    uint64_t id;
  };
  using ev = event<message>;
  detail::future_events<message> q(0.5, 8);  // a small ring, so that far events are common
  std::vector<ev> reference;
  random_stream r(3, 0);
  uint64_t next_id = 0;
  const auto add = [&](sim_time t) {
    const ev e{t, 0, 0, next_id, message{next_id}};
    ++next_id;
    q.push(e);
    reference.push_back(e);
  };
  for (int i = 0; i < 200; ++i) add(r.uniform() * 10);
  sim_time start = 0;
  std::vector<ev> window;
  for (int round = 0; round < 400 && !reference.empty(); ++round) {
    const sim_time min = std::min_element(reference.begin(), reference.end(), [](auto& a, auto& b) {
                           return a.time < b.time;
                         })->time;
    BOOST_REQUIRE_EQUAL(q.min_time(), min);
    BOOST_REQUIRE_EQUAL(q.size(), reference.size());
    start = min;
    const sim_time end = start + 0.5 * (1 + round % 3);  // windows of one to three buckets
    window.clear();
    q.take_before(end, window);
    std::vector<uint64_t> got, want;
    for (const ev& e : window) got.push_back(e.sequence);
    for (const ev& e : reference) {
      if (e.time < end) want.push_back(e.sequence);
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    BOOST_REQUIRE(got == want);
    std::erase_if(reference, [&](const ev& e) { return e.time < end; });
    // New events at or after the window's end: near, on bucket edges, and far beyond the ring.
    for (int k = 0; k < 3; ++k) add(end + r.uniform() * (k == 2 ? 40 : 2));
    add(end);
    add(std::floor(end) + 1.0);
  }
  BOOST_TEST(q.size() == reference.size());
}

// -- PHOLD across layouts ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(ross_defaults_commit_every_event_before_the_end) {
  // Every delay is 1.0: the 16 start events at time 1 each make one event per time unit.
  const run_result r = run_phold(16, 1, ross_defaults(), 500, 1);
  BOOST_TEST(r.committed == 16u * 499u);
  BOOST_TEST(r.processed == r.committed);
  BOOST_TEST(r.efficiency() == 1.0);
  BOOST_TEST(r.rollbacks == 0u);
  BOOST_TEST(r.rounds == 499u);
  BOOST_TEST(r.remote == 0u);
}

BOOST_AUTO_TEST_CASE(digest_is_the_same_for_every_partition_count) {
  for (uint64_t seed : {1u, 2u, 99u}) {
    for (const phold::parameters& p : {ross_defaults(), spread_delays()}) {
      const run_result one = run_phold(24, 1, p, 300, seed);
      for (unsigned parts : {2u, 3u, 5u, 24u}) {
        const run_result r = run_phold(24, parts, p, 300, seed);
        BOOST_TEST(r.digest == one.digest, "seed " << seed << ", " << parts << " partitions");
        BOOST_TEST(r.committed == one.committed);
        BOOST_TEST(r.cross_partition > 0u);
      }
      const run_result sequential = run_phold(24, 1, p, 300, seed, sync_mode::sequential);
      BOOST_TEST(sequential.digest == one.digest);
    }
  }
}

BOOST_AUTO_TEST_CASE(another_seed_gives_another_digest) {
  for (const phold::parameters& p : {ross_defaults(), spread_delays()}) {
    std::set<uint64_t> digests;
    for (uint64_t seed = 1; seed <= 5; ++seed) digests.insert(run_phold(24, 2, p, 300, seed).digest);
    BOOST_TEST(digests.size() == 5u);
  }
}

BOOST_AUTO_TEST_CASE(large_windows_use_the_counting_sort_and_agree) {
  phold::parameters p;
  p.start_events = 16;
  p.remote = 0.25;
  const run_result one = run_phold(512, 1, p, 60, 4);
  const run_result four = run_phold(512, 4, p, 60, 4);
  BOOST_TEST(one.digest == four.digest);
  BOOST_TEST(one.committed == 512u * 16u * 59u);
}

// -- against a plain sequential simulator ------------------------------------------------------

namespace {

/// PHOLD written the textbook way: one priority queue of every event in (time, sender, sequence)
/// order, handled one by one. Its LP states are what the engine must produce.
struct reference_phold {
  struct ev {
    double time;
    lp_id target, sender;
    uint64_t sequence;
    bool operator>(const ev& o) const {
      if (time != o.time) return time > o.time;
      if (sender != o.sender) return sender > o.sender;
      return sequence > o.sequence;
    }
  };
  struct lp {
    random_stream rng;
    phold::model::state state;
    uint64_t handled = 0, sent = 0;
  };
  std::vector<lp> lps;
  std::priority_queue<ev, std::vector<ev>, std::greater<ev>> queue;
  phold::parameters p;
  double end;

  reference_phold(uint64_t n, const phold::parameters& params, double end_time, uint64_t seed)
      : lps(n), p(params), end(end_time) {
    for (uint64_t i = 0; i < n; ++i) lps[i].rng = random_stream(seed, i);
  }
  double delay(lp& l) { return p.lookahead + l.rng.exponential(p.mean - p.lookahead); }
  void send(lp_id from, lp_id to, double t) {
    const uint64_t seq = lps[from].sent++;
    if (t < end) queue.push(ev{t, to, from, seq});
  }
  void run() {
    for (lp_id i = 0; i < lps.size(); ++i) {
      for (unsigned k = 0; k < p.start_events; ++k) send(i, i, delay(lps[i]));
    }
    while (!queue.empty()) {
      const ev e = queue.top();
      queue.pop();
      lp& l = lps[e.target];
      ++l.handled;
      ++l.state.handled;
      l.state.trace = mix64(l.state.trace ^ (std::bit_cast<uint64_t>(e.time) + e.sender));
      lp_id dest = e.target;
      if (l.rng.uniform() < p.remote) {
        dest = static_cast<lp_id>(l.rng.integer(0, lps.size() - 1));
        ++l.state.picked;
      }
      send(e.target, dest, e.time + delay(l));
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_lp_ends_as_in_a_plain_sequential_simulator) {
  for (const phold::parameters& p : {ross_defaults(), spread_delays()}) {
    reference_phold ref(20, p, 150, 5);
    ref.run();
    for (unsigned parts : {1u, 4u}) {
      auto c = cluster::local();
      const run_config cfg = phold::configuration(20, parts, p, 150, 5);
      phold::model m{p};
      engine<phold::model> e(*c, cfg, m);
      run_result r;
      std::string why;
      BOOST_REQUIRE(e.run(&r, &why) == status::ok);
      size_t checked = 0;
      e.for_each_lp([&](lp_id id, const phold::model::state& s, uint64_t handled) {
        const reference_phold::lp& want = ref.lps[id];
        BOOST_TEST(handled == want.handled, "LP " << id);
        BOOST_TEST(s.handled == want.state.handled);
        BOOST_TEST(s.picked == want.state.picked);
        BOOST_TEST(s.trace == want.state.trace, "LP " << id);
        ++checked;
      });
      BOOST_TEST(checked == 20u);
    }
  }
}

// -- the order of simultaneous events ----------------------------------------------------------

namespace {

/// Every LP sends `fan` events to LP 0 at time 1 (in its init); LP 0 records who came in which
/// order.
struct fan_in {
  struct state {
    std::vector<std::pair<uint32_t, uint32_t>>* seen = nullptr;  // (sender, index) at LP 0
  };
  struct message {
    uint32_t sender;
    uint32_t index;
  };
  unsigned fan = 3;
  std::vector<std::pair<uint32_t, uint32_t>> seen;

  void init(lp_context<fan_in>& lp) {
    for (uint32_t i = 0; i < fan; ++i) lp.schedule(0, 1.0, message{lp.id(), i});
  }
  void handle(lp_context<fan_in>&, const message& m) { seen.emplace_back(m.sender, m.index); }
  uint64_t digest(const state&) const { return 0; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(simultaneous_events_run_in_sender_then_sequence_order) {
  for (unsigned parts : {1u, 4u}) {
    auto c = cluster::local();
    run_config cfg;
    cfg.lp_count = 8;
    cfg.partitions = parts;
    cfg.end_time = 10;
    fan_in m;
    engine<fan_in> e(*c, cfg, m);
    run_result r;
    std::string why;
    BOOST_REQUIRE(e.run(&r, &why) == status::ok);
    BOOST_REQUIRE_EQUAL(m.seen.size(), 24u);
    for (size_t i = 0; i < m.seen.size(); ++i) {
      BOOST_TEST(m.seen[i].first == i / 3);
      BOOST_TEST(m.seen[i].second == i % 3);
    }
  }
}

// -- rules and limits --------------------------------------------------------------------------

namespace {

/// A model whose LP 3 breaks a rule at time 2: schedules below the lookahead, to an LP that does
/// not exist, or without end (past max_events).
struct rule_breaker {
  enum class fault { short_delay, bad_target, flood };
  struct state {};
  struct message {};
  fault what = fault::short_delay;
  status refused = status::ok;

  void init(lp_context<rule_breaker>& lp) { lp.schedule(lp.id(), 1.0, {}); }
  void handle(lp_context<rule_breaker>& lp, const message&) {
    if (lp.id() == 3 && lp.now() == 2.0) {
      if (what == fault::short_delay) refused = lp.schedule(1, 0.25, {});
      if (what == fault::bad_target) refused = lp.schedule(1000, 1.0, {});
      for (int i = 0; what == fault::flood && i < 100000 && refused == status::ok; ++i) {
        refused = lp.schedule(1, 1.0, {});
      }
    }
    lp.schedule(lp.id(), 1.0, {});
  }
  uint64_t digest(const state&) const { return 0; }
};

status run_breaker(rule_breaker& m, std::string* why) {
  auto c = cluster::local();
  run_config cfg;
  cfg.lp_count = 8;
  cfg.partitions = 2;
  cfg.end_time = 100;
  cfg.max_events = 1000;
  engine<rule_breaker> e(*c, cfg, m);
  run_result r;
  return e.run(&r, why);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_delay_below_the_lookahead_is_refused_and_fails_the_run) {
  rule_breaker m;
  std::string why;
  BOOST_TEST(run_breaker(m, &why) == status::invalid_param);
  BOOST_TEST(m.refused == status::invalid_param);
  BOOST_TEST(why.find("LP 3") != std::string::npos, why);
  BOOST_TEST(why.find("below the lookahead") != std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(a_target_out_of_range_is_refused) {
  rule_breaker m;
  m.what = rule_breaker::fault::bad_target;
  std::string why;
  BOOST_TEST(run_breaker(m, &why) == status::invalid_param);
  BOOST_TEST(m.refused == status::invalid_param);
  BOOST_TEST(why.find("LP 1000") != std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(more_events_than_the_limit_are_refused) {
  rule_breaker m;
  m.what = rule_breaker::fault::flood;
  std::string why;
  BOOST_TEST(run_breaker(m, &why) == status::exceeds_limit);
  BOOST_TEST(m.refused == status::exceeds_limit);
  BOOST_TEST(why.find("max_events") != std::string::npos, why);
}

BOOST_AUTO_TEST_CASE(phold_start_events_past_the_limit_fail_at_once) {
  // PHOLD's init used to ignore the refusal and go on scheduling (2^32 - 1 refused calls per LP,
  // each formatting its reason: minutes), before the engine looked at the failure.
  phold::parameters p;
  p.start_events = 0xffffffffu;
  run_config cfg = phold::configuration(2, 1, p, 100, 1);
  cfg.max_events = 10;
  auto c = cluster::local();
  phold::model m{p};
  engine<phold::model> e(*c, cfg, m);
  run_result r;
  std::string why;
  BOOST_TEST(e.run(&r, &why) == status::exceeds_limit);
  BOOST_TEST(why.find("LP 0 at time 0.000000 went past the limit of 10 events") !=
                 std::string::npos,
             why);
}

BOOST_AUTO_TEST_CASE(bad_configurations_are_refused) {
  auto c = cluster::local();
  phold::model m;
  const auto check = [&](run_config cfg, status want, const char* words) {
    engine<phold::model> e(*c, cfg, m);
    run_result r;
    std::string why;
    BOOST_TEST(e.run(&r, &why) == want, words);
    BOOST_TEST(why.find(words) != std::string::npos, why);
  };
  run_config cfg;
  cfg.lp_count = 8;
  run_config bad = cfg;
  bad.lookahead = 0;
  check(bad, status::invalid_param, "lookahead");
  bad = cfg;
  bad.lp_count = 0;
  check(bad, status::invalid_param, "LP count");
  bad = cfg;
  bad.partitions = 9;
  check(bad, status::invalid_param, "every partition needs an LP");
  bad = cfg;
  bad.sync = sync_mode::optimistic;
  check(bad, status::unsupported, "optimistic");
}

// -- what a person watches -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(progress_line_and_summary) {
  std::FILE* out = std::tmpfile();
  BOOST_REQUIRE(out != nullptr);
  progress_meter meter(out, 0.01);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  uint64_t committed = 0;
  for (int round = 0; round < 10000000 && std::chrono::steady_clock::now() < until; ++round) {
    committed += 8;
    meter.update(round, committed);
  }
  meter.finish();
  run_result r = run_phold(16, 2, ross_defaults(), 100, 1);
  print_summary(out, r);
  std::rewind(out);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), out));
  std::fclose(out);
  BOOST_TEST(text.find("\r  t=") != std::string::npos, text);
  BOOST_TEST(text.find("M events/s") != std::string::npos);
  for (const char* figure : {"committed events         1584", "efficiency               100.00 %",
                             "rollbacks                0", "remote events            0",
                             "sync rounds              99", "event rate", "digest"}) {
    BOOST_TEST(text.find(figure) != std::string::npos, figure);
  }
}
