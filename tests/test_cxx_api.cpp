// The C++ face (comm/result.hpp, bytes.hpp, flags.hpp, callback.hpp, operation.hpp and the owning
// handles): result<T> errors, byte spans, one flag type per kind of operation (a wrong kind does
// not compile), completions that capture (run exactly once, captures intact, no allocation), and
// ownership: an endpoint_ptr closes its endpoint (the peer sees it), an operation releases its
// request (nothing leaks, a running one is silenced), and every handle and operation outlives its
// worker safely. Runs over every transport present (verbs on the verbs test device, a software
// stand-in).
#define BOOST_TEST_MODULE cxx_api
#include "fixture.hpp"
#include "listener_fixture.hpp"
#include "test_util.hpp"

#include "rndv.hpp"

#include <array>
#include <chrono>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

// -- allocation counting -------------------------------------------------------------------------

namespace {
/// Counts the allocations of this thread while set (other threads, such as a resolver, are not
/// the operations under test).
thread_local bool counting_allocations = false;
thread_local size_t allocations = 0;
}  // namespace

[[gnu::noinline]] void* operator new(size_t size) {
  if (counting_allocations) ++allocations;
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

using namespace comm;
using namespace comm::test;

/// The suite's helpers (a named namespace: the test cases' lambdas capture them).
namespace cxx_test {

/// Requests of `w` not in its pool: held by the user or still running.
size_t requests_in_use(worker& w) {
  const detail::worker_impl& wi = detail::impl(w);
  return wi.request_chunks.size() * detail::worker_impl::request_chunk_size -
         wi.free_requests.size();
}

/// Progresses `p` until `o` is done (bounded); its final status, or timed_out.
status finish(worker_pair& p, operation& o) {
  if (!p.until([&] { return o.done(); })) return status::timed_out;
  return o.status();
}

/// Allocations made by `body` on this thread.
template <class Body>
size_t allocations_of(Body&& body) {
  allocations = 0;
  counting_allocations = true;
  body();
  counting_allocations = false;
  return allocations;
}

// -- compile-time checks: flag kinds, byte views, inline completions ------------------------------

template <class F>
concept put_takes = requires(endpoint& ep, const_bytes b, rkey& k, F f) {
  ep.put(b, 0, k, send_completion{}, f);
};
template <class F>
concept am_send_takes = requires(endpoint& ep, const_bytes b, F f) {
  ep.am_send(1, b, b, send_completion{}, f);
};
template <class F>
concept tag_send_takes = requires(endpoint& ep, const_bytes b, F f) {
  ep.tag_send(1, b, send_completion{}, f);
};
template <class A, class B>
concept combinable = requires(A a, B b) { a | b; };

static_assert(put_takes<rma_flags>);
static_assert(!put_takes<am_send_flags>, "an AM flag must not reach a put");
static_assert(!put_takes<send_flags>);
static_assert(!put_takes<uint32_t>, "raw request_flags bits are the low-level API's");
static_assert(am_send_takes<am_send_flags>);
static_assert(!am_send_takes<rma_flags>, "an RMA flag must not reach an active message");
static_assert(!am_send_takes<send_flags>);
static_assert(tag_send_takes<send_flags>);
static_assert(!tag_send_takes<am_send_flags>, "reply_endpoint means nothing to a tagged send");
static_assert(!tag_send_takes<stream_send_flags>);
static_assert(combinable<send_flags, send_flags>);
static_assert(!combinable<send_flags, am_send_flags>, "kinds of flags do not mix");
static_assert(!combinable<rma_flags, uint32_t>);
static_assert(((send_flags::force_zcopy | send_flags::force_rndv) & send_flags::force_rndv) ==
              send_flags::force_rndv);
static_assert(to_bits(am_send_flags::reply_endpoint) == request_reply_endpoint);
static_assert(to_bits(am_handler_flags::whole_msg | am_handler_flags::fetch_rndv) ==
              (am_flag_whole_msg | am_flag_fetch_rndv));

static_assert(std::is_constructible_v<const_bytes, std::vector<int>&>);
static_assert(std::is_constructible_v<const_bytes, const std::array<double, 3>&>);
static_assert(std::is_constructible_v<const_bytes, std::span<const int>>);
static_assert(!std::is_constructible_v<const_bytes, std::vector<int>>,
              "a temporary container would die before the operation completes");
static_assert(!std::is_constructible_v<const_bytes, std::vector<iov_entry>&>,
              "a list of iov entries is a gather list, not bytes");
static_assert(!std::is_constructible_v<const_bytes, std::vector<std::string>&>,
              "only trivially copyable values are bytes");
static_assert(std::is_constructible_v<mutable_bytes, std::vector<int>&>);
static_assert(!std::is_constructible_v<mutable_bytes, const std::vector<int>&>,
              "a receive cannot write into const data");

struct six_pointers {
  void* p[6];
};
struct seven_pointers {
  void* p[7];
};
static_assert(fits_inline_callback<decltype([x = six_pointers{}](status) { (void)x; })>);
static_assert(!std::is_constructible_v<send_completion,
                                       decltype([x = seven_pointers{}](status) { (void)x; })>,
              "a completion larger than six pointers is refused at compile time");
static_assert(!std::is_constructible_v<send_completion, decltype([](int, int) {})>,
              "a completion of the wrong signature is refused");
static_assert(!std::is_copy_constructible_v<operation> && std::is_move_constructible_v<operation>);
static_assert(std::is_copy_constructible_v<result<std::vector<uint8_t>>> &&
              !std::is_copy_constructible_v<result<endpoint_ptr>>,
              "a result copies as its value does");
static_assert(!std::is_copy_constructible_v<endpoint_ptr> &&
              std::is_nothrow_move_constructible_v<endpoint_ptr>);

/// What an AM handler of these tests saw.
struct am_seen {
  int calls = 0;
  std::vector<uint8_t> header;
  std::vector<uint8_t> data;
  bool reply_ep = false;
  bool rndv = false;
  worker* w = nullptr;                  ///< for fetching a rendezvous descriptor
  std::vector<uint32_t> fetched;        ///< where a descriptor's data goes
  operation fetch;                      ///< the fetch of it
  int fetch_calls = 0;
  status fetch_status = status::in_progress;
  size_t fetch_length = 0;
};

status on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
             const am_recv_params& params) {
  auto* seen = static_cast<am_seen*>(arg);
  ++seen->calls;
  const auto* h = static_cast<const uint8_t*>(header);
  seen->header.assign(h, h + header_length);
  seen->reply_ep = (params.attr & am_recv_reply_ep) != 0;
  seen->rndv = (params.attr & am_recv_rndv) != 0;
  if (seen->rndv) {
    seen->fetched.assign(length / sizeof(uint32_t), 0);
    seen->fetch = seen->w->am_recv_data(data, seen->fetched, [seen](status st, size_t n) {
      ++seen->fetch_calls;
      seen->fetch_status = st;
      seen->fetch_length = n;
    });
  } else {
    const auto* d = static_cast<const uint8_t*>(data);
    seen->data.assign(d, d + length);
  }
  return status::ok;
}

}  // namespace cxx_test

using namespace cxx_test;

// -- result<T> -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(results)

BOOST_DATA_TEST_CASE(factory_errors_say_why, each_transport(), transport) {
  worker_pair p(transport);
  auto bad_bytes = p.a->connect(std::vector<uint8_t>{1, 2, 3});
  BOOST_TEST(!bad_bytes);
  BOOST_TEST(bad_bytes.error() == status::invalid_addr);
  auto bad_host = p.a->connect(std::string("not an address"));
  BOOST_TEST(!bad_host);
  BOOST_TEST(bad_host.error() == status::invalid_addr);
  try {
    (void)bad_host.value();
    BOOST_ERROR("value() of an error returned");
  } catch (const bad_result_access& e) {
    BOOST_TEST(e.error() == status::invalid_addr);
  }
  auto nothing = p.b->mem_map(mutable_bytes{});
  BOOST_TEST(!nothing);
  BOOST_TEST(nothing.error() == status::invalid_param);
  std::vector<uint8_t> region(64);
  auto unknown_rights = p.b->mem_map(region, 1u << 20);
  BOOST_TEST(unknown_rights.error() == status::invalid_param);
  const std::array<uint64_t, 4> garbage{1, 2, 3, 4};
  auto key = p.ab->rkey_unpack(garbage);
  BOOST_TEST(key.error() == status::invalid_param);
  listener_params lp;
  lp.address = "999.1.2.3:0";
  auto l = p.a->listen(lp);
  BOOST_TEST(l.error() == status::invalid_addr);
  auto no_remote = p.b->mem_map(region, mem_local_read | mem_local_write);
  BOOST_REQUIRE(no_remote);
  BOOST_TEST(p.b->rkey_pack(**no_remote).error() == status::privileges_violation);
}

BOOST_DATA_TEST_CASE(factories_hand_out_owners, each_transport(), transport) {
  worker_pair p(transport);
  auto ep = p.a->connect(p.b->address());
  BOOST_REQUIRE(ep);
  BOOST_TEST(ep->get() != nullptr);
  std::vector<uint32_t> region(256, 7);
  auto mem = p.b->mem_map(region);
  BOOST_REQUIRE(mem);
  auto packed = p.b->rkey_pack(**mem);
  BOOST_REQUIRE(packed);
  BOOST_TEST(!packed->empty());
  BOOST_REQUIRE(p.until([&] { return worker_pair::wired(ep->get()); }));
  auto key = (*ep)->rkey_unpack(*packed);
  BOOST_REQUIRE(key);
  const remote_segment whole = (*ep)->rkey_segment(key->get());
  BOOST_TEST(whole.length == region.size() * sizeof(uint32_t));
}

BOOST_AUTO_TEST_SUITE_END()

// -- spans and flags -----------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(spans_and_flags)

BOOST_DATA_TEST_CASE(tagged_messages_from_any_contiguous_range, each_transport(), transport) {
  worker_pair p(transport);
  const std::array<uint32_t, 4> out{1, 2, 3, 0xdeadbeef};
  std::vector<uint32_t> in(4, 0);
  tag_recv_info got;
  int calls = 0;
  operation r = p.b->tag_recv(in, 11, tag_mask_full, [&](status st, const tag_recv_info& info) {
    BOOST_TEST(st == status::ok);
    got = info;
    ++calls;
  });
  operation s = p.ab->tag_send(11, out);
  BOOST_TEST(finish(p, s) == status::ok);
  BOOST_TEST(finish(p, r) == status::ok);
  BOOST_TEST(calls == 1);
  BOOST_TEST(got.length == sizeof(out));
  BOOST_TEST(got.sender_tag == 11u);
  BOOST_TEST(in == std::vector<uint32_t>(out.begin(), out.end()), boost::test_tools::per_element());

  // A message that arrived first completes the receive inside the call.
  const std::string text = "hello, span";
  operation s2 = p.ab->tag_send(12, text);
  BOOST_TEST(finish(p, s2) == status::ok);
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(12, tag_mask_full, nullptr); }));
  std::string back(text.size(), '\0');
  calls = 0;
  operation r2 = p.b->tag_recv(back, 12, tag_mask_full,
                               [&](status st, const tag_recv_info& info) {
                                 ++calls;
                                 got = info;
                                 BOOST_TEST(st == status::ok);
                               });
  BOOST_TEST(calls == 1);  // before the call returned
  BOOST_TEST(r2.done());
  BOOST_TEST(back == text);
  BOOST_TEST(got.length == text.size());

  // A gather list, and a receive through tag_probe's message.
  const std::vector<uint8_t> first = pattern(100, 3), second = pattern(50, 4);
  const std::array<iov_entry, 2> parts{iov_of(first), iov_of(second)};
  operation s3 = p.ab->tag_send_iov(13, parts);
  BOOST_TEST(finish(p, s3) == status::ok);
  message* msg = nullptr;
  BOOST_REQUIRE(p.until([&] { return p.b->tag_probe(13, tag_mask_full, nullptr, &msg); }));
  std::vector<uint8_t> whole(150);
  operation r3 = p.b->tag_recv_message(msg, whole);
  BOOST_TEST(finish(p, r3) == status::ok);
  BOOST_TEST(std::equal(first.begin(), first.end(), whole.begin()));
  BOOST_TEST(std::equal(second.begin(), second.end(), whole.begin() + 100));
}

BOOST_DATA_TEST_CASE(active_messages_header_data_and_flags, each_transport(), transport) {
  worker_pair p(transport);
  am_seen seen;
  seen.w = p.b.get();
  BOOST_REQUIRE(p.b->set_am_handler(5, on_am, &seen, am_handler_flags::whole_msg) == status::ok);
  const std::array<uint16_t, 3> header{7, 8, 9};
  const std::vector<uint8_t> data = pattern(300, 5);
  int sent = 0;
  operation s = p.ab->am_send(5, header, data, [&](status st) {
    BOOST_TEST(st == status::ok);
    ++sent;
  }, am_send_flags::reply_endpoint);
  BOOST_REQUIRE(p.until([&] { return seen.calls == 1 && s.done(); }));
  BOOST_TEST(sent == 1);
  BOOST_TEST(seen.reply_ep);
  BOOST_TEST(seen.header.size() == sizeof(header));
  BOOST_TEST(std::memcmp(seen.header.data(), header.data(), sizeof(header)) == 0);
  BOOST_TEST(seen.data == data, boost::test_tools::per_element());

  // Forced rendezvous: the handler gets a descriptor and fetches it with the C++ face's
  // am_recv_data, whose completion tells the length.
  const std::vector<uint32_t> big(2048, 0xabcdef01);
  operation r = p.ab->am_send(5, const_bytes{}, big, {}, am_send_flags::force_rndv);
  BOOST_REQUIRE(p.until([&] { return seen.fetch_calls == 1 && r.done(); }));
  BOOST_TEST(seen.rndv);
  BOOST_TEST(!seen.reply_ep);
  BOOST_TEST(r.status() == status::ok);
  BOOST_TEST(seen.fetch_status == status::ok);
  BOOST_TEST(seen.fetch_length == big.size() * sizeof(uint32_t));
  BOOST_TEST(seen.fetched == big, boost::test_tools::per_element());
}

BOOST_DATA_TEST_CASE(send_flags_choose_the_protocol, each_transport(), transport) {
  worker_pair p(transport);
  // Eight bytes go eager (done at once); forced to rendezvous they wait for the receiver.
  const uint64_t value = 42;
  operation eager = p.ab->tag_send(21, std::span(&value, 1));
  BOOST_TEST(eager.done());
  operation rndv = p.ab->tag_send(22, std::span(&value, 1), {}, send_flags::force_rndv);
  p.spin(100);
  BOOST_TEST(!rndv.done(), "a rendezvous send completes only once its receiver fetched it");
  uint64_t in = 0;
  operation r1 = p.b->tag_recv(std::span(&in, 1), 21, tag_mask_full);
  BOOST_TEST(finish(p, r1) == status::ok);
  operation r2 = p.b->tag_recv(std::span(&in, 1), 22, tag_mask_full);
  BOOST_TEST(finish(p, r2) == status::ok);
  BOOST_TEST(finish(p, rndv) == status::ok);
  BOOST_TEST(in == value);
}

BOOST_DATA_TEST_CASE(streams_take_spans, each_transport(), transport) {
  worker_pair p(transport);
  const std::string text = "0123456789abcdef";
  operation s = p.ab->stream_send(text);
  BOOST_TEST(finish(p, s) == status::ok);
  endpoint* partner = worker_pair::receiving_ep(*p.b, p.ab);
  BOOST_REQUIRE(partner != nullptr);
  std::array<char, 16> in{};
  size_t got = 0;
  int calls = 0;
  operation r = partner->stream_recv(in, [&](status st, size_t n) {
    BOOST_TEST(st == status::ok);
    got = n;
    ++calls;
  }, in.size());
  BOOST_TEST(finish(p, r) == status::ok);
  BOOST_TEST(calls == 1);
  BOOST_TEST(got == text.size());
  BOOST_TEST(std::string(in.begin(), in.end()) == text);
  std::array<stream_poll_entry, 4> ready{};
  BOOST_TEST(p.b->stream_poll(ready) == 0u);

  // A rendezvous stream send completes once the peer read it into its receive.
  const std::vector<uint8_t> big = pattern(200000, 12);
  int sent = 0;
  operation s2 = p.ab->stream_send(big, [&](status st) {
    BOOST_TEST(st == status::ok);
    ++sent;
  }, stream_send_flags::force_rndv);
  std::vector<uint8_t> big_in(big.size());
  operation r2 = partner->stream_recv(big_in, {}, big_in.size());
  BOOST_TEST(finish(p, r2) == status::ok);
  BOOST_TEST(finish(p, s2) == status::ok);
  BOOST_TEST(sent == 1);
  BOOST_TEST(big_in == big, boost::test_tools::per_element());
  operation empty = partner->stream_recv(mutable_bytes{}, [&](status st, size_t) {
    BOOST_TEST(st == status::invalid_param);
    ++calls;
  });
  BOOST_TEST(calls == 2);
  BOOST_TEST(empty.status() == status::invalid_param);
}

BOOST_DATA_TEST_CASE(rma_with_spans_keys_and_flags, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint64_t> remote(512);
  for (size_t i = 0; i < remote.size(); ++i) remote[i] = i * 3;
  memh_ptr mem = p.b->mem_map(remote).value();
  const std::vector<uint8_t> packed = p.b->rkey_pack(*mem).value();
  rkey_ptr key = p.ab->rkey_unpack(packed).value();
  const uint64_t base = reinterpret_cast<uintptr_t>(remote.data());

  std::vector<uint64_t> local(16);
  operation g = p.ab->get(local, base + 8 * sizeof(uint64_t), *key);
  BOOST_TEST(finish(p, g) == status::ok);
  for (size_t i = 0; i < local.size(); ++i) BOOST_TEST(local[i] == (i + 8) * 3);

  const std::array<uint64_t, 2> ones{111, 222};
  const std::array<uint64_t, 1> three{333};
  const std::array<iov_entry, 2> gather{iov_of(ones), iov_of(three)};
  int put_done = 0;
  operation w = p.ab->put(gather, base, *key, [&](status st) {
    BOOST_TEST(st == status::ok);
    ++put_done;
  }, rma_flags::fence);
  BOOST_TEST(finish(p, w) == status::ok);
  BOOST_TEST(put_done == 1);
  BOOST_TEST(remote[0] == 111u);
  BOOST_TEST(remote[2] == 333u);

  // The whole region into a buffer at least as long.
  std::vector<uint64_t> all(remote.size() + 4, 0);
  operation whole = p.ab->get(all, p.ab->rkey_segment(key.get()));
  BOOST_TEST(finish(p, whole) == status::ok);
  BOOST_TEST(all[1] == 222u);
  BOOST_TEST(all[3] == 9u);
  BOOST_TEST(all[remote.size() - 1] == (remote.size() - 1) * 3);
  BOOST_TEST(all[remote.size()] == 0u);  // past the segment: untouched

  // Suppressed: a success tells nobody, a failure still runs the completion.
  int told = 0;
  status why = status::ok;
  operation quiet = p.ab->put(std::span(&ones[0], 1), base, *key, [&](status st) {
    ++told;
    why = st;
  }, rma_flags::completion_suppressed);
  BOOST_TEST(quiet.done());
  operation flushed = p.ab->flush([&](status) {});
  BOOST_TEST(finish(p, flushed) == status::ok);
  BOOST_TEST(told == 0);
  operation wrong = p.ab->put(std::span(&ones[0], 1), base + remote.size() * 8 * 2, *key,
                              [&](status st) {
                                ++told;
                                why = st;
                              },
                              rma_flags::completion_suppressed);
  operation flushed2 = p.ab->flush([&](status) {});
  BOOST_TEST(finish(p, flushed2) != status::timed_out);
  BOOST_TEST(told == 1);
  BOOST_TEST(why == status::protection_error);
}

BOOST_AUTO_TEST_SUITE_END()

// -- completions ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(completions)

BOOST_DATA_TEST_CASE(run_once_with_captures_intact, each_transport(), transport) {
  worker_pair p(transport);
  auto token = std::make_shared<std::string>("captured by value");
  struct record {
    int calls = 0;
    std::string seen;
    uint64_t cookie = 0;
  } rec;
  const uint64_t cookie = 0x1234'5678'9abc'def0;
  std::vector<uint8_t> in(4096), out = pattern(4096, 9);
  {
    // A capture that is not trivially copyable (the shared_ptr): moved into the request and
    // destroyed once the completion ran.
    operation r = p.b->tag_recv(in, 31, tag_mask_full,
                                [token, cookie, r = &rec](status st, const tag_recv_info&) {
                                  ++r->calls;
                                  r->seen = *token;
                                  r->cookie = cookie;
                                  BOOST_TEST(st == status::ok);
                                });
    BOOST_TEST(token.use_count() == 2);
    operation s = p.ab->tag_send(31, out);
    BOOST_TEST(finish(p, r) == status::ok);
    BOOST_TEST(finish(p, s) == status::ok);
    BOOST_TEST(token.use_count() == 1, "the completion's captures go once it ran");
    p.spin(100);
  }
  BOOST_TEST(rec.calls == 1);
  BOOST_TEST(rec.seen == *token);
  BOOST_TEST(rec.cookie == cookie);
  BOOST_TEST(first_mismatch(in.data(), in.size(), 9) == -1);
}

BOOST_DATA_TEST_CASE(a_completion_may_reuse_its_operation, each_transport(), transport) {
  // The completion assigns a new receive to the very operation that ran it: the old request is
  // freed and reused from inside the callable, whose captures must survive that.
  worker_pair p(transport);
  std::vector<uint8_t> in(64);
  operation r;
  int received = 0;
  std::function<void()> post;
  post = [&] {
    r = p.b->tag_recv(in, 41, tag_mask_full, [&, again = &post](status st, const tag_recv_info&) {
      BOOST_TEST(st == status::ok);
      if (++received < 5) (*again)();
    });
  };
  post();
  for (int i = 0; i < 5; ++i) {
    const uint32_t v = i;
    operation s = p.ab->tag_send(41, std::span(&v, 1));
    BOOST_TEST(finish(p, s) == status::ok);
    BOOST_REQUIRE(p.until([&] { return received == i + 1; }));
  }
  BOOST_TEST(received == 5);
}

BOOST_DATA_TEST_CASE(completions_race_a_progress_thread, each_transport(), transport) {
  // b is a thread_mode::multi worker that another thread progresses all along, so a receive may
  // complete on that thread while the call that posted it is still binding its completion (the
  // inline tag_recv keeps the callable in the request after the low-level call returned). Each
  // completion must run once, on either thread, and its capture must be destroyed once.
  worker_params multi;
  multi.mode = thread_mode::multi;
  worker_pair p(transport, {}, {}, multi);
  auto token = std::make_shared<int>(7);
  std::atomic<int> completions{0};
  std::atomic<int> wrong{0};
  std::atomic<bool> stop{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  const auto in_time = [&] { return std::chrono::steady_clock::now() < deadline; };
  std::thread progress([&] {
    while (!stop.load(std::memory_order_relaxed) && in_time()) p.b->progress();
  });
  constexpr int rounds = 300;
  uint64_t in = 0;
  int done = 0;
  for (; done < rounds && in_time(); ++done) {
    const uint64_t value = 1000 + done;
    // Every other round the message is sent first, so that the receive may find it at once.
    operation s;
    if (done % 2 == 1) s = p.ab->tag_send(61, std::span(&value, 1));
    operation r = p.b->tag_recv(std::span(&in, 1), 61, tag_mask_full,
                                [&, token, value](status st, const tag_recv_info& info) {
                                  if (st != status::ok || info.length != sizeof(in) ||
                                      in != value || *token != 7) {
                                    ++wrong;
                                  }
                                  ++completions;
                                });
    if (done % 2 == 0) s = p.ab->tag_send(61, std::span(&value, 1));
    while (!(r.done() && s.done()) && in_time()) p.a->progress();
    if (!r.done() || r.status() != status::ok || in != value) break;
  }
  stop = true;
  progress.join();
  BOOST_TEST(done == rounds);
  BOOST_TEST(completions.load() == done);
  BOOST_TEST(wrong.load() == 0);
  BOOST_TEST(token.use_count() == 1, "every completion's captures were destroyed");
  BOOST_TEST(requests_in_use(*p.b) == 0u);
}

BOOST_DATA_TEST_CASE(no_allocation_per_operation, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint8_t> in(64), out = pattern(64, 2);
  struct tally {
    int sends = 0;
    int recvs = 0;
  } t;
  uint64_t extra[3] = {1, 2, 3};
  // Function-pointer path (the low-level API) and capturing path, same traffic.
  auto low_level = [&] {
    send_tracker st;
    recv_tracker rt;
    op r = p.b->tag_recv(in.data(), in.size(), 51, tag_mask_full, recv_params(rt));
    op s = p.ab->tag_send(51, out.data(), out.size(), send_params(st));
    BOOST_REQUIRE(p.finish(r) == status::ok);
    BOOST_REQUIRE(p.finish(s) == status::ok);
  };
  auto capturing = [&] {
    operation r = p.b->tag_recv(in, 51, tag_mask_full,
                                [&t, extra0 = extra[0], extra1 = extra[1], e = &extra[2]](
                                    status, const tag_recv_info&) {
                                  t.recvs += static_cast<int>(extra0 + extra1 - 2 + *e - 3);
                                });
    operation s = p.ab->tag_send(51, out, [&t](status) { ++t.sends; });
    BOOST_REQUIRE(finish(p, r) == status::ok);
    BOOST_REQUIRE(finish(p, s) == status::ok);
  };
  for (int i = 0; i < 50; ++i) {  // warm the pools up
    low_level();
    capturing();
  }
  constexpr int rounds = 200;
  const size_t low = allocations_of([&] {
    for (int i = 0; i < rounds; ++i) low_level();
  });
  t = {};
  const size_t captured = allocations_of([&] {
    for (int i = 0; i < rounds; ++i) capturing();
  });
  BOOST_TEST(t.sends == rounds);
  BOOST_TEST(t.recvs == rounds);
  BOOST_TEST_MESSAGE(transport << ": allocations for " << rounds << " send+receive pairs: "
                               << low << " (function pointers), " << captured
                               << " (capturing completions)");
  if (low != 0) {
    // The verbs test device (a software stand-in) models its queues with heap containers: its
    // own allocations vary from run to run and hide the completions'. Nothing to compare.
    BOOST_TEST_MESSAGE(transport << ": the transport allocates per message; not compared");
    return;
  }
  BOOST_TEST(captured == 0u, "a capturing completion allocates nothing");
}

BOOST_AUTO_TEST_SUITE_END()

// -- ownership -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(ownership)

BOOST_DATA_TEST_CASE(dropping_an_endpoint_closes_it, each_transport(), transport) {
  worker_pair p(transport);
  const size_t in_use = requests_in_use(*p.a);
  endpoint_ptr ep = p.a->connect(p.b->address()).value();
  BOOST_REQUIRE(p.until([&] { return worker_pair::wired(ep.get()); }));
  const uint32_t ours = detail::impl(*ep).id;
  detail::endpoint_impl* partner = worker_pair::receiving_ep(*p.b, ep.get());
  BOOST_REQUIRE(partner != nullptr);
  const uint32_t theirs = partner->id;
  const uint32_t send_value = 5;
  operation s = ep->tag_send(61, std::span(&send_value, 1));
  BOOST_TEST(finish(p, s) == status::ok);
  ep = endpoint_ptr();  // the close starts; nothing to wait for or release
  BOOST_TEST(!ep);
  BOOST_TEST(p.until([&] {
    return detail::impl(*p.b).find_ep(theirs) == nullptr &&
           detail::impl(*p.a).find_ep(ours) == nullptr;
  }), "the peer saw the close notice and released its endpoint");
  BOOST_TEST(requests_in_use(*p.a) == in_use, "the close's request went back to the pool");
  uint32_t got = 0;
  operation r = p.b->tag_recv(std::span(&got, 1), 61, tag_mask_full);
  BOOST_TEST(finish(p, r) == status::ok);  // what was sent before the close arrived
  BOOST_TEST(got == send_value);
}

BOOST_DATA_TEST_CASE(a_client_handle_tells_the_server, each_transport(), transport) {
  server srv(config_with({transport}));
  client cli(config_with({transport}));
  ep_events ce, se;
  std::vector<endpoint_ptr> accepted;
  srv.answer = [&](conn_request* r) {
    auto ep = srv.w->accept(r, params_for(se, "welcome"));
    BOOST_REQUIRE(ep);
    accepted.push_back(std::move(*ep));
  };
  auto made = cli.w->connect(srv.address(), params_for(ce, "hello"));
  BOOST_REQUIRE(made);
  endpoint_ptr ep = std::move(*made);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return ce.connects == 1 && se.connects == 1; }));
  int closed = 0;
  operation c = ep.close([&](status st) {
    BOOST_TEST(st == status::ok);
    ++closed;
  });
  BOOST_TEST(!ep);
  BOOST_REQUIRE(run(*srv.w, *cli.w, [&] { return c.done() && se.errors == 1; }));
  BOOST_TEST(closed == 1);
  BOOST_TEST(se.error == status::not_connected, "the server's endpoint was told of the close");
  BOOST_TEST(ce.errors == 0);
  accepted.clear();  // closing a failed endpoint releases it at once
  BOOST_TEST(run(*srv.w, *cli.w, [&] {
    return std::all_of(detail::impl(*srv.w).ep_table.begin(), detail::impl(*srv.w).ep_table.end(),
                       [](auto* e) { return e == nullptr; });
  }));
}

BOOST_DATA_TEST_CASE(dropping_an_operation_releases_it, each_transport(), transport) {
  auto p = std::make_unique<worker_pair>(transport);
  const size_t base_a = requests_in_use(*p->a), base_b = requests_in_use(*p->b);
  std::vector<uint8_t> in(64, 0);  // stays valid: a dropped receive still completes into it
  int recv_calls = 0;
  {
    operation r = p->b->tag_recv(in, 71, tag_mask_full,
                                 [&](status, const tag_recv_info&) { ++recv_calls; });
    BOOST_REQUIRE(!r.done());
    BOOST_TEST(requests_in_use(*p->b) == base_b + 1);
  }
  // A rendezvous send stays running until its receiver fetches it; drop it as well.
  const std::vector<uint8_t> big = pattern(64 * 1024, 8);
  int send_calls = 0;
  {
    operation s = p->ab->tag_send(72, big, [&](status) { ++send_calls; }, send_flags::force_rndv);
    p->spin(50);
    BOOST_REQUIRE(!s.done());
  }
  const std::vector<uint8_t> small = pattern(64, 7);
  operation s = p->ab->tag_send(71, small);
  std::vector<uint8_t> big_in(big.size());
  operation r = p->b->tag_recv(big_in, 72, tag_mask_full);
  BOOST_TEST(finish(*p, s) == status::ok);
  BOOST_TEST(finish(*p, r) == status::ok);
  s = operation();  // finished: their requests go back at once
  r = operation();
  BOOST_TEST(p->until([&] {
    return requests_in_use(*p->a) == base_a && requests_in_use(*p->b) == base_b;
  }), "the dropped operations' requests went back to the pools once they completed");
  BOOST_TEST(recv_calls == 0, "a dropped operation completes without its completion");
  BOOST_TEST(send_calls == 0);
  BOOST_TEST(first_mismatch(in.data(), in.size(), 7) == -1);  // it did complete
  BOOST_TEST(big_in == big, boost::test_tools::per_element());
  // A receive dropped while posted is cancelled at the worker's destruction: no leak reported.
  {
    operation posted = p->b->tag_recv(in, 79, tag_mask_full);
  }
  const std::string text = capture_stderr([&] { p.reset(); });
  BOOST_TEST(lines_with(text, "never released") == 0u, text);
}

BOOST_DATA_TEST_CASE(cancel_and_detach, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint8_t> in(64);
  int calls = 0;
  status told = status::ok;
  auto count = [&](status st, const tag_recv_info&) {
    ++calls;
    told = st;
  };
  operation forced = p.b->tag_recv(in, 81, tag_mask_full, count);
  BOOST_TEST(forced.cancel(cancel_mode::force) == status::ok);
  BOOST_TEST(forced.done());
  BOOST_TEST(forced.status() == status::canceled);
  BOOST_TEST(calls == 0);
  operation reported = p.b->tag_recv(in, 82, tag_mask_full, count);
  BOOST_TEST(reported.cancel() == status::ok);
  BOOST_TEST(reported.status() == status::canceled);
  BOOST_TEST(calls == 1);
  BOOST_TEST(told == status::canceled);
  BOOST_TEST(reported.cancel() == status::invalid_param);  // over already

  // Detached: the worker finishes it, and the completion still runs.
  const size_t base = requests_in_use(*p.b);
  operation detached = p.b->tag_recv(in, 83, tag_mask_full, count);
  detached.detach();
  BOOST_TEST(detached.done());
  const uint32_t v = 9;
  operation s = p.ab->tag_send(83, std::span(&v, 1));
  BOOST_TEST(finish(p, s) == status::ok);
  BOOST_TEST(p.until([&] { return calls == 2; }));
  BOOST_TEST(told == status::ok);
  BOOST_TEST(requests_in_use(*p.b) == base);

  // A timed-out wait leaves the operation running.
  operation slow = p.b->tag_recv(in, 84, tag_mask_full, count);
  BOOST_TEST(slow.wait(10) == status::timed_out);
  BOOST_TEST(!slow.done());
  operation s2 = p.ab->tag_send(84, std::span(&v, 1));
  BOOST_TEST(slow.wait(10000) == status::ok);
  BOOST_TEST(calls == 3);
  BOOST_TEST(finish(p, s2) == status::ok);
}

BOOST_DATA_TEST_CASE(everything_outlives_its_worker, each_transport(), transport) {
  auto p = std::make_unique<worker_pair>(transport);
  std::vector<uint8_t> in(64), region(4096);
  int calls = 0;
  status told = status::ok;
  operation r = p->b->tag_recv(in, 91, tag_mask_full, [&](status st, const tag_recv_info&) {
    ++calls;
    told = st;
  });
  endpoint_ptr ep = p->a->connect(p->b->address()).value();
  BOOST_REQUIRE(p->until([&] { return worker_pair::wired(ep.get()); }));
  memh_ptr mem = p->b->mem_map(region).value();
  const std::vector<uint8_t> packed = p->b->rkey_pack(*mem).value();
  rkey_ptr key = p->ab->rkey_unpack(packed).value();
  rkey_ptr key_on_ep = ep->rkey_unpack(packed).value();
  BOOST_REQUIRE(!r.done() && ep && mem && key && key_on_ep);
  p.reset();  // both workers go first
  BOOST_TEST(r.done());
  BOOST_TEST(r.status() == status::canceled);
  BOOST_TEST(calls == 1, "a running operation completes (canceled) when its worker goes");
  BOOST_TEST(told == status::canceled);
  BOOST_TEST(!ep);
  BOOST_TEST(!mem);
  BOOST_TEST(!key);
  BOOST_TEST(!key_on_ep);
}  // and destroying them touches nothing (the sanitizer build checks)

BOOST_DATA_TEST_CASE(a_key_goes_with_its_endpoint, each_transport(), transport) {
  worker_pair p(transport);
  std::vector<uint8_t> region(4096, 1);
  memh_ptr mem = p.b->mem_map(region).value();
  endpoint_ptr ep = p.a->connect(p.b->address()).value();
  BOOST_REQUIRE(p.until([&] { return worker_pair::wired(ep.get()); }));
  const std::vector<uint8_t> packed = p.b->rkey_pack(*mem).value();
  rkey_ptr key = ep->rkey_unpack(packed).value();
  BOOST_REQUIRE(key);
  operation c = ep.close();
  BOOST_TEST(finish(p, c) == status::ok);
  BOOST_TEST(p.until([&] { return !key; }), "the key was destroyed with its endpoint");
  mem.reset();
  BOOST_TEST(!mem);
  BOOST_TEST(detail::module_of<detail::rma_protocol>(detail::impl(*p.b)).regions().empty());
}

BOOST_AUTO_TEST_SUITE_END()
