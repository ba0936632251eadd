// The AM module: active messages. A send goes eager (the send engine, send.hpp, with
// ActiveMessage / ActiveMessageFirst headers and AM fragments) or by rendezvous (rndv.hpp). A
// message that arrives goes to the handler of its id, whole or fragment by fragment, with
// persistent data and a reply endpoint on request; a rendezvous AM is fetched into a block of
// ours once it fits under the AM receive limits (COMM_AM_RX_MAX_BYTES, COMM_AM_RX_EP_MAX_BYTES),
// waiting in order per endpoint until then.
#pragma once

#include "rndv.hpp"
#include "send.hpp"
#include "worker_impl.hpp"

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace comm::detail {

/// Wire ids of the AM module.
enum class am_msg : tl::am_id {
  single = 8,     ///< ActiveMessage: a whole message
  first = 9,      ///< ActiveMessageFirst: the first fragment of a message
  fragment = 10,  ///< FragmentMiddle: a later fragment
};

/// Wire flag of ActiveMessage.flags: the sender wants a reply endpoint passed to the handler.
inline constexpr uint16_t am_wire_reply_ep = 1u << 0;

/// State of an AM send.
struct am_send_state {
  send_progress send;        ///< the send engine's part
  rndv_send rndv;            ///< its rendezvous, when it goes that way
  uint16_t id = 0;           ///< its AM id
  uint16_t flags = 0;        ///< its wire flags
};

/// State of the receive of a rendezvous AM (made by the module; never the user's).
struct am_recv_state {
  uint16_t id = 0;           ///< its AM id
  uint16_t flags = 0;        ///< its wire flags
  size_t length = 0;         ///< bytes of the block it is fetched into (0: refused)
  rndv_fetch fetch;          ///< the fetch
};

/// A rendezvous AM waiting for room under the AM receive limits: fetched once earlier ones are
/// delivered.
struct deferred_am {
  rndv_announcement data;      ///< where its data is
  uint16_t id = 0;             ///< its AM id
  uint16_t flags = 0;          ///< its wire flags
  std::vector<uint8_t> header; ///< the user header
  size_t charged = 0;          ///< bytes counted against the unexpected limits while it waits
};

/// The AM module (see the top of this file).
class am_protocol final : public protocol {
public:
  am_protocol(worker_impl& w, unsigned index);
  ~am_protocol() noexcept override;
  std::string_view name() const noexcept override { return "am"; }

  /// A user handler.
  struct handler {
    am_callback cb = nullptr;
    void* arg = nullptr;
    unsigned flags = 0;
  };

  // -- for the public API (am.cpp) --
  /// Installs or removes the handler of `id` (worker::set_am_handler).
  status set_handler(uint16_t id, am_callback cb, void* arg, unsigned flags);
  /// Releases data a handler kept (worker::am_data_release).
  void release_data(void* data);
  /// Gives data a handler kept to the user for good (worker::am_data_detach).
  bool detach_data(void* data);
  /// Largest AM user header (worker::max_am_header).
  size_t max_header() const noexcept { return max_header_; }
  /// Data handlers keep (am_flag_persistent_data), by data pointer: its block.
  const std::unordered_map<void*, void*>& persistent_data() const noexcept { return persistent_; }
  /// Rendezvous AMs waiting for room, every endpoint's.
  size_t deferred() const noexcept { return deferred_; }

  // -- from the rendezvous module --
  /// A rendezvous AM from `ep`: fetched now, deferred until it fits, or refused when it never can.
  void on_announcement(endpoint_impl& ep, uint16_t id, uint16_t flags,
                       std::vector<uint8_t> header, rndv_announcement&& a);
  /// Drops the deferred AM `sreq` of `ep`, if any (its sender cancelled it).
  void drop_announcement(endpoint_impl& ep, uint64_t sreq);

  void forget_peer(endpoint_impl& ep, held_fate fate) override;
  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  void progress() override;
  void info(std::ostream& out) const override;

  // Long-lived header builders (one per header type, see comm/wire/codec.hpp).
  wire::header_writer<wire::schema::ActiveMessage> hdr_am;
  wire::header_writer<wire::schema::ActiveMessageFirst> hdr_am_first;

private:
  void on_single(const uint8_t* data, size_t length);
  void on_first(const uint8_t* data, size_t length);
  void on_fragment(const uint8_t* data, size_t length);
  /// The data of the next fragment of the message of `ep`.
  void take_fragment(endpoint_impl* ep, const uint8_t* data, size_t length);
  /// Frees what the fragmented message of `ep` holds and ends it.
  void drop_fragments(endpoint_impl& ep);
  /// The handler of AM `id`, or null.
  const handler* find_handler(uint16_t id) const {
    if (id < table_size) return table_[id].cb != nullptr ? &table_[id] : nullptr;
    auto it = handlers_.find(id);
    return it == handlers_.end() ? nullptr : &it->second;
  }
  /// Calls the handler of `id` with the message (or a fragment of it).
  void deliver(endpoint_impl* ep, uint16_t id, uint16_t wire_flags, const uint8_t* header,
               size_t header_length, uint8_t* data, size_t length, unsigned attr, size_t offset,
               size_t total, uint64_t msg_id, bool data_is_ours);
  /// Allocates the receive block of a rendezvous AM and fetches it.
  void fetch(endpoint_impl* ep, deferred_am& am);
  /// Ends the fetch of a rendezvous AM: delivers it, or drops it.
  static void fetched(request* req, status outcome);
  /// Refuses a rendezvous AM larger than the limit `variable` = `limit`: the sender's request
  /// completes with EXCEEDS_LIMIT, the endpoint stays up.
  void refuse(endpoint_impl* ep, const deferred_am& am, const char* variable, size_t limit);
  /// Asks for progress() while AMs wait.
  void deferred_changed() { want_progress(deferred_ != 0); }
  /// A block of at least `length` bytes aligned for AM handlers; null without memory.
  uint8_t* take_large(size_t length);
  /// Returns a block from take_large (kept for reuse within bounds, else comm::mem_free) or frees
  /// any other block (aligned_block's, std::free).
  void release_large(void* block);

  /// User handlers: ids below table_size in a flat table, the rest in a map.
  static constexpr uint16_t table_size = 256;
  handler table_[table_size];
  std::unordered_map<uint16_t, handler> handlers_;
  std::unordered_map<void*, void*> persistent_;  ///< data given to handlers -> block
  /// Rendezvous AM receive blocks kept for reuse. They come from comm::mem_alloc (shareable, so
  /// an echo of the block is a mapped copy for its next receiver) and go back with comm::mem_free;
  /// keeping a few here saves the shared heap's lock.
  struct large_block {
    void* block = nullptr;
    size_t capacity = 0;
  };
  std::vector<large_block> large_free_;           ///< blocks ready for reuse
  std::unordered_map<void*, size_t> large_out_;   ///< blocks handed out -> capacity
  size_t large_free_bytes_ = 0;                   ///< bytes held by large_free_
  size_t max_header_ = 0;                         ///< largest user header
  size_t deferred_ = 0;                           ///< rendezvous AMs waiting, all endpoints
  bool starting_deferred_ = false;                ///< inside progress()
};

}  // namespace comm::detail
