// Fuzzes libcomm's protocol handlers (libcomm/src: wireup, tag eager and fragments, active
// messages, rendezvous, RMA requests, streams) on a loopback worker, through the self transport: no
// seam.
//
// Each input gets fresh workers over the self transport only: A (the target) and B, connected to A,
// so A has an endpoint a forged message can name (a fresh worker's first endpoint has id 0x200000:
// slot 0, generation 2). A has posted a tagged receive, a stream receive on that endpoint, and has
// two AM handlers (one keeps its data). An interface of our own sends the input's records to A's
// self interface as raw transport active messages, for any AM id, impersonating B:
//
//   record = [am id: 1 byte] [length: 2 bytes, little endian] [length bytes: what the handler gets]
//
// A first byte with its high bit set sends the record through the transport's tag operations
// instead (what tag_offload.hpp reads: the sender word, fragments, the rendezvous header):
// 0x80-0x9f tag_eager_bcopy, 0xa0-0xbf tag_eager_zcopy, 0xc0-0xff tag_rndv_request, with the
// record's bytes as [tag: 8 bytes] [imm: 8 bytes, eager only] [data or header]; a zcopy sends its
// data (1 + the first data byte % 8) times over, in as many iov entries, so that it may arrive in
// fragments. A has tag matching from 256 bytes and an exact receive for tag 9 posted there.
//
// Then A must still work: a third worker C connects to A and a tagged message from C reaches a
// receive posted on A (messages the input left with the same tag may come first; it is looked for
// among as many receives as there were records), and C's stream bytes reach A's endpoint for C.
// Destroying the workers must release everything
// (LeakSanitizer) and close every descriptor but those the shared heap keeps (bounded).
#include <comm/context.hpp>
#include <comm/endpoint.hpp>
#include <comm/transport/transport.hpp>
#include <comm/worker.hpp>

#include "check.hpp"
#include "seeds.hpp"
#include "protocols.hpp"
#include "tag_offload.hpp"

#include "schema/wire.capnp.h"

#include <capnp/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using comm::fuzz::fail;
using comm::fuzz::require;

/// Progress rounds any exchange may take (the self transport needs a handful).
constexpr int max_rounds = 10000;
/// The tag of the health check's message.
constexpr comm::tag_t check_tag = 0x5eed;
/// The id of a fresh worker's first endpoint (slot 0, generation 2): A's endpoint for B.
constexpr uint32_t first_ep = 0x200000;

/// The AM id whose handler keeps its data (am_data_release after the input).
constexpr uint16_t keeping_am = 2;

/// The context of every worker: the self transport only.
comm::context& the_context() {
  static auto* ctx = [] {
    comm::config cfg;
    cfg.transports = {"self"};
    cfg.tm_thresh = 256;
    return new comm::context(cfg);
  }();
  return *ctx;
}

/// The self interface forged messages come from.
comm::tl::iface& injector() {
  static auto* made = [] {
    std::unique_ptr<comm::tl::iface> out;
    for (comm::tl::component* c : comm::tl::all_components()) {
      if (c->name() != "self") continue;
      comm::tl::iface_params params;
      params.device = c->devices().front();
      require(c->open(params, out) == comm::status::ok, "cannot open the injector");
    }
    require(out != nullptr, "no self transport");
    return out.release();
  }();
  return *made;
}

/// Descriptors of the process-wide shared heap (comm::mem_alloc) may outlive a worker: it keeps
/// its slabs and caches up to 64 freed large segments for reuse. Their number stays bounded.
constexpr size_t max_heap_fds = 128;

bool heap_fd(const std::string& target) { return target.rfind("/memfd:comm-heap", 0) == 0; }

/// Fails, naming them, when descriptors are open that were not at `before` (the heap's aside,
/// which must stay within max_heap_fds).
void check_no_new_fds(const std::map<int, std::string>& before) {
  bool leaked = false;
  size_t heap = 0;
  for (const auto& [fd, target] : comm::fuzz::open_fds()) {
    if (heap_fd(target)) {
      ++heap;
      continue;
    }
    if (before.count(fd) != 0 || target.rfind("/proc/", 0) == 0) continue;  // the listing's own
    std::fprintf(stderr, "fuzz_protocol: descriptor %d left open: %s\n", fd, target.c_str());
    leaked = true;
  }
  require(!leaked, "descriptors left open after the workers were destroyed");
  require(heap <= max_heap_fds, "the shared heap holds more segments than it caches");
}

/// An endpoint of the injector to the self interface named in worker address `address`.
std::unique_ptr<comm::tl::ep> endpoint_to(const std::vector<uint8_t>& address) {
  std::vector<capnp::word> words(address.size() / sizeof(capnp::word));
  std::memcpy(words.data(), address.data(), words.size() * sizeof(capnp::word));
  capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()));
  for (auto entry : reader.getRoot<comm::wire::schema::WorkerAddress>().getTransports()) {
    if (entry.getName() != "self") continue;
    const auto device = entry.getDevice();
    const auto iface = entry.getIface();
    std::unique_ptr<comm::tl::ep> ep;
    require(injector().create_ep({device.begin(), device.end()}, {iface.begin(), iface.end()},
                                 ep) == comm::status::ok,
            "cannot reach the worker's self interface");
    return ep;
  }
  fail("the worker has no self interface");
}

/// One progress call on each of `workers` and on the injector.
void progress(std::initializer_list<comm::worker*> workers) {
  for (comm::worker* w : workers) w->progress();
  injector().progress();
}

/// Connects `from` to `to` (the wireup completes as both progress).
comm::endpoint* connect(comm::worker& from, comm::worker& to) {
  comm::endpoint* ep = nullptr;
  require(from.connect(to.address(), &ep) == comm::status::ok, "cannot connect");
  return ep;
}

/// What a receive completed with.
struct received {
  bool done = false;
  comm::status st = comm::status::ok;
  comm::tag_recv_info info;
};

/// Receive callback: records what the receive completed with.
void on_received(comm::request*, comm::status st, const comm::tag_recv_info& info, void* arg) {
  auto* r = static_cast<received*>(arg);
  r->done = true;
  r->st = st;
  r->info = info;
}

/// Receives one message tagged check_tag on `w` into `buffer` (progressing `others` too).
received receive_one(comm::worker& w, std::initializer_list<comm::worker*> others, void* buffer,
                     size_t length) {
  received r;
  comm::request_params params;
  params.recv_cb = on_received;
  params.user_data = &r;
  params.recv_info = &r.info;
  comm::op o = w.tag_recv(buffer, length, check_tag, comm::tag_mask_full, params);
  if (o.done() || o.failed()) {
    r.done = true;
    r.st = o.st;
    return r;
  }
  for (int i = 0; i < max_rounds && !r.done; ++i) {
    w.progress();
    progress(others);
  }
  if (!r.done) {
    w.cancel(o.req, comm::cancel_mode::force);
    return r;
  }
  w.release(o.req);
  return r;
}

/// A still works: a new worker connects to it and its tagged message arrives intact.
void check_still_working(comm::worker& a, comm::worker& b, size_t records) {
  auto c = comm::worker::create(the_context()).value();
  comm::endpoint* to_a = connect(*c, a);
  std::array<uint8_t, 64> sent;
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<uint8_t>(0xa5 ^ i);
  comm::op s = to_a->tag_send(check_tag, sent.data(), sent.size());
  require(!s.failed(), "the health check's send failed");
  bool found = false;
  for (size_t i = 0; i <= records + 1 && !found; ++i) {
    std::array<uint8_t, 64> got{};
    const received r = receive_one(a, {&b, c.get()}, got.data(), got.size());
    if (!r.done) break;
    found = r.st == comm::status::ok && r.info.length == sent.size() && got == sent;
  }
  require(found, "the worker no longer receives a new peer's message");
  if (s.pending()) {
    for (int i = 0; i < max_rounds && c->request_status(s.req) == comm::status::in_progress; ++i) {
      progress({&a, &b, c.get()});
    }
    c->release(s.req);
  }
}

/// A still receives streams: C's bytes arrive whole on A's endpoint for C.
void check_stream_still_working(comm::worker& a, comm::worker& b) {
  auto c = comm::worker::create(the_context()).value();
  comm::endpoint* to_a = connect(*c, a);
  const char sent[] = "stream check";
  comm::op s = to_a->stream_send(sent, sizeof sent);
  require(!s.failed(), "the stream check's send failed");
  comm::endpoint* from_c = nullptr;
  for (int i = 0; i < max_rounds && from_c == nullptr; ++i) {
    progress({&a, &b, c.get()});
    comm::stream_poll_entry ready[4];
    const size_t n = a.stream_poll(ready, 4);
    for (size_t k = 0; k < n; ++k) {
      if (ready[k].ep->peer_uid() == c->uid() && ready[k].length == sizeof sent) {
        from_c = ready[k].ep;
      }
    }
  }
  require(from_c != nullptr, "the worker no longer takes a new peer's stream");
  char got[sizeof sent] = {};
  size_t n = 0;
  require(from_c->stream_recv(got, sizeof got, sizeof got, &n).done() &&
              std::memcmp(got, sent, sizeof sent) == 0,
          "a new peer's stream bytes arrived altered");
  if (s.pending()) {
    for (int i = 0; i < max_rounds && c->request_status(s.req) == comm::status::in_progress; ++i) {
      progress({&a, &b, c.get()});
    }
    c->release(s.req);
  }
}

/// AM handler that keeps persistent data (released after the input).
comm::status keep_data(void* arg, const void*, size_t, void* data, size_t,
                       const comm::am_recv_params& params) {
  auto* kept = static_cast<std::vector<void*>*>(arg);
  if (!(params.attr & comm::am_recv_data_persistent)) return comm::status::ok;
  kept->push_back(data);
  return comm::status::in_progress;
}

/// AM handler that takes the message and keeps nothing.
comm::status drop_data(void*, const void*, size_t, void*, size_t, const comm::am_recv_params&) {
  return comm::status::ok;
}

/// The first 8 bytes at `data` (fewer: zero-filled) as a little-endian number.
uint64_t word_at(const uint8_t* data, size_t length) {
  uint64_t value = 0;
  for (size_t i = 0; i < 8 && i < length; ++i) value |= uint64_t{data[i]} << (8 * i);
  return value;
}

/// Sends one record through the injector's tag operations (see the top of this file); false
/// while the transport has no room. A zcopy's completion is `done`, which the caller waits for.
bool send_tagged(comm::tl::ep& target, uint8_t kind, const uint8_t* data, size_t length,
                 comm::tl::completion* done) {
  const uint64_t tag = word_at(data, length);
  const size_t skip_tag = std::min<size_t>(8, length);
  data += skip_tag;
  length -= skip_tag;
  if (kind >= 0xc0) return target.tag_rndv_request(tag, data, length) != comm::status::no_resource;
  const uint64_t imm = word_at(data, length);
  const size_t skip_imm = std::min<size_t>(8, length);
  data += skip_imm;
  length -= skip_imm;
  if (kind < 0xa0) {
    struct chunk {
      const uint8_t* bytes;
      size_t length;
    } payload{data, length};
    auto pack = [](void* dest, void* arg) {
      auto* c = static_cast<chunk*>(arg);
      std::memcpy(dest, c->bytes, c->length);
      return c->length;
    };
    const ssize_t n = target.tag_eager_bcopy(tag, imm, pack, &payload);
    return n != static_cast<ssize_t>(comm::status::no_resource);
  }
  const size_t copies = 1 + (length != 0 ? data[0] % 8 : 0);
  comm::tl::iov entries[8];
  for (size_t i = 0; i < copies; ++i) entries[i] = {data, length};
  *done = comm::tl::completion{nullptr, 1, comm::status::ok};
  const comm::status st = target.tag_eager_zcopy(tag, imm, entries, copies, done);
  if (st != comm::status::in_progress) done->count = 0;
  return st != comm::status::no_resource;
}

/// Sends the input's records to `target` from the injector, progressing the workers after each.
size_t inject(comm::tl::ep& target, const uint8_t* data, size_t size,
              std::initializer_list<comm::worker*> workers) {
  const size_t max_bcopy = injector().attr().max_bcopy;
  size_t records = 0;
  while (size >= 3) {
    const comm::tl::am_id id = data[0] % comm::tl::am_id_count;
    size_t length = data[1] | (size_t{data[2]} << 8);
    data += 3;
    size -= 3;
    length = std::min({length, size, max_bcopy});
    struct chunk {
      const uint8_t* bytes;
      size_t length;
    } payload{data, length};
    auto pack = [](void* dest, void* arg) {
      auto* c = static_cast<chunk*>(arg);
      std::memcpy(dest, c->bytes, c->length);
      return c->length;
    };
    if (data[-3] & 0x80) {
      comm::tl::completion done{nullptr, 0, comm::status::ok};
      for (int i = 0; i < max_rounds && !send_tagged(target, data[-3], data, length, &done); ++i) {
        progress(workers);
      }
      for (int i = 0; i < max_rounds && done.count > 0; ++i) progress(workers);
    } else {
      for (int i = 0; i < max_rounds && target.am_bcopy(id, pack, &payload) < 0; ++i) {
        progress(workers);
      }
    }
    for (int i = 0; i < 4; ++i) progress(workers);
    data += length;
    size -= length;
    ++records;
  }
  return records;
}

/// One input: fresh workers, the forged records, the health check.
void run(const uint8_t* data, size_t size) {
  auto a = comm::worker::create(the_context()).value();
  auto b = comm::worker::create(the_context()).value();
  connect(*b, *a);
  for (int i = 0; i < 8; ++i) progress({a.get(), b.get()});
  std::vector<void*> kept;
  require(a->set_am_handler(1, drop_data, nullptr) == comm::status::ok &&
              a->set_am_handler(keeping_am, keep_data, &kept,
                                comm::am_flag_persistent_data) == comm::status::ok,
          "cannot set AM handlers");
  std::vector<uint8_t> posted(4096);
  comm::op r = a->tag_recv(posted.data(), posted.size(), 7, 0xff);
  // An exact receive the worker hands to its interface's tag matching.
  std::vector<uint8_t> offloaded(4096);
  comm::op ro = a->tag_recv(offloaded.data(), offloaded.size(), 9, comm::tag_mask_full);
  // A stream receive waiting on A's endpoint for B: forged stream bytes go into it first.
  std::vector<uint8_t> stream_posted(4096);
  comm::endpoint* a_for_b = comm::detail::impl(*a).find_ep(first_ep);
  comm::op sr{};
  if (a_for_b != nullptr) {
    sr = a_for_b->stream_recv(stream_posted.data(), stream_posted.size(), 3000, nullptr);
  }
  const size_t records = [&] {
    std::unique_ptr<comm::tl::ep> to_a = endpoint_to(a->address());
    return inject(*to_a, data, size, {a.get(), b.get()});
  }();
  check_still_working(*a, *b, records);
  check_stream_still_working(*a, *b);
  for (void* d : kept) a->am_data_release(d);
  if (sr.pending()) {
    if (a->request_status(sr.req) == comm::status::in_progress) {
      a->cancel(sr.req, comm::cancel_mode::force);
    } else {
      a->release(sr.req);
    }
  }
  for (comm::op* o : {&r, &ro}) {
    if (!o->pending()) continue;
    if (a->request_status(o->req) == comm::status::in_progress) {
      a->cancel(o->req, comm::cancel_mode::force);
    } else {
      a->release(o->req);  // a forged message completed it
    }
  }
}

// -- seeds -----------------------------------------------------------------------------------------

using comm::fuzz::flat;
using comm::fuzz::seed;
namespace wire = comm::wire::schema;

/// Appends one record: the AM id, the length, the bytes.
void append_record(seed& out, uint8_t id, const seed& bytes) {
  out.push_back(id);
  out.push_back(static_cast<uint8_t>(bytes.size()));
  out.push_back(static_cast<uint8_t>(bytes.size() >> 8));
  out.insert(out.end(), bytes.begin(), bytes.end());
}

/// A data-only header filled by `fill`, followed by `payload` bytes of a pattern.
template <class Struct, class Fill>
seed header_then(Fill fill, size_t payload) {
  comm::wire::header_writer<Struct> writer;
  fill(writer.fields());
  seed out;
  comm::fuzz::append(out, writer.bytes(), writer.size());
  for (size_t i = 0; i < payload; ++i) out.push_back(static_cast<uint8_t>('a' + i % 26));
  return out;
}

/// A rendezvous announcement of 100000 bytes for A's posted receive.
seed rts() {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::RndvRts>();
  r.setDstEp(first_ep);
  r.setTag(7);
  r.setSreqId(5);
  r.setLength(100000);
  r.setAddress(0x10000);
  const uint8_t key[48] = {0x73, 0x6c, 0x72, 0x6b, 2};
  r.setRkey(kj::arrayPtr(key, sizeof(key)));
  return flat(message);
}

/// A rendezvous announcement of 100000 stream bytes for A's endpoint (its stream receive), with a
/// key that does not unpack: the read fails.
seed stream_rts() {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::RndvRts>();
  r.setDstEp(first_ep);
  r.setIsStream(true);
  r.setSreqId(6);
  r.setLength(100000);
  r.setAddress(0x10000);
  const uint8_t key[48] = {0x73, 0x6c, 0x72, 0x6b, 2};
  r.setRkey(kj::arrayPtr(key, sizeof(key)));
  return flat(message);
}

/// A wireup request carrying a worker address.
seed wireup_request() {
  capnp::MallocMessageBuilder address;
  auto a = address.initRoot<wire::WorkerAddress>();
  a.setUid(99);
  a.setName("peer");
  auto t = a.initTransports(1)[0];
  t.setName("self");
  const uint8_t bytes[20] = {1};
  t.setDevice(kj::arrayPtr(bytes, 20));
  t.setIface(kj::arrayPtr(bytes, 8));
  const seed packed = flat(address);
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<wire::WireupRequest>();
  r.setSrcEp(first_ep);
  r.setAddress(kj::arrayPtr(packed.data(), packed.size()));
  return flat(message);
}

namespace P = comm::detail;

/// The wire id of a protocol module's message kind.
template <class Id>
constexpr uint8_t id(Id p) {
  return comm::detail::wire_id(p);
}

/// One record of every protocol message, addressed to A's endpoint for B.
std::vector<std::pair<uint8_t, seed>> protocol_records() {
  std::vector<std::pair<uint8_t, seed>> r;
  auto dst = [](auto f) { f.setDstEp(first_ep); };
  r.push_back({id(P::wireup_msg::request), wireup_request()});
  r.push_back({id(P::wireup_msg::reply), header_then<wire::WireupReply>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setSrcEp(first_ep);
               }, 0)});
  r.push_back({id(P::wireup_msg::close), header_then<wire::EndpointClose>(dst, 0)});
  r.push_back({id(P::tag_msg::eager), header_then<wire::TagEager>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setTag(7);
               }, 32)});
  r.push_back({id(P::tag_msg::eager_imm), header_then<wire::TagEagerImm>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setTag(0x5eed);
                 f.setImm(3);
               }, 64)});
  r.push_back({id(P::tag_msg::eager_first), header_then<wire::TagEagerFirst>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setTag(7);
                 f.setMsgId(1);
                 f.setTotalLength(100);
               }, 40)});
  r.push_back({id(P::tag_msg::fragment), header_then<wire::FragmentMiddle>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setMsgId(1);
                 f.setOffset(40);
               }, 60)});
  r.push_back({id(P::am_msg::single), header_then<wire::ActiveMessage>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setAmId(2);
                 f.setHeaderLength(4);
               }, 24)});
  r.push_back({id(P::am_msg::first), header_then<wire::ActiveMessageFirst>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setAmId(1);
                 f.setHeaderLength(4);
                 f.setMsgId(2);
                 f.setTotalLength(50);
               }, 20)});
  r.push_back({id(P::am_msg::fragment), header_then<wire::FragmentMiddle>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setMsgId(2);
                 f.setOffset(16);
               }, 34)});
  r.push_back({id(P::rndv_msg::rts), rts()});
  r.push_back({id(P::rndv_msg::ats), header_then<wire::RndvAts>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setSreqId(5);
               }, 0)});
  r.push_back({id(P::rndv_msg::rtr), header_then<wire::RndvRtr>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setSreqId(5);
                 f.setRreqId(6);
                 f.setLength(1000);
               }, 0)});
  r.push_back({id(P::rndv_msg::data), header_then<wire::RndvData>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setRreqId(6);
               }, 100)});
  r.push_back({id(P::rndv_msg::cancel), header_then<wire::RndvCancel>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setSreqId(5);
               }, 0)});
  r.push_back({id(P::rma_msg::request), header_then<wire::RmaRequest>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setIsGet(true);
                 f.setReqId(1);
                 f.setToken(1);
                 f.setAddress(0x10000);
                 f.setLength(64);
               }, 0)});
  r.push_back({id(P::rma_msg::reply), header_then<wire::RmaReply>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setReqId(1);
               }, 64)});
  r.push_back({id(P::rndv_msg::refuse), header_then<wire::RndvRefuse>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setRreqId(6);
               }, 0)});
  r.push_back({id(P::tag_msg::credit), header_then<wire::TagCredit>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setBytes(1u << 20);
               }, 0)});
  r.push_back({id(P::stream_msg::data), header_then<wire::StreamData>(dst, 40)});
  r.push_back({id(P::stream_msg::first), header_then<wire::StreamFirst>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setMsgId(3);
                 f.setTotalLength(5000);
               }, 100)});
  r.push_back({id(P::stream_msg::fragment), header_then<wire::FragmentMiddle>([](auto f) {
                 f.setDstEp(first_ep);
                 f.setMsgId(3);
                 f.setOffset(100);
               }, 900)});
  // Through tag operations (high bit of the record's first byte), from B's endpoint on A.
  const uint64_t sender = comm::detail::tm_sender_word(first_ep);
  auto tagged = [](uint64_t tag, const uint64_t* imm, size_t payload, uint8_t first) {
    seed out;
    comm::fuzz::append(out, &tag, sizeof tag);
    if (imm != nullptr) comm::fuzz::append(out, imm, sizeof *imm);
    for (size_t i = 0; i < payload; ++i) out.push_back(i == 0 ? first : uint8_t('a' + i % 26));
    return out;
  };
  const uint64_t stranger = 3;
  r.push_back({0x80, tagged(9, &sender, 300, 0)});          // into the offloaded receive
  r.push_back({0x80, tagged(7, &sender, 100, 0)});          // into the wildcard receive
  r.push_back({0x80, tagged(0x5eed, &stranger, 64, 0)});    // names no sender
  r.push_back({0xa0, tagged(0x77, &sender, 3000, 7)});      // unexpected, in fragments
  r.push_back({0xa0, tagged(9, &sender, 600, 1)});          // into the offloaded receive
  seed rndv = tagged(0x66, nullptr, 0, 0);
  const seed header = header_then<wire::TagOffloadRndv>([](auto f) {
    f.setDstEp(first_ep);
    f.setSreqId(5);
  }, 0);
  rndv.insert(rndv.end(), header.begin(), header.end());
  r.push_back({0xc0, rndv});                                // unexpected rendezvous of 0 bytes
  rndv[0] = 9;
  r.push_back({0xc0, rndv});                                // a request the transport matches
  r.push_back({id(P::rndv_msg::rts), stream_rts()});
  return r;
}

/// Seeds: each protocol message alone, then all of them in one input.
std::vector<seed> make_seeds() {
  std::vector<seed> seeds;
  seed all;
  for (const auto& [id, bytes] : protocol_records()) {
    seed one;
    append_record(one, id, bytes);
    seeds.push_back(one);
    all.insert(all.end(), one.begin(), one.end());
  }
  seeds.push_back(all);
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  comm::fuzz::write_seeds_if_asked(make_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  the_context();
  injector();
  const auto baseline = comm::fuzz::open_fds();
  run(data, size);
  check_no_new_fds(baseline);
  return 0;
}
