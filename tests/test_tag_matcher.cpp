// Tests of comm::detail::tag_matcher: exact and masked matching, MPI ordering between hashed and
// wildcard receives, arrival order of unexpected messages, cancellation, and a randomized
// comparison against a list-scanning reference model.
#define BOOST_TEST_MODULE tag_matcher
#include <boost/test/unit_test.hpp>

#include "tag_matcher.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <list>
#include <random>
#include <vector>

using comm::tag_mask_full;
using comm::tag_t;
using comm::detail::tag_expected;
using comm::detail::tag_matcher;
using comm::detail::tag_unexpected;

namespace {

/// A posted receive for `tag` under `mask`.
tag_expected make_expected(tag_t tag, tag_t mask = tag_mask_full) {
  tag_expected e;
  e.tag = tag;
  e.mask = mask;
  return e;
}

/// An unexpected message tagged `tag`.
tag_unexpected make_unexpected(tag_t tag) {
  tag_unexpected u;
  u.tag = tag;
  return u;
}

/// Posts every receive of `es` in order.
void post_all(tag_matcher& m, std::deque<tag_expected>& es) {
  for (auto& e : es)
    m.post_expected(&e);
}

/// Adds every message of `us` in order.
void add_all(tag_matcher& m, std::deque<tag_unexpected>& us) {
  for (auto& u : us)
    m.add_unexpected(&u);
}

}  // namespace

// -- expected ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(exact_match) {
  tag_matcher m;
  auto a = make_expected(7), b = make_expected(9);
  m.post_expected(&a);
  m.post_expected(&b);
  BOOST_TEST(m.expected_count() == 2u);
  BOOST_TEST(m.match_expected(8) == nullptr);
  BOOST_TEST(m.match_expected(9) == &b);
  BOOST_TEST(m.match_expected(9) == nullptr);
  BOOST_TEST(m.match_expected(7) == &a);
  BOOST_TEST(m.expected_count() == 0u);
  BOOST_TEST(!a.queued());
  BOOST_TEST(!b.queued());
}

BOOST_AUTO_TEST_CASE(same_tag_matches_in_posting_order) {
  tag_matcher m;
  std::deque<tag_expected> es(5, make_expected(42));
  post_all(m, es);
  for (auto& e : es)
    BOOST_TEST(m.match_expected(42) == &e);
  BOOST_TEST(m.match_expected(42) == nullptr);
}

BOOST_AUTO_TEST_CASE(mask_selects_bits) {
  tag_matcher m;
  auto e = make_expected(0x1200, 0xff00);  // wants 0x12 in bits 8..15, anything elsewhere
  m.post_expected(&e);
  BOOST_TEST(m.match_expected(0x1300) == nullptr);
  BOOST_TEST(m.match_expected(0x12) == nullptr);  // 0x12 in the wrong byte
  BOOST_TEST(m.match_expected(0xff'0000'0000'12ab) == &e);
  BOOST_TEST(m.expected_count() == 0u);
}

BOOST_AUTO_TEST_CASE(mask_zero_matches_all) {
  tag_matcher m;
  auto e = make_expected(0x5555, 0);
  m.post_expected(&e);
  BOOST_TEST(m.match_expected(~tag_t{0}) == &e);
  m.post_expected(&e);
  BOOST_TEST(m.match_expected(0) == &e);
}

BOOST_AUTO_TEST_CASE(wildcard_posted_first_wins) {
  tag_matcher m;
  auto w = make_expected(0, 0), x = make_expected(5);
  m.post_expected(&w);
  m.post_expected(&x);
  BOOST_TEST(m.match_expected(5) == &w);
  BOOST_TEST(m.match_expected(5) == &x);
}

BOOST_AUTO_TEST_CASE(exact_posted_first_wins) {
  tag_matcher m;
  auto x = make_expected(5), w = make_expected(0, 0);
  m.post_expected(&x);
  m.post_expected(&w);
  BOOST_TEST(m.match_expected(5) == &x);
  BOOST_TEST(m.match_expected(5) == &w);
}

BOOST_AUTO_TEST_CASE(interleaved_exact_and_wildcard) {
  tag_matcher m;
  // Posting order: x1(5) w1(mask 0xf0, wants 0x10) x2(5) w2(any) x3(5) w3(wants 0x20 in 0xf0)
  auto x1 = make_expected(5), x2 = make_expected(5), x3 = make_expected(5);
  auto w1 = make_expected(0x10, 0xf0), w2 = make_expected(0, 0), w3 = make_expected(0x20, 0xf0);
  for (auto* e : {&x1, &w1, &x2, &w2, &x3, &w3})
    m.post_expected(e);
  // Tag 5 (0x05): w1 and w3 do not accept it.
  BOOST_TEST(m.match_expected(5) == &x1);
  BOOST_TEST(m.match_expected(5) == &x2);
  BOOST_TEST(m.match_expected(5) == &w2);
  BOOST_TEST(m.match_expected(5) == &x3);
  BOOST_TEST(m.match_expected(5) == nullptr);
  BOOST_TEST(m.match_expected(0x25) == &w3);
  BOOST_TEST(m.match_expected(0x15) == &w1);
  BOOST_TEST(m.expected_count() == 0u);
}

BOOST_AUTO_TEST_CASE(skipped_wildcard_stays_queued) {
  tag_matcher m;
  auto w1 = make_expected(0x100, 0xf00), w2 = make_expected(0, 0);
  m.post_expected(&w1);
  m.post_expected(&w2);
  BOOST_TEST(m.match_expected(0x200) == &w2);
  BOOST_TEST(w1.queued());
  BOOST_TEST(m.match_expected(0x1ff) == &w1);
}

BOOST_AUTO_TEST_CASE(remove_expected_head_middle_tail) {
  for (size_t victim = 0; victim < 3; ++victim) {
    tag_matcher m;
    std::deque<tag_expected> es(3, make_expected(3));
    std::deque<tag_expected> ws(3, make_expected(0, 0));
    post_all(m, es);
    post_all(m, ws);
    BOOST_TEST(m.remove_expected(&es[victim]));
    BOOST_TEST(m.remove_expected(&ws[victim]));
    BOOST_TEST(!m.remove_expected(&es[victim]));
    BOOST_TEST(!m.remove_expected(&ws[victim]));
    BOOST_TEST(m.expected_count() == 4u);
    for (size_t i = 0; i < 3; ++i)
      if (i != victim)
        BOOST_TEST(m.match_expected(3) == &es[i]);
    for (size_t i = 0; i < 3; ++i)
      if (i != victim)
        BOOST_TEST(m.match_expected(99) == &ws[i]);
    BOOST_TEST(m.expected_count() == 0u);
  }
}

BOOST_AUTO_TEST_CASE(remove_never_posted_or_matched) {
  tag_matcher m;
  auto e = make_expected(1);
  BOOST_TEST(!m.remove_expected(&e));
  m.post_expected(&e);
  BOOST_TEST(m.match_expected(1) == &e);
  BOOST_TEST(!m.remove_expected(&e));
  m.post_expected(&e);  // a matched entry can be posted again
  BOOST_TEST(m.remove_expected(&e));
  BOOST_TEST(m.expected_count() == 0u);
}

BOOST_AUTO_TEST_CASE(for_each_expected_visits_all_and_allows_removal) {
  tag_matcher m;
  std::deque<tag_expected> es;
  for (tag_t t = 0; t < 50; ++t)
    es.push_back(make_expected(t, t % 5 == 0 ? 0xf : tag_mask_full));
  post_all(m, es);
  size_t visited = 0;
  m.for_each_expected([&](tag_expected* e) {
    ++visited;
    BOOST_TEST(m.remove_expected(e));
  });
  BOOST_TEST(visited == es.size());
  BOOST_TEST(m.expected_count() == 0u);
}

// -- unexpected ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(unexpected_same_tag_in_arrival_order) {
  tag_matcher m;
  std::deque<tag_unexpected> us(4, make_unexpected(11));
  add_all(m, us);
  BOOST_TEST(m.match_unexpected(11, tag_mask_full, false) == &us[0]);  // probe keeps it
  BOOST_TEST(m.unexpected_count() == 4u);
  for (auto& u : us)
    BOOST_TEST(m.match_unexpected(11, tag_mask_full, true) == &u);
  BOOST_TEST(m.match_unexpected(11, tag_mask_full, true) == nullptr);
  BOOST_TEST(m.unexpected_count() == 0u);
}

BOOST_AUTO_TEST_CASE(unexpected_arrival_order_across_tags) {
  tag_matcher m;
  std::deque<tag_unexpected> us;
  for (tag_t t : {0x31, 0x22, 0x13, 0x24, 0x35})
    us.push_back(make_unexpected(t));
  add_all(m, us);
  BOOST_TEST(m.match_unexpected(0x20, 0xf0, true) == &us[1]);
  BOOST_TEST(m.match_unexpected(0, 0, false) == &us[0]);
  BOOST_TEST(m.match_unexpected(0x35, tag_mask_full, true) == &us[4]);
  BOOST_TEST(m.match_unexpected(0, 0, true) == &us[0]);
  BOOST_TEST(m.match_unexpected(0, 0, true) == &us[2]);
  BOOST_TEST(m.match_unexpected(0x20, 0xf0, true) == &us[3]);
  BOOST_TEST(m.match_unexpected(0, 0, true) == nullptr);
}

BOOST_AUTO_TEST_CASE(unexpected_exact_ignores_other_tags) {
  tag_matcher m;
  auto a = make_unexpected(1), b = make_unexpected(2);
  m.add_unexpected(&a);
  m.add_unexpected(&b);
  BOOST_TEST(m.match_unexpected(3, tag_mask_full, true) == nullptr);
  BOOST_TEST(m.match_unexpected(2, tag_mask_full, true) == &b);
  BOOST_TEST(m.match_unexpected(0, 0, true) == &a);
}

BOOST_AUTO_TEST_CASE(remove_unexpected_head_middle_tail) {
  for (size_t victim = 0; victim < 3; ++victim) {
    tag_matcher m;
    std::deque<tag_unexpected> us(3, make_unexpected(8));
    add_all(m, us);
    BOOST_TEST(m.remove_unexpected(&us[victim]));
    BOOST_TEST(!m.remove_unexpected(&us[victim]));
    BOOST_TEST(m.unexpected_count() == 2u);
    // Both lists must have lost it: check exact (bucket) then wildcard (arrival) order.
    size_t first = victim == 0 ? 1 : 0, second = victim == 2 ? 1 : 2;
    BOOST_TEST(m.match_unexpected(8, tag_mask_full, false) == &us[first]);
    BOOST_TEST(m.match_unexpected(0, 0, true) == &us[first]);
    BOOST_TEST(m.match_unexpected(8, tag_mask_full, true) == &us[second]);
    BOOST_TEST(m.match_unexpected(0, 0, true) == nullptr);
  }
}

BOOST_AUTO_TEST_CASE(for_each_unexpected_in_arrival_order) {
  tag_matcher m;
  std::deque<tag_unexpected> us;
  for (tag_t t = 0; t < 20; ++t)
    us.push_back(make_unexpected(t * 7919));
  add_all(m, us);
  size_t i = 0;
  m.for_each_unexpected([&](tag_unexpected* u) {
    BOOST_TEST(u == &us[i++]);
    m.remove_unexpected(u);
  });
  BOOST_TEST(i == us.size());
  BOOST_TEST(m.unexpected_count() == 0u);
}

// -- buckets -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(bucket_count_is_power_of_two) {
  BOOST_TEST(tag_matcher(0).bucket_count() == 1u);
  BOOST_TEST(tag_matcher(1).bucket_count() == 1u);
  BOOST_TEST(tag_matcher(1000).bucket_count() == 1024u);
  BOOST_TEST(tag_matcher(4096).bucket_count() == 4096u);
  BOOST_TEST(tag_matcher().bucket_count() == tag_matcher::default_bucket_count);
}

/// With one bucket every tag collides; with more tags than buckets, many do.
BOOST_AUTO_TEST_CASE(colliding_tags) {
  struct shape { size_t buckets; tag_t ntags; };
  for (shape s : {shape{1, 64}, shape{4, 64}, shape{tag_matcher::default_bucket_count, 5000}}) {
    tag_matcher m(s.buckets);
    const tag_t ntags = s.ntags;
    std::deque<tag_expected> es;
    std::deque<tag_unexpected> us;
    for (int round = 0; round < 3; ++round)
      for (tag_t t = 0; t < ntags; ++t) {
        es.push_back(make_expected(t << 32 | t));
        us.push_back(make_unexpected(t << 32 | t));
      }
    post_all(m, es);
    add_all(m, us);
    // Match tags in reverse: each must find the earliest of its own tag despite collisions.
    for (int round = 0; round < 3; ++round)
      for (tag_t t = ntags; t-- > 0;) {
        size_t i = round * ntags + t;
        BOOST_TEST(m.match_expected(t << 32 | t) == &es[i]);
        BOOST_TEST(m.match_unexpected(t << 32 | t, tag_mask_full, true) == &us[i]);
      }
    BOOST_TEST(m.expected_count() == 0u);
    BOOST_TEST(m.unexpected_count() == 0u);
  }
}

// -- randomized ----------------------------------------------------------------------------------

namespace {

/// The obvious implementation: two lists scanned front to back.
struct reference_model {
  std::list<tag_expected*> expected;
  std::list<tag_unexpected*> unexpected;

  tag_expected* match_expected(tag_t tag) {
    auto it = std::find_if(expected.begin(), expected.end(),
                           [&](tag_expected* e) { return ((e->tag ^ tag) & e->mask) == 0; });
    if (it == expected.end())
      return nullptr;
    tag_expected* e = *it;
    expected.erase(it);
    return e;
  }

  tag_unexpected* match_unexpected(tag_t tag, tag_t mask, bool remove) {
    auto it = std::find_if(unexpected.begin(), unexpected.end(),
                           [&](tag_unexpected* u) { return ((u->tag ^ tag) & mask) == 0; });
    if (it == unexpected.end())
      return nullptr;
    tag_unexpected* u = *it;
    if (remove)
      unexpected.erase(it);
    return u;
  }
};

/// Drives a matcher and the reference model with the same random operations.
class random_driver {
public:
  random_driver(size_t buckets, uint64_t seed) : m_(buckets), rng_(seed) {
    exp_pool_.resize(pool_size);
    unexp_pool_.resize(pool_size);
  }

  /// @returns how many matches found an entry so far.
  size_t hits() const { return hits_; }

  /// Runs `steps` random operations, checking every result against the model.
  void run(size_t steps) {
    for (size_t i = 0; i < steps; ++i) {
      step();
      BOOST_REQUIRE_EQUAL(m_.expected_count(), ref_.expected.size());
      BOOST_REQUIRE_EQUAL(m_.unexpected_count(), ref_.unexpected.size());
    }
  }

private:
  static constexpr size_t pool_size = 256;

  uint64_t below(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }

  /// A tag from a small set (so matches happen) with a random source field in the high bits.
  tag_t random_tag() { return below(8) | below(4) << 40; }

  /// A mask: mostly full, sometimes one field only, sometimes 0.
  tag_t random_mask() {
    switch (below(6)) {
      case 0: return 0;
      case 1: return 0xff;                  // ignore the source field
      case 2: return tag_t{0xff} << 40;     // source only
      default: return tag_mask_full;
    }
  }

  void step() {
    switch (below(7)) {
      case 0: case 1: post(); break;
      case 2: match_expected(); break;
      case 3: cancel_expected(); break;
      case 4: add(); break;
      case 5: match_unexpected(); break;
      default: cancel_unexpected(); break;
    }
  }

  void post() {
    tag_expected& e = exp_pool_[below(pool_size)];
    if (e.queued())
      return;
    e.tag = random_tag();
    e.mask = random_mask();
    m_.post_expected(&e);
    ref_.expected.push_back(&e);
  }

  void match_expected() {
    tag_t tag = random_tag();
    tag_expected* e = ref_.match_expected(tag);
    BOOST_REQUIRE_EQUAL(m_.match_expected(tag), e);
    hits_ += e != nullptr;
  }

  void cancel_expected() {
    tag_expected& e = exp_pool_[below(pool_size)];
    bool queued = std::find(ref_.expected.begin(), ref_.expected.end(), &e) != ref_.expected.end();
    ref_.expected.remove(&e);
    BOOST_REQUIRE_EQUAL(m_.remove_expected(&e), queued);
  }

  void add() {
    tag_unexpected& u = unexp_pool_[below(pool_size)];
    if (u.queued())
      return;
    u.tag = random_tag();
    m_.add_unexpected(&u);
    ref_.unexpected.push_back(&u);
  }

  void match_unexpected() {
    tag_t tag = random_tag(), mask = random_mask();
    bool remove = below(4) != 0;
    tag_unexpected* u = ref_.match_unexpected(tag, mask, remove);
    BOOST_REQUIRE_EQUAL(m_.match_unexpected(tag, mask, remove), u);
    hits_ += u != nullptr;
  }

  void cancel_unexpected() {
    tag_unexpected& u = unexp_pool_[below(pool_size)];
    auto& list = ref_.unexpected;
    bool queued = std::find(list.begin(), list.end(), &u) != list.end();
    list.remove(&u);
    BOOST_REQUIRE_EQUAL(m_.remove_unexpected(&u), queued);
  }

  tag_matcher m_;
  reference_model ref_;
  std::mt19937_64 rng_;
  std::vector<tag_expected> exp_pool_;
  std::vector<tag_unexpected> unexp_pool_;
  size_t hits_ = 0;
};

}  // namespace

BOOST_AUTO_TEST_CASE(randomized_against_reference) {
  for (size_t buckets : {1, 8, 1024}) {
    BOOST_TEST_CONTEXT("buckets " << buckets) {
      random_driver d(buckets, 0x5eed + buckets);
      d.run(200000);
      BOOST_TEST(d.hits() > 20000u);  // the model was exercised, not just empty-queue misses
    }
  }
}

BOOST_AUTO_TEST_CASE(software_receives_are_counted_for_offload) {
  tag_matcher m(8);
  BOOST_CHECK(!m.software_may_take(5));
  tag_expected off = make_expected(5);
  off.offloaded = true;
  m.post_expected(&off);
  BOOST_CHECK(!m.software_may_take(5));  // only an offloaded receive of the tag
  tag_expected soft = make_expected(5);
  m.post_expected(&soft);
  BOOST_CHECK(m.software_may_take(5));
  BOOST_CHECK(m.match_expected(5) == &off);  // posting order holds across both kinds
  BOOST_CHECK(m.software_may_take(5));
  BOOST_CHECK(m.match_expected(5) == &soft);
  BOOST_CHECK(!m.software_may_take(5));
  // A wildcard counts for the tags it accepts only.
  tag_expected wild = make_expected(0x100, 0xf00);
  m.post_expected(&wild);
  BOOST_CHECK(m.software_may_take(0x1ab));
  BOOST_CHECK(!m.software_may_take(0x2ab));
  BOOST_CHECK(m.remove_expected(&wild));
  BOOST_CHECK(!m.software_may_take(0x1ab));
  // With one bucket every exact software receive blocks every tag (conservative, never wrong).
  tag_matcher one(1);
  tag_expected other = make_expected(77);
  one.post_expected(&other);
  BOOST_CHECK(one.software_may_take(78));
  BOOST_CHECK(one.remove_expected(&other));
  BOOST_CHECK(!one.software_may_take(78));
}
