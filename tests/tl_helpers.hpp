// Helpers the transport suites share (test_conformance and test_transport_<name>): connecting
// endpoints, recording delivered messages with their AM id, counting completions, a parked
// am_short and a log of what the error handler was told.
#pragma once

#include <comm/transport/transport.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace comm::test {

/// Creates an endpoint from `from` to the interface at `device`/`address`; throws on failure.
inline std::unique_ptr<tl::ep> connect(tl::iface& from, const std::vector<uint8_t>& device,
                                       const std::vector<uint8_t>& address) {
  std::unique_ptr<tl::ep> ep;
  const status st = from.create_ep(device, address, ep);
  if (st != status::ok) throw std::runtime_error(std::string("create_ep: ") + to_string(st));
  return ep;
}

/// Creates an endpoint from `from` to `to` (same process); throws on failure.
inline std::unique_ptr<tl::ep> connect(tl::iface& from, tl::iface& to) {
  return connect(from, to.device_address(), to.iface_address());
}

/// The first 8 bytes of `bytes` as a sequence number, or all ones when shorter.
inline uint64_t sequence_of(const std::vector<uint8_t>& bytes) {
  uint64_t seq = ~uint64_t{0};
  if (bytes.size() >= sizeof(seq)) std::memcpy(&seq, bytes.data(), sizeof(seq));
  return seq;
}

/// Records every message delivered to the ids it is installed on, with its id, in arrival order.
struct recorder {
  /// One delivered message.
  struct message {
    tl::am_id id;
    std::vector<uint8_t> bytes;
  };
  std::vector<message> messages;
  bool misaligned = false;  ///< set when a handler was given data not aligned to 8 bytes

  /// Installs this recorder as the handler of `id` on `iface`.
  void install(tl::iface& iface, tl::am_id id) {
    slots_.push_back(std::make_unique<slot>(slot{this, id}));
    iface.set_am_handler(id, &handler, slots_.back().get());
  }
  /// Number of messages recorded.
  size_t size() const { return messages.size(); }
  /// True when every message carries its index as sequence number.
  bool in_sequence() const {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (sequence_of(messages[i].bytes) != i) return false;
    }
    return true;
  }

private:
  struct slot {
    recorder* owner;
    tl::am_id id;
  };
  static status handler(void* arg, void* data, size_t length, unsigned) {
    auto* s = static_cast<slot*>(arg);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) s->owner->misaligned = true;
    const auto* p = static_cast<const uint8_t*>(data);
    s->owner->messages.push_back({s->id, std::vector<uint8_t>(p, p + length)});
    return status::ok;
  }
  std::vector<std::unique_ptr<slot>> slots_;
};

/// Keeps every message delivered with am_flag_desc (returning in_progress) while `keep` is set, and
/// checks every message against what `expected(seq)` says the message with that sequence number
/// (its first 8 bytes) holds.
struct desc_keeper {
  /// A kept descriptor: the transport's pointer and a copy of its bytes at delivery.
  struct kept_desc {
    void* data;
    std::vector<uint8_t> copy;
  };
  std::vector<kept_desc> kept;
  std::function<std::vector<uint8_t>(uint64_t seq)> expected;  ///< the bytes of message `seq`
  bool keep = true;          ///< keep what comes as a descriptor
  uint64_t delivered = 0;    ///< messages seen
  uint64_t flagged = 0;      ///< of them, with am_flag_desc
  uint64_t wrong = 0;        ///< messages whose bytes were not what expected() says
  uint64_t out_of_order = 0; ///< messages whose sequence number was not the next one
  bool misaligned = false;   ///< a message was not 8-byte aligned

  /// Installs this keeper as the handler of `id` on `iface`.
  void install(tl::iface& iface, tl::am_id id) { iface.set_am_handler(id, &handler, this); }

  /// True when every kept descriptor still holds the bytes it was delivered with.
  bool kept_intact() const {
    for (const kept_desc& d : kept) {
      if (std::memcmp(d.data, d.copy.data(), d.copy.size()) != 0) return false;
    }
    return true;
  }

  /// Releases every kept descriptor to `iface`.
  void release_all(tl::iface& iface) {
    for (const kept_desc& d : kept) iface.release_am_desc(d.data);
    kept.clear();
  }

private:
  static status handler(void* arg, void* data, size_t length, unsigned flags) {
    auto* self = static_cast<desc_keeper*>(arg);
    const auto* p = static_cast<const uint8_t*>(data);
    std::vector<uint8_t> bytes(p, p + length);
    if (reinterpret_cast<uintptr_t>(data) % 8 != 0) self->misaligned = true;
    if (sequence_of(bytes) != self->delivered) ++self->out_of_order;
    if (bytes != self->expected(sequence_of(bytes))) ++self->wrong;
    ++self->delivered;
    if ((flags & tl::am_flag_desc) == 0) return status::ok;
    ++self->flagged;
    if (!self->keep) return status::ok;
    self->kept.push_back({data, std::move(bytes)});
    return status::in_progress;
  }
};

/// A completion that counts its calls and may run a check when called.
struct completion_probe : tl::completion {
  int calls = 0;
  std::function<void()> on_call;  ///< run on every call, when set
  completion_probe() {
    count = 1;
    func = [](tl::completion* self) {
      auto* probe = static_cast<completion_probe*>(self);
      ++probe->calls;
      if (probe->on_call) probe->on_call();
    };
  }
};

/// A parked am_short on id 1 carrying a sequence number; counts how often it was dispatched.
struct numbered_send : tl::pending_req {
  tl::ep* ep = nullptr;
  uint64_t seq = 0;
  int calls = 0;
  numbered_send() {
    func = [](tl::pending_req* self) {
      auto* req = static_cast<numbered_send*>(self);
      ++req->calls;
      return req->ep->am_short(1, &req->seq, sizeof(req->seq), nullptr, 0);
    };
  }
};

/// Records what the error handler was told.
struct failure_log {
  /// One call of the error handler.
  struct entry {
    tl::ep* ep;
    status reason;
  };
  std::vector<entry> entries;
  /// When set, the endpoint the handler destroys if it is the failed one (allowed by the API).
  std::unique_ptr<tl::ep>* destroy = nullptr;

  /// Installs this log as the error handler of `iface`.
  void install(tl::iface& iface) { iface.set_error_handler(&handler, this); }

private:
  static void handler(void* arg, tl::ep* ep, status reason) {
    auto* log = static_cast<failure_log*>(arg);
    log->entries.push_back({ep, reason});
    if (log->destroy != nullptr && log->destroy->get() == ep) log->destroy->reset();
  }
};

}  // namespace comm::test
