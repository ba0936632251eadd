// The C++ face against the low-level API on the same traffic: a tagged receive posted on b, a
// send from a, progress until both completed. Two workers in one thread (bm_protocol's set-up),
// so the numbers are the software path. The low-level case uses C function pointers and releases
// its requests by hand; the C++ face's cases use owning operations, without a completion and
// with capturing lambdas. Every case counts the allocations it makes per message (a replaced
// operator new): a capturing completion lives inside the request, so it adds none.
#include <benchmark/benchmark.h>

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

// Under valgrind's callgrind (bench/bm_api_count.sh) each timed loop's instructions are dumped
// with its iteration count; outside valgrind the client requests are a few no-op instructions.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define BM_API_CALLGRIND 1
#else
#define BM_API_CALLGRIND 0
#endif

namespace {
/// Allocations of this thread so far (operator new below counts them).
thread_local size_t allocations = 0;
}  // namespace

[[gnu::noinline]] void* operator new(size_t size) {
  ++allocations;
  if (void* p = std::malloc(size != 0 ? size : 1)) return p;
  throw std::bad_alloc();
}
// Not inlined: g++ would pair the inlined free() with operator new and warn of a mismatch.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }
// The array and nothrow forms too: a sanitizer's own would otherwise meet this free().
[[gnu::noinline]] void* operator new[](size_t size) { return operator new(size); }
[[gnu::noinline]] void* operator new(size_t size, const std::nothrow_t&) noexcept {
  try {
    return operator new(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
[[gnu::noinline]] void* operator new[](size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

/// Two workers on `transport`, connected a -> b, wireup done.
struct pair_on {
  explicit pair_on(const char* transport) {
    comm::config cfg = comm::config::from_environment();
    cfg.transports = {transport};
    ctx = std::make_unique<comm::context>(cfg);
    a = comm::worker::create(*ctx).value();
    b = comm::worker::create(*ctx).value();
    ab = a->connect(b->address()).value();
    uint64_t v = 0;
    comm::operation r = b->tag_recv(std::span(&v, 1), 1, comm::tag_mask_full);
    comm::operation s = ab->tag_send(1, std::span(&v, 1));
    for (int i = 0; i < 1000000 && !(r.done() && s.done()); ++i) {
      a->progress();
      b->progress();
    }
  }
  /// Progresses both workers until `done()`.
  template <class Done>
  void until(Done&& done) {
    while (!done()) {
      b->progress();
      a->progress();
    }
  }
  std::unique_ptr<comm::context> ctx;
  std::unique_ptr<comm::worker> a, b;
  comm::endpoint_ptr ab;
};

/// Counts what one timed loop costs: the allocations it makes (always) and, under callgrind,
/// its instructions. Made right before the loop, finished right after it.
class loop_cost {
public:
  /// Starts counting for the case `variant` on `transport`.
  loop_cost(benchmark::State& state, const char* variant, const char* transport)
      : state_(state), variant_(variant), transport_(transport), before_(allocations) {
#if BM_API_CALLGRIND
    CALLGRIND_ZERO_STATS;
#endif
  }
  /// Reports the allocations per iteration and, under callgrind, dumps the instructions as
  /// "bm_api <variant>/<transport>/<range> iterations=<n>" (bench/bm_api_count.sh divides).
  void finish() {
#if BM_API_CALLGRIND
    if (RUNNING_ON_VALGRIND) {
      char what[160];
      std::snprintf(what, sizeof what, "bm_api %s/%s/%lld iterations=%lld", variant_,
                    transport_, static_cast<long long>(state_.range(0)),
                    static_cast<long long>(state_.iterations()));
      CALLGRIND_DUMP_STATS_AT(what);
    }
#endif
    state_.counters["allocs_per_msg"] = static_cast<double>(allocations - before_) /
                                        static_cast<double>(state_.iterations());
    state_.SetItemsProcessed(state_.iterations());
  }

private:
  benchmark::State& state_;
  const char* variant_;
  const char* transport_;
  size_t before_;
};

/// What the low-level callbacks count.
struct tally {
  uint64_t sends = 0;
  uint64_t recvs = 0;
  uint64_t bytes = 0;
};

void on_sent(comm::request*, comm::status, void* user) { ++static_cast<tally*>(user)->sends; }

void on_received(comm::request*, comm::status, const comm::tag_recv_info& info, void* user) {
  auto* t = static_cast<tally*>(user);
  ++t->recvs;
  t->bytes += info.length;
}

/// Low-level API: C function pointers with user_data, requests released by hand.
void function_pointers(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  std::vector<uint8_t> out(state.range(0)), in(state.range(0));
  tally t;
  comm::tag_recv_info info;
  comm::request_params rp;
  rp.recv_cb = on_received;
  rp.user_data = &t;
  rp.recv_info = &info;
  comm::request_params sp;
  sp.send_cb = on_sent;
  sp.user_data = &t;
  loop_cost cost(state, "function_pointers", transport);
  for (auto _ : state) {
    comm::op r = p.b->tag_recv(in.data(), in.size(), 7, comm::tag_mask_full, rp);
    comm::op s = p.ab->tag_send(7, out.data(), out.size(), sp);
    if (s.pending()) p.a->release(s.req);
    if (r.pending()) {
      p.until([&] { return p.b->request_status(r.req) != comm::status::in_progress; });
      p.b->release(r.req);
    }
  }
  cost.finish();
  benchmark::DoNotOptimize(t);
}

/// C++ face without completions: owning operations, polled.
void operations(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  std::vector<uint8_t> out(state.range(0)), in(state.range(0));
  loop_cost cost(state, "operations", transport);
  for (auto _ : state) {
    comm::operation r = p.b->tag_recv(in, 7, comm::tag_mask_full);
    comm::operation s = p.ab->tag_send(7, out);
    p.until([&] { return r.done(); });
  }
  cost.finish();
}

/// C++ face with capturing completions (four captures: a pointer, two values, a reference).
void capturing_lambdas(benchmark::State& state, const char* transport) {
  pair_on p(transport);
  std::vector<uint8_t> out(state.range(0)), in(state.range(0));
  tally t;
  uint64_t step = 1;  // a captured value (not a constant the compiler could fold)
  benchmark::DoNotOptimize(step);
  loop_cost cost(state, "capturing_lambdas", transport);
  for (auto _ : state) {
    comm::operation r =
        p.b->tag_recv(in, 7, comm::tag_mask_full,
                      [&t, step, self = &p, n = in.size()](comm::status,
                                                           const comm::tag_recv_info& info) {
                        t.recvs += step;
                        t.bytes += info.length + (self != nullptr ? 0 : n);
                      });
    comm::operation s = p.ab->tag_send(7, out, [&t, step](comm::status) { t.sends += step; });
    p.until([&] { return r.done(); });
  }
  cost.finish();
  if (t.recvs != static_cast<uint64_t>(state.iterations())) {
    state.SkipWithError("a completion did not run once");
  }
}

}  // namespace

BENCHMARK_CAPTURE(function_pointers, shm, "shm")->Arg(8)->Arg(4096);
BENCHMARK_CAPTURE(operations, shm, "shm")->Arg(8)->Arg(4096);
BENCHMARK_CAPTURE(capturing_lambdas, shm, "shm")->Arg(8)->Arg(4096);
BENCHMARK_CAPTURE(function_pointers, self, "self")->Arg(8);
BENCHMARK_CAPTURE(operations, self, "self")->Arg(8);
BENCHMARK_CAPTURE(capturing_lambdas, self, "self")->Arg(8);

BENCHMARK_MAIN();
