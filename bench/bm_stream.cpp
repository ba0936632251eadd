// Micro-benchmarks of the stream module: two workers in one thread connected over one transport,
// so the numbers are the software path of a stream send and its receive (copies, fragments,
// descriptors, rendezvous) without cross-core traffic. Cases:
//   posted      the receive is posted before the bytes arrive (they land in its buffer);
//   unposted    the bytes arrive first and wait on the endpoint, then a receive takes them;
//   recv_data   the bytes arrive first, then stream_recv_data lends them without a copy;
//   window      32 sends and 32 wait-all receives in flight, as comm_perftest's stream_bw;
// each eager (what stream_send does) and, as `*_rndv`, by rendezvous (request_force_rndv).
// Every case reports bytes/s; the counters show how the receiver moved each byte (stream module
// counters per byte sent): copied from the transport into a receive (`direct`), read by
// rendezvous into a receive (`read`), copied into the buffer (`copy_in`), kept in a transport
// descriptor (`kept`), read by rendezvous into the buffer (`read_in`), copied out of the buffer
// into a receive (`copy_out`); and the transport messages per send (`msgs`).
#include <benchmark/benchmark.h>

#include <comm/context.hpp>
#include <comm/worker.hpp>

#include "protocols.hpp"

#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

namespace {

/// Two workers on `transport`, connected a -> b, wireup done; `rx` is b's endpoint of the stream.
struct stream_pair {
  explicit stream_pair(const char* transport) {
    comm::config cfg = comm::config::from_environment();
    cfg.transports = {transport};
    ctx = std::make_unique<comm::context>(cfg);
    a = comm::worker::create(*ctx).value();
    b = comm::worker::create(*ctx).value();
    if (a->connect(b->address(), &ab) != comm::status::ok) std::abort();
    uint8_t byte = 1;
    comm::op s = ab->stream_send(&byte, 1);
    comm::stream_poll_entry ready;
    for (int i = 0; i < 10000000 && rx == nullptr; ++i) {
      progress();
      if (b->stream_poll(&ready, 1) == 1) rx = ready.ep;
    }
    if (rx == nullptr) std::abort();
    finish(*a, s);
    size_t got = 0;
    if (!rx->stream_recv(&byte, 1, &got).done()) std::abort();
  }
  void progress() {
    a->progress();
    b->progress();
  }
  /// Progresses both workers until `o` (of `owner`) completed, then releases it.
  void finish(comm::worker& owner, comm::op o) {
    if (!o.pending()) {
      if (o.failed()) std::abort();
      return;
    }
    while (owner.request_status(o.req) == comm::status::in_progress) progress();
    if (owner.request_status(o.req) != comm::status::ok) std::abort();
    owner.release(o.req);
  }
  /// True when `o` (of `owner`) is over; releases it then.
  bool over(comm::worker& owner, comm::op o) {
    if (!o.pending()) return true;
    if (owner.request_status(o.req) == comm::status::in_progress) return false;
    owner.release(o.req);
    return true;
  }
  comm::op recv_all(void* buffer, size_t length) {
    comm::request_params p;
    p.flags = comm::request_stream_waitall;
    size_t got = 0;
    return rx->stream_recv(buffer, length, &got, p);
  }
  std::unique_ptr<comm::context> ctx;
  std::unique_ptr<comm::worker> a, b;
  comm::endpoint* ab = nullptr;
  comm::endpoint* rx = nullptr;
};

/// The receiver's stream counters.
const comm::detail::stream_counters& counts(comm::worker& w) {
  using comm::detail::stream_protocol;
  return comm::detail::module_of<stream_protocol>(comm::detail::impl(w)).counters();
}

/// Sets the bytes processed and the per-byte counters since `before`.
void report(benchmark::State& state, stream_pair& p, const comm::detail::stream_counters& before) {
  const auto bytes = static_cast<double>(state.iterations()) * static_cast<double>(state.range(0));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  const comm::detail::stream_counters& now = counts(*p.b);
  auto per_byte = [&](uint64_t after, uint64_t was) {
    return benchmark::Counter(static_cast<double>(after - was) / bytes);
  };
  state.counters["direct"] = per_byte(now.direct_bytes, before.direct_bytes);
  state.counters["read"] = per_byte(now.fetched_direct, before.fetched_direct);
  state.counters["copy_in"] = per_byte(now.copied_bytes, before.copied_bytes);
  state.counters["kept"] = per_byte(now.kept_bytes, before.kept_bytes);
  state.counters["read_in"] = per_byte(now.fetched_buffered, before.fetched_buffered);
  state.counters["copy_out"] = per_byte(now.drained_bytes, before.drained_bytes);
  state.counters["msgs"] = benchmark::Counter(
      static_cast<double>(now.fragments + now.fetches - before.fragments - before.fetches) /
      static_cast<double>(state.iterations()));
}

/// Parameters of a send: by rendezvous when `rndv`.
comm::request_params send_params(bool rndv) {
  comm::request_params p;
  if (rndv) p.flags = comm::request_force_rndv;
  return p;
}

/// The receive is posted first, then the send; both complete.
void posted(benchmark::State& state, const char* transport, bool rndv) {
  stream_pair p(transport);
  std::vector<uint8_t> out(state.range(0), 1), in(state.range(0));
  const comm::detail::stream_counters before = counts(*p.b);
  for (auto _ : state) {
    comm::op r = p.recv_all(in.data(), in.size());
    comm::op s = p.ab->stream_send(out.data(), out.size(), send_params(rndv));
    p.finish(*p.b, r);
    p.finish(*p.a, s);
  }
  report(state, p, before);
}

/// The send arrives first (and completes), then a wait-all receive takes the bytes.
void unposted(benchmark::State& state, const char* transport, bool rndv) {
  stream_pair p(transport);
  std::vector<uint8_t> out(state.range(0), 1), in(state.range(0));
  const comm::detail::stream_counters before = counts(*p.b);
  comm::stream_poll_entry ready;
  for (auto _ : state) {
    comm::op s = p.ab->stream_send(out.data(), out.size(), send_params(rndv));
    p.finish(*p.a, s);
    while (p.b->stream_poll(&ready, 1) == 0 || ready.length < in.size()) p.progress();
    p.finish(*p.b, p.recv_all(in.data(), in.size()));
  }
  report(state, p, before);
}

/// The send arrives first, then stream_recv_data lends every block of it.
void recv_data(benchmark::State& state, const char* transport, bool rndv) {
  stream_pair p(transport);
  std::vector<uint8_t> out(state.range(0), 1);
  const comm::detail::stream_counters before = counts(*p.b);
  comm::stream_poll_entry ready;
  for (auto _ : state) {
    comm::op s = p.ab->stream_send(out.data(), out.size(), send_params(rndv));
    p.finish(*p.a, s);
    while (p.b->stream_poll(&ready, 1) == 0 || ready.length < out.size()) p.progress();
    size_t taken = 0, length = 0;
    while (taken < out.size()) {
      void* block = p.rx->stream_recv_data(&length);
      if (block == nullptr) std::abort();
      benchmark::DoNotOptimize(*static_cast<volatile uint8_t*>(block));
      taken += length;
      if (p.rx->stream_data_release(block) != comm::status::ok) std::abort();
    }
  }
  report(state, p, before);
}

/// 32 sends and 32 wait-all receives in flight (comm_perftest stream_bw's window).
void window(benchmark::State& state, const char* transport, bool rndv) {
  constexpr size_t depth = 32;
  stream_pair p(transport);
  std::vector<uint8_t> out(state.range(0), 1), in(state.range(0));
  std::deque<comm::op> sends, recvs;
  const comm::detail::stream_counters before = counts(*p.b);
  for (auto _ : state) {
    while (recvs.size() >= depth) {
      if (p.over(*p.b, recvs.front())) {
        recvs.pop_front();
      } else {
        p.progress();
      }
    }
    recvs.push_back(p.recv_all(in.data(), in.size()));
    while (sends.size() >= depth) {
      if (p.over(*p.a, sends.front())) {
        sends.pop_front();
      } else {
        p.progress();
      }
    }
    sends.push_back(p.ab->stream_send(out.data(), out.size(), send_params(rndv)));
    p.progress();
  }
  for (comm::op o : sends) p.finish(*p.a, o);
  for (comm::op o : recvs) p.finish(*p.b, o);
  report(state, p, before);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t s : {8, 4096, 16384, 65536, 262144, 1048576}) b->Arg(s);
}

}  // namespace

BENCHMARK_CAPTURE(posted, shm, "shm", false)->Apply(sizes);
BENCHMARK_CAPTURE(unposted, shm, "shm", false)->Apply(sizes);
BENCHMARK_CAPTURE(recv_data, shm, "shm", false)->Apply(sizes);
BENCHMARK_CAPTURE(window, shm, "shm", false)->Apply(sizes);
BENCHMARK_CAPTURE(posted, shm_rndv, "shm", true)->Apply(sizes);
BENCHMARK_CAPTURE(unposted, shm_rndv, "shm", true)->Apply(sizes);
BENCHMARK_CAPTURE(window, shm_rndv, "shm", true)->Apply(sizes);
BENCHMARK_CAPTURE(posted, tcp, "tcp", false)->Apply(sizes);
BENCHMARK_CAPTURE(unposted, tcp, "tcp", false)->Apply(sizes);
BENCHMARK_CAPTURE(window, tcp, "tcp", false)->Apply(sizes);
BENCHMARK_CAPTURE(posted, self, "self", false)->Apply(sizes);
BENCHMARK_CAPTURE(posted, self_rndv, "self", true)->Apply(sizes);

BENCHMARK_MAIN();
