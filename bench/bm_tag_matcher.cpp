// Micro-benchmarks of comm::detail::tag_matcher: one iteration = one insert + one match.
//
// The argument is the queue depth at match time (1 = empty queue apart from the entry itself,
// 1000 = 999 other entries queued). Cases:
//   *_exact          full-mask receive/probe, other tags queued (hash bucket lookup)
//   *_fifo           all queued entries match; insert at the tail, match the head (steady stream)
//   *_wildcard       a wildcard (mask 0) receive among exact receives of other tags
//   *_wildcard_scan  the matching entry is the youngest behind non-matching wildcard/older ones:
//                    the O(n) worst case of wildcard matching
#include "tag_matcher.hpp"

#include <benchmark/benchmark.h>

#include <vector>

using comm::tag_mask_full;
using comm::tag_t;
using comm::detail::tag_expected;
using comm::detail::tag_matcher;
using comm::detail::tag_unexpected;

namespace {

constexpr tag_t bench_tag = 7;

/// `n` receives for `tag + i * stride` under `mask`.
std::vector<tag_expected> make_expected(size_t n, tag_t tag, tag_t stride, tag_t mask) {
  std::vector<tag_expected> es(n);
  for (size_t i = 0; i < n; ++i) {
    es[i].tag = tag + i * stride;
    es[i].mask = mask;
  }
  return es;
}

/// `n` messages tagged `tag + i * stride`.
std::vector<tag_unexpected> make_unexpected(size_t n, tag_t tag, tag_t stride) {
  std::vector<tag_unexpected> us(n);
  for (size_t i = 0; i < n; ++i)
    us[i].tag = tag + i * stride;
  return us;
}

/// Queue depth requested by the benchmark argument, minus the entry under test.
size_t background(const benchmark::State& state) {
  return static_cast<size_t>(state.range(0)) - 1;
}

/// Posts `bg` (already queued background), then repeatedly posts `e` and matches `tag`.
void run_expected(benchmark::State& state, std::vector<tag_expected>& bg, tag_expected& e,
                  tag_t tag) {
  tag_matcher m;
  for (auto& b : bg)
    m.post_expected(&b);
  for (auto _ : state) {
    m.post_expected(&e);
    benchmark::DoNotOptimize(m.match_expected(tag));
  }
  if (e.queued())
    state.SkipWithError("matched the wrong receive");
  state.SetItemsProcessed(state.iterations());
}

/// Adds `bg`, then repeatedly adds `u` and matches (tag, mask) with removal.
void run_unexpected(benchmark::State& state, std::vector<tag_unexpected>& bg, tag_unexpected& u,
                    tag_t tag, tag_t mask) {
  tag_matcher m;
  for (auto& b : bg)
    m.add_unexpected(&b);
  for (auto _ : state) {
    m.add_unexpected(&u);
    benchmark::DoNotOptimize(m.match_unexpected(tag, mask, true));
  }
  if (u.queued())
    state.SkipWithError("matched the wrong message");
  state.SetItemsProcessed(state.iterations());
}

// -- expected ------------------------------------------------------------------------------------

void BM_expected_exact(benchmark::State& state) {
  auto bg = make_expected(background(state), 1000, 1, tag_mask_full);
  tag_expected e = make_expected(1, bench_tag, 0, tag_mask_full)[0];
  run_expected(state, bg, e, bench_tag);
}

void BM_expected_fifo(benchmark::State& state) {
  auto pool = make_expected(background(state) + 1, bench_tag, 0, tag_mask_full);
  tag_matcher m;
  for (size_t i = 0; i + 1 < pool.size(); ++i)
    m.post_expected(&pool[i]);
  size_t next = pool.size() - 1;  // the one entry not queued; the match frees the next one
  for (auto _ : state) {
    m.post_expected(&pool[next]);
    benchmark::DoNotOptimize(m.match_expected(bench_tag));
    next = next + 1 == pool.size() ? 0 : next + 1;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_expected_wildcard(benchmark::State& state) {
  auto bg = make_expected(background(state), 1000, 1, tag_mask_full);
  tag_expected e = make_expected(1, 0, 0, 0)[0];
  run_expected(state, bg, e, bench_tag);
}

void BM_expected_wildcard_scan(benchmark::State& state) {
  // Background receives want bit 32 set; bench_tag has it clear.
  tag_t bit32 = tag_t{1} << 32;
  auto bg = make_expected(background(state), bit32, 1, bit32);
  tag_expected e = make_expected(1, 0, 0, 0)[0];
  run_expected(state, bg, e, bench_tag);
}

// -- unexpected ----------------------------------------------------------------------------------

void BM_unexpected_exact(benchmark::State& state) {
  auto bg = make_unexpected(background(state), 1000, 1);
  tag_unexpected u = make_unexpected(1, bench_tag, 0)[0];
  run_unexpected(state, bg, u, bench_tag, tag_mask_full);
}

/// Steady stream of messages, all accepted by a receive with `mask`.
void unexpected_fifo(benchmark::State& state, tag_t mask) {
  // Tags differ in the high "source" bits, which a 0xff mask ignores.
  auto pool = make_unexpected(background(state) + 1, bench_tag,
                              mask == tag_mask_full ? 0 : tag_t{1} << 40);
  tag_matcher m;
  for (size_t i = 0; i + 1 < pool.size(); ++i)
    m.add_unexpected(&pool[i]);
  size_t next = pool.size() - 1;
  for (auto _ : state) {
    m.add_unexpected(&pool[next]);
    benchmark::DoNotOptimize(m.match_unexpected(bench_tag, mask, true));
    next = next + 1 == pool.size() ? 0 : next + 1;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_unexpected_fifo(benchmark::State& state) {
  unexpected_fifo(state, tag_mask_full);
}

void BM_unexpected_wildcard_fifo(benchmark::State& state) {
  unexpected_fifo(state, 0xff);
}

void BM_unexpected_wildcard_scan(benchmark::State& state) {
  auto bg = make_unexpected(background(state), 0x100, 0x100);  // low byte 0: no match
  tag_unexpected u = make_unexpected(1, bench_tag | tag_t{1} << 40, 0)[0];
  run_unexpected(state, bg, u, bench_tag, 0xff);
}

}  // namespace

BENCHMARK(BM_expected_exact)->Arg(1)->Arg(1000);
BENCHMARK(BM_expected_fifo)->Arg(1)->Arg(1000);
BENCHMARK(BM_expected_wildcard)->Arg(1)->Arg(1000);
BENCHMARK(BM_expected_wildcard_scan)->Arg(1)->Arg(1000);
BENCHMARK(BM_unexpected_exact)->Arg(1)->Arg(1000);
BENCHMARK(BM_unexpected_fifo)->Arg(1)->Arg(1000);
BENCHMARK(BM_unexpected_wildcard_fifo)->Arg(1)->Arg(1000);
BENCHMARK(BM_unexpected_wildcard_scan)->Arg(1)->Arg(1000);

BENCHMARK_MAIN();
