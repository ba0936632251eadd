// The AM module: active messages. A send goes eager (the send engine, send.hpp, with
// ActiveMessage / ActiveMessageFirst headers and AM fragments) or by rendezvous (rndv.hpp). A
// message that arrives goes to the handler of its id, whole or fragment by fragment, with
// persistent data and a reply endpoint on request. A rendezvous AM reaches its handler as a
// descriptor (am_recv_rndv, as UCP does): the receiver fetches it into its own buffer
// (worker::am_recv_data) or drops it unread (worker::am_data_release, the sender completes), in
// the handler or later. A handler installed with am_flag_fetch_rndv gets it fetched into a block
// of ours instead, once it fits under the AM receive limits (COMM_AM_RX_MAX_BYTES,
// COMM_AM_RX_EP_MAX_BYTES), waiting in order per endpoint until then. What handlers keep past
// their call is bounded by COMM_AM_HELD_MAX and COMM_AM_HELD_MAX_BYTES.
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

/// State of a worker::am_recv_data of a rendezvous AM into the user's buffer.
struct am_data_state {
  rndv_fetch fetch;                    ///< the fetch
  am_recv_data_callback cb = nullptr;  ///< the user's completion
  size_t length = 0;                   ///< bytes of the message
  size_t written = 0;                  ///< bytes it fills in the user's buffer
};

/// A rendezvous AM given to a handler as a descriptor (am_recv_rndv): where its data is, until
/// the receiver fetches or releases it.
struct am_desc {
  endpoint_impl* ep = nullptr;  ///< endpoint back to the sender; null once it failed or went away
  status gone = status::ok;     ///< why `ep` is null
  rndv_announcement data;       ///< where the data is
  bool kept = false;            ///< its handler returned in_progress (counts as held)
  bool cancelled = false;       ///< the sender cancelled its send
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
  /// Releases data a handler kept, or drops a descriptor unread (worker::am_data_release).
  void release_data(void* data);
  /// worker::am_recv_data_iov: receives the message of `desc` into `entries`.
  op recv_data(void* desc, const iov_entry* entries, size_t count, am_recv_data_callback cb,
               const request_params& params);
  /// Gives data a handler kept to the user for good (worker::am_data_detach).
  bool detach_data(void* data);
  /// Largest AM user header (worker::max_am_header).
  size_t max_header() const noexcept { return max_header_; }
  /// Data a handler kept (or is being given), with its block.
  struct held_data {
    void* block = nullptr;  ///< what to free
    size_t length = 0;      ///< data bytes
    bool counted = false;   ///< counts against COMM_AM_HELD_* (kept past the call)
  };
  /// Data handlers keep (am_flag_persistent_data), by data pointer.
  const std::unordered_map<void*, held_data>& persistent_data() const noexcept {
    return persistent_;
  }
  /// Rendezvous descriptors handlers were given and have not used up yet.
  size_t descriptors() const noexcept { return descs_.size(); }
  /// What handlers keep past their call: descriptors and data (COMM_AM_HELD_MAX).
  size_t held() const noexcept { return held_; }
  /// Bytes of data handlers keep past their call (COMM_AM_HELD_MAX_BYTES).
  size_t held_bytes() const noexcept { return held_bytes_; }
  /// Rendezvous AMs waiting for room, every endpoint's.
  size_t deferred() const noexcept { return deferred_; }

  // -- from the rendezvous module --
  /// A rendezvous AM from `ep`: fetched now, deferred until it fits, or refused when it never can.
  void on_announcement(endpoint_impl& ep, uint16_t id, uint16_t flags,
                       std::vector<uint8_t> header, rndv_announcement&& a);
  /// Drops the deferred AM `sreq` of `ep`, or marks the descriptor a handler holds for it as
  /// cancelled (its sender cancelled it); true if it did either (the caller answers the sender).
  bool drop_announcement(endpoint_impl& ep, uint64_t sreq);

  void forget_peer(endpoint_impl& ep, held_fate fate) override;
  void endpoint_failed(endpoint_impl& ep, status reason) override;
  void endpoint_deleted(endpoint_impl& ep) override;
  void progress() override;
  void teardown() override;
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
  /// Gives a rendezvous AM to its handler as a descriptor; releases it after the call unless the
  /// handler used it up or kept it.
  void offer(endpoint_impl& ep, const handler& h, deferred_am& am);
  /// Descriptors given out, by handle. The handle the user holds is not an address: a serial
  /// number made odd, so it is never the address of data a handler keeps (aligned to 8 at least)
  /// and never given out again, so a handle used up stays invalid.
  using desc_table = std::unordered_map<void*, am_desc>;
  /// The handle of the next descriptor.
  void* next_handle() {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(next_serial_++ * 2 + 1));
  }
  /// True when `p` has the form of a descriptor handle (it may be used up, or forged).
  static bool is_handle(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 1u) != 0; }
  /// Drops descriptor `d` unread: acknowledges the sender (its request completes with ok) and
  /// frees it.
  void drop_desc(desc_table::iterator d);
  /// Frees descriptor `d` (no message).
  void free_desc(desc_table::iterator d);
  /// Unties the descriptors of `ep` from it: their fetch fails with `reason`.
  void orphan_descs(endpoint_impl& ep, status reason);
  /// Fetches the data of descriptor `d` into a new request with `entries`, and frees `d`.
  op fetch_desc(desc_table::iterator d, const iov_entry* entries, size_t count,
                am_recv_data_callback cb, const request_params& params);
  /// Copies kept data into `entries`, releases it, and completes.
  op copy_kept(void* data, const iov_entry* entries, size_t count, am_recv_data_callback cb,
               const request_params& params);
  /// Ends the fetch of worker::am_recv_data.
  static void data_fetched(request* req, status outcome);
  /// Acknowledges the rendezvous `sreq` of `ep` with `st` without fetching anything.
  void acknowledge(endpoint_impl* ep, uint64_t sreq, uint64_t address, status st);
  /// The COMM_AM_HELD_* variable that keeping `bytes` more would pass, or null; `limit` gets it.
  const char* held_limit(size_t bytes, size_t* limit) const;
  /// Logs (rate-limited) and counts that the limit `variable` = `limit` stopped a handler from
  /// keeping AM `id` of `ep`.
  void held_limit_hit(endpoint_impl* ep, uint16_t id, const char* variable, size_t limit,
                      const char* what);
  /// Stops counting data `d` as kept.
  void uncount(held_data& d);
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
  std::unordered_map<void*, held_data> persistent_;  ///< data given to handlers
  desc_table descs_;          ///< descriptors given out
  uint64_t next_serial_ = 1;  ///< serial of the next descriptor (next_handle)
  size_t held_ = 0;           ///< descriptors and data kept past the call
  size_t held_bytes_ = 0;     ///< bytes of data kept past the call
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
