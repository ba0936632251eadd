// Micro-benchmarks of the tcp transport on loopback, two interfaces in one process: a ping-pong of
// 8-byte am_short (a round trip through the kernel, both ends progressed by one thread; both
// directions share one connection), streams of bcopy and zcopy messages (send what the window and
// socket take, progress both ends), a large buffer moved as a software rendezvous moves it (bcopy
// fragments copied out by the receiver) against one get_zcopy or put_zcopy (no copy of ours), and
// the life of a connection (connect, handshake with or without the key, one message, both sides'
// bye and close). COMM_TCP_DEVICE picks the device (lo by default here). One thread does the work
// of both sides, so the CPU time per operation is what both sides spend on it.
#include <comm/transport/transport.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace comm;

tl::component& tcp() {
  for (tl::component* c : tl::all_components()) {
    if (c->name() == "tcp") return *c;
  }
  std::abort();
}

/// Opens a tcp interface on lo (or COMM_TCP_DEVICE), aborting on failure.
std::unique_ptr<tl::iface> open_iface(const std::string& auth_key = "") {
  tl::iface_params params;
  const char* device = std::getenv("COMM_TCP_DEVICE");
  params.device = device != nullptr ? device : "lo";
  params.auth_key = auth_key;
  std::unique_ptr<tl::iface> iface;
  if (tcp().open(params, iface) != status::ok) std::abort();
  return iface;
}

/// Two interfaces with endpoints both ways; handler id 1 counts messages on each side.
struct pair {
  std::unique_ptr<tl::iface> a = open_iface();
  std::unique_ptr<tl::iface> b = open_iface();
  std::unique_ptr<tl::ep> ab;
  std::unique_ptr<tl::ep> ba;
  uint64_t at_a = 0;
  uint64_t at_b = 0;

  pair() {
    if (a->create_ep(b->device_address(), b->iface_address(), ab) != status::ok ||
        b->create_ep(a->device_address(), a->iface_address(), ba) != status::ok) {
      std::abort();
    }
    a->set_am_handler(1, &count, &at_a);
    b->set_am_handler(1, &count, &at_b);
  }

  static status count(void* arg, void* data, size_t length, unsigned) {
    ++*static_cast<uint64_t*>(arg);
    benchmark::DoNotOptimize(data);
    return status::ok;
  }

  /// Progresses both until `*counter` reaches `target` (bounded; aborts when stuck).
  void wait_for(const uint64_t* counter, uint64_t target) {
    for (uint64_t spin = 0; *counter < target; ++spin) {
      if (spin > 100'000'000) std::abort();
      a->progress();
      b->progress();
    }
  }
};

/// A ping-pong of am_short: an 8-byte header and range(0) bytes of payload each way.
void bm_short_pingpong(benchmark::State& state) {
  pair p;
  const uint64_t value = 7;
  const std::vector<uint8_t> payload(static_cast<size_t>(state.range(0)), 0x5a);
  uint64_t rounds = 0;
  for (auto _ : state) {
    while (p.ab->am_short(1, &value, sizeof(value), payload.data(), payload.size()) !=
           status::ok) {
      p.a->progress();
    }
    p.wait_for(&p.at_b, ++rounds);
    while (p.ba->am_short(1, &value, sizeof(value), payload.data(), payload.size()) !=
           status::ok) {
      p.b->progress();
    }
    p.wait_for(&p.at_a, rounds);
  }
  state.SetItemsProcessed(static_cast<int64_t>(rounds));
}
BENCHMARK(bm_short_pingpong)->Arg(0)->Arg(4096);

struct bcopy_arg {
  const uint8_t* source;
  size_t length;
};

size_t pack_copy(void* dest, void* arg) {
  auto* a = static_cast<bcopy_arg*>(arg);
  std::memcpy(dest, a->source, a->length);
  return a->length;
}

void bm_bcopy_stream(benchmark::State& state) {
  pair p;
  std::vector<uint8_t> data(static_cast<size_t>(state.range(0)), 0x5a);
  bcopy_arg arg{data.data(), data.size()};
  uint64_t sent = 0;
  for (auto _ : state) {
    while (p.ab->am_bcopy(1, &pack_copy, &arg) < 0) {
      p.b->progress();
      p.a->progress();
    }
    ++sent;
  }
  p.wait_for(&p.at_b, sent);
  state.SetItemsProcessed(static_cast<int64_t>(sent));
  state.SetBytesProcessed(static_cast<int64_t>(sent * data.size()));
}
BENCHMARK(bm_bcopy_stream)->Arg(8)->Arg(4096)->Arg(65536);

void bm_zcopy_stream(benchmark::State& state) {
  pair p;
  std::vector<uint8_t> data(static_cast<size_t>(state.range(0)), 0x5a);
  const tl::iov entry{data.data(), data.size()};
  tl::completion done{nullptr, 1 << 30, status::ok};  // counts down, never reaches zero
  uint64_t sent = 0;
  for (auto _ : state) {
    while (p.ab->am_zcopy(1, nullptr, 0, &entry, 1, &done) != status::in_progress) {
      p.b->progress();
      p.a->progress();
    }
    ++sent;
  }
  p.wait_for(&p.at_b, sent);
  while (p.ab->flush(nullptr) != status::ok) {
    p.b->progress();
    p.a->progress();
  }
  state.SetItemsProcessed(static_cast<int64_t>(sent));
  state.SetBytesProcessed(static_cast<int64_t>(sent * data.size()));
}
BENCHMARK(bm_zcopy_stream)->Arg(65536)->Arg(1 << 20);

/// Copies a received message into the buffer at `arg` (a receive buffer, as the protocol layer's
/// software rendezvous did with every fragment it was pushed).
struct copy_out {
  uint8_t* dest;
  size_t filled = 0;
  uint64_t messages = 0;
  static status handle(void* arg, void* data, size_t length, unsigned) {
    auto* c = static_cast<copy_out*>(arg);
    std::memcpy(c->dest + c->filled, data, length);
    c->filled += length;
    ++c->messages;
    return status::ok;
  }
};

/// range(0) bytes moved the way a software rendezvous moves them: bcopy fragments of max_bcopy
/// packed from the source, copied out into the destination by the receiver's handler. The
/// baseline of bm_get.
void bm_pushed_fragments(benchmark::State& state) {
  pair p;
  const size_t size = static_cast<size_t>(state.range(0));
  const size_t fragment = p.a->attr().max_bcopy;
  std::vector<uint8_t> source(size, 0x5a), target(size);
  copy_out out{target.data()};
  p.b->set_am_handler(2, &copy_out::handle, &out);
  for (auto _ : state) {
    out.filled = 0;
    for (size_t offset = 0; offset < size; offset += fragment) {
      bcopy_arg arg{source.data() + offset, std::min(fragment, size - offset)};
      while (p.ab->am_bcopy(2, &pack_copy, &arg) < 0) {
        p.b->progress();
        p.a->progress();
      }
    }
    for (uint64_t spin = 0; out.filled < size; ++spin) {
      if (spin > 100'000'000) std::abort();
      p.b->progress();
      p.a->progress();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}
BENCHMARK(bm_pushed_fragments)->Arg(65536)->Arg(1 << 20)->Arg(4 << 20);

/// A registered region of `owner`, its key unpacked by `user`.
struct region {
  tl::iface& owner;
  tl::iface& user;
  std::vector<uint8_t> bytes;
  tl::mem_handle* handle = nullptr;
  tl::remote_key key;
  region(tl::iface& o, tl::iface& u, size_t size) : owner(o), user(u), bytes(size, 0x3c) {
    std::vector<uint8_t> packed;
    if (owner.memory_domain()->mem_reg(bytes.data(), size, &handle) != status::ok ||
        owner.memory_domain()->rkey_pack(handle, packed) != status::ok ||
        user.memory_domain()->rkey_unpack(packed.data(), packed.size(), &key) != status::ok) {
      std::abort();
    }
  }
  ~region() {
    user.memory_domain()->rkey_release(&key);
    owner.memory_domain()->mem_dereg(handle);
  }
  uint64_t address() const { return reinterpret_cast<uintptr_t>(bytes.data()); }
};

/// One get_zcopy (range(1) == 0) or put_zcopy of range(0) bytes at a time, as the rendezvous
/// protocol issues them: the data goes from the source memory to the socket and from the socket
/// into the target memory, no copy of ours.
void bm_rma(benchmark::State& state) {
  pair p;
  const size_t size = static_cast<size_t>(state.range(0));
  const bool put = state.range(1) != 0;
  region remote(*p.b, *p.a, size);
  std::vector<uint8_t> local(size, 0xa5);
  const tl::iov entry{local.data(), size};
  for (auto _ : state) {
    tl::completion done{nullptr, 1, status::ok};
    const status st = put ? p.ab->put_zcopy(&entry, 1, remote.address(), remote.key, &done)
                          : p.ab->get_zcopy(&entry, 1, remote.address(), remote.key, &done);
    if (st != status::in_progress) std::abort();
    for (uint64_t spin = 0; done.count != 0; ++spin) {
      if (spin > 100'000'000) std::abort();
      p.b->progress();
      p.a->progress();
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}
BENCHMARK(bm_rma)->ArgsProduct({{65536, 1 << 20, 4 << 20}, {0, 1}});

/// The number after `label` in `iface`'s info(), or -1.
long info_number(const tl::iface& iface, const std::string& label) {
  const std::string text = iface.info();
  const size_t at = text.find(label);
  return at == std::string::npos ? -1 : std::strtol(text.c_str() + at + label.size(), nullptr, 10);
}

/// Connect, handshake (range(0): with the key), one 8-byte message delivered, endpoint destroyed,
/// both sides say bye and close: what a short-lived peer costs.
void bm_connection_lifetime(benchmark::State& state) {
  const std::string key = state.range(0) != 0 ? "cluster secret" : "";
  auto a = open_iface(key);
  auto b = open_iface(key);
  uint64_t at_b = 0;
  b->set_am_handler(1, &pair::count, &at_b);
  const uint64_t value = 7;
  for (auto _ : state) {
    std::unique_ptr<tl::ep> ep;
    if (a->create_ep(b->device_address(), b->iface_address(), ep) != status::ok ||
        ep->am_short(1, &value, sizeof(value), nullptr, 0) != status::ok) {
      std::abort();
    }
    const uint64_t target = at_b + 1;
    for (uint64_t spin = 0; ; ++spin) {
      if (at_b >= target) break;  // at_b grows in b's handler, called from b->progress()
      if (spin > 100'000'000) std::abort();
      a->progress();
      b->progress();
    }
    ep.reset();
    // info() builds text: look at it only now and then.
    for (uint64_t spin = 0; (spin & 63) != 0 || info_number(*a, "connections ") != 0 ||
                            info_number(*b, "connections ") != 0;
         ++spin) {
      if (spin > 100'000'000) std::abort();
      a->progress();
      b->progress();
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bm_connection_lifetime)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
