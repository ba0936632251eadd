// The self transport: loopback between interfaces of one process.
//
// Each interface owns a mailbox: a bounded ring of fixed-size slots behind a mutex, plus the list
// of zcopy completions other interfaces handed back to it. An endpoint copies the message into the
// target's ring (no_resource when it is full); the target's progress() delivers it. A zcopy is
// copied like a bcopy and completes, on the sender's own progress, once the target delivered it.
// A handler may keep a message (am_flag_desc, at most max_am_descs at once): its slot's buffer is
// lent out and the slot gets a replacement from a desc_pool before it is reused.
// Interface address: a process-unique 64-bit id, looked up in a process-wide registry of live
// interfaces. Device address: pid + boot id, so only this process reaches it.
// As with every transport: completion and pending callbacks must not destroy the endpoint that runs
// them, a destroyed endpoint drops its in-flight zcopy completions, and endpoints go before their
// interface. An interface is used by one thread; endpoints of different interfaces may send to the
// same interface from different threads.
// Memory domain and RMA (get_zcopy/put_zcopy by memmove after checks): self_md.hpp.
//
// Tag matching (cap_tag_*) happens in the receiving interface (base/tag_offload.hpp): a slot
// carries its kind and, for tagged messages, the tag and immediate value. Eager short and bcopy
// messages sit in the slot; an eager zcopy carries the sender's iov, which the receiver copies
// straight into a matching posted receive, or in slot-sized fragments (tag_flag_first/more) into
// the slot's buffer for the unexpected handler; the sender's completion comes back as for
// am_zcopy. A rendezvous carries its header in the slot and a rndv_op shared with the sender:
// the receiver claims it (posted -> taken, so a canceled one is skipped), fetches the registered
// buffer into a matching posted receive through the md's checks and completes the sender, or
// hands address, length and key to the unexpected handler and leaves the operation to the
// sender's cancel.
#pragma once

#include "base/desc_pool.hpp"
#include "base/iface_base.hpp"
#include "base/pending_queue.hpp"
#include "base/tag_offload.hpp"
#include "self/self_md.hpp"

#include <comm/transport/transport.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace comm::tl::self {

/// The self transport's component.
component& self_component();

/// Messages handlers may keep at once (am_flag_desc): each holds one slot buffer
/// (COMM_SELF_SEG_SIZE + 512 bytes).
inline constexpr size_t max_am_descs = 64;

/// Receives a tagged interface may have posted at once.
inline constexpr size_t tag_max_outstanding = 256;

/// Largest tag_eager_zcopy (delivered unexpected in fragments of a slot's size).
inline constexpr size_t tag_eager_max_zcopy = 256 * 1024;

struct ep_state;

/// A rendezvous announced by a self endpoint, shared by the sender and the slot carrying it.
struct rndv_op {
  /// Where the operation is: the receiver moves posted to taken (fetching) to done, or posted to
  /// unexpected; the sender's cancel moves posted or unexpected to canceled, and waits out taken.
  enum state_value : int { posted, taken, unexpected, done, canceled };
  std::atomic<int> state{posted};
  uint64_t address = 0;       ///< the sender's buffer
  uint64_t length = 0;        ///< its length
  std::vector<uint8_t> rkey;  ///< its packed key (empty when length is 0)

  // -- the sender's, touched on its interface's thread only --
  uint64_t handle = 0;         ///< what tag_rndv_zcopy returned
  mem_handle* memh = nullptr;  ///< the buffer's registration, null once released
  bool released = false;       ///< off the endpoint's list, registration released
  bool canceled_by_sender = false;  ///< its completion is never called
};

/// A zcopy whose data the target delivered, handed back to the sending interface.
struct returned_completion {
  std::shared_ptr<ep_state> origin;  ///< the sending endpoint (it may be gone: then dropped)
  completion* comp = nullptr;        ///< the caller's completion, may be null
  status result = status::ok;        ///< ok, or connection_reset when the target closed first
  std::shared_ptr<rndv_op> rndv;     ///< the rendezvous this completes, or null
};

/// What a mailbox slot carries.
enum class slot_kind : uint8_t {
  am,           ///< an active message (id, length)
  tag_eager,    ///< a tagged eager message of `length` bytes in the slot
  tag_zcopy,    ///< a tagged eager zcopy: the sender's iov (`aux` entries, `length` bytes)
  tag_rndv,     ///< a rendezvous: its header (`length` bytes) in the slot, the rest in `rndv`
  tag_request,  ///< a software rendezvous request: its header (`length` bytes) in the slot
};

/// The receive side of one self interface; shared with the endpoints that target it, so a send
/// to an interface that was closed meanwhile fails cleanly instead of touching freed memory.
struct mailbox {
  /// Metadata of one ring slot, written when the producer commits the slot and read by the
  /// consumer once `ready`, both under `mutex`. The slot's bytes are filled outside the lock by
  /// the producer that reserved it.
  struct slot {
    am_id id = 0;
    bool ready = false;
    slot_kind kind = slot_kind::am;
    uint32_t length = 0;
    completion* comp = nullptr;          ///< zcopy: completion to hand back
    std::shared_ptr<ep_state> origin;    ///< zcopy: the sending endpoint
    tag_t tag = 0;                       ///< tagged: the sender's tag
    uint64_t imm = 0;                    ///< tagged eager: the immediate value
    uint32_t aux = 0;                    ///< tag_zcopy: iov entries in the slot
    std::shared_ptr<rndv_op> rndv;       ///< tag_rndv: the operation
  };

  mailbox(size_t capacity, size_t slot_bytes, int event_fd);
  ~mailbox();
  mailbox(const mailbox&) = delete;
  mailbox& operator=(const mailbox&) = delete;

  /// Bytes of slot `index`, 8-byte aligned. The owner replaces a slot's buffer only while it holds
  /// the slot (delivered, not yet released), so a sender that reserved it reads a stable pointer.
  uint8_t* slot_data(size_t index) { return reinterpret_cast<uint8_t*>(buffers[index].get()); }

  /// Wakes the owner if it armed its event fd; call with `mutex` held, write outside it.
  bool take_armed() {
    const bool was = armed;
    armed = false;
    return was;
  }

  /// Writes the owner's eventfd.
  void wake() const;

  /// Hands a finished zcopy back to this (the sender's) mailbox, waking its owner if armed.
  void hand_back(returned_completion done);

  const size_t capacity;      ///< slots in the ring
  const size_t slot_words;    ///< 8-byte words per slot
  const int event_fd;         ///< the owner's eventfd
  std::vector<desc_pool::block> buffers;  ///< one per slot, slot_words long

  std::mutex mutex;           ///< guards everything below
  std::vector<slot> slots;
  size_t tail = 0;            ///< oldest reserved slot
  size_t count = 0;           ///< slots reserved (filled or being filled)
  std::vector<returned_completion> returned;
  bool armed = false;         ///< the owner sleeps on event_fd
  bool closed = false;        ///< the owner interface is gone

  /// count + returned.size(), readable without the lock so an idle progress takes no lock.
  std::atomic<size_t> activity{0};
  /// Refreshes `activity`; call with `mutex` held after changing count or returned.
  void note_activity() {
    activity.store(count + returned.size(), std::memory_order_release);
  }
};

/// State of an endpoint that outlives it while its zcopy operations are in flight. Touched only
/// on the thread of the endpoint's interface.
struct ep_state {
  std::shared_ptr<mailbox> home;     ///< mailbox of the endpoint's interface
  bool alive = true;                 ///< false once the endpoint is destroyed
  uint64_t zcopy_issued = 0;         ///< zcopy operations started
  uint64_t zcopy_done = 0;           ///< zcopy operations completed
  /// Flush requests: completed when zcopy_done reaches the first member.
  std::vector<std::pair<uint64_t, completion*>> flushes;
  /// Rendezvous issued and not yet completed or canceled (each counts as one zcopy).
  std::vector<std::shared_ptr<rndv_op>> rndv_ops;
};

class self_ep;

/// A self interface.
class self_iface final : public iface_base {
public:
  /// Opens an interface; the constructor leaves `open_status()` set.
  explicit self_iface(const iface_params& params);
  ~self_iface() override;

  /// ok, or why the interface could not be opened.
  status open_status() const { return open_status_; }

  // -- iface --

  const iface_attr& attr() const override { return attr_; }
  std::string_view transport_name() const override { return "self"; }
  unsigned progress() override;
  int event_fd() const override { return event_fd_; }
  status event_arm() override;
  std::vector<uint8_t> device_address() const override;
  std::vector<uint8_t> iface_address() const override;
  bool is_reachable(const std::vector<uint8_t>& device_address,
                    const std::vector<uint8_t>& iface_address) const override;
  status create_ep(const std::vector<uint8_t>& device_address,
                   const std::vector<uint8_t>& iface_address, std::unique_ptr<ep>& out) override;
  md* memory_domain() override { return md_.get(); }
  std::string info() const override;
  void release_am_desc(void* data) override;
  status set_tag_handlers(tag_unexp_eager_fn eager, void* eager_arg, tag_unexp_rndv_fn rndv,
                          void* rndv_arg) override;
  status tag_recv_zcopy(tag_t tag, tag_t tag_mask, const iov* entries, size_t count,
                        tag_context* ctx) override;
  status tag_recv_cancel(tag_context* ctx, bool force) override;

  // -- used by self_ep --

  /// Releases the registration of `op` and takes it off its endpoint's list `state` (once).
  void release_rndv(ep_state& state, rndv_op& op);

  /// Counts one RMA operation of `bytes` that ended with `result`.
  void count_rma(bool put, size_t bytes, status result) { rma_.count(put, bytes, result); }

  /// The mailbox of this interface (zcopy completions come back to it).
  const std::shared_ptr<mailbox>& own_mailbox() const { return mailbox_; }

  /// Puts `ep` on the list of endpoints whose pending queue progress() retries.
  void schedule_pending(self_ep* ep);

  /// Forgets `ep` (destroyed).
  void forget(self_ep* ep);

private:
  /// A slot's fields, copied out under the mailbox's lock.
  struct taken_slot {
    size_t index = 0;
    am_id id = 0;
    slot_kind kind = slot_kind::am;
    uint32_t length = 0;
    completion* comp = nullptr;
    std::shared_ptr<ep_state> origin;
    tag_t tag = 0;
    uint64_t imm = 0;
    uint32_t aux = 0;
    std::shared_ptr<rndv_op> rndv;
  };

  unsigned deliver();
  /// Delivers a tagged slot; hands a zcopy's or a matched rendezvous's completion back.
  void deliver_tag(taken_slot& slot);
  void deliver_tag_zcopy(taken_slot& slot);
  void deliver_rndv(taken_slot& slot);
  /// Lends the buffer of slot `index` to a handler that kept it and gives the slot a fresh one.
  void lend_slot(size_t index);
  /// Calls the unexpected eager handler with `length` bytes in the buffer of slot `index`, lending
  /// the buffer when the handler keeps it.
  void unexpected_in_slot(size_t index, size_t length, unsigned flags, tag_t tag, uint64_t imm,
                          void** context);
  unsigned complete_returned();
  unsigned dispatch_pending();

  status open_status_ = status::ok;
  iface_attr attr_;
  uint64_t id_ = 0;
  int event_fd_ = -1;
  std::shared_ptr<mailbox> mailbox_;
  std::vector<self_ep*> pending_eps_;             ///< endpoints with parked requests
  std::vector<returned_completion> returned_scratch_;
  uint64_t delivered_ = 0;
  uint64_t dropped_ = 0;                          ///< messages without a handler
  desc_pool descs_{max_am_descs};                 ///< slot buffers kept by handlers
  std::unique_ptr<self_md> md_;
  rma_counters rma_;
  tag_offload tags_{tag_max_outstanding};         ///< posted receives, unexpected handlers
  uint64_t rndv_skipped_ = 0;                     ///< rendezvous canceled before delivery
};

/// An endpoint from a self interface to a self interface of the same process.
class self_ep final : public ep {
public:
  /// An endpoint of `owner` to the interface with registry id `target_id` and mailbox `target`.
  self_ep(self_iface& owner, std::shared_ptr<mailbox> target, uint64_t target_id);
  ~self_ep() override;

  status am_short(am_id id, const void* header, size_t header_length, const void* payload,
                  size_t payload_length) override;
  ssize_t am_bcopy(am_id id, pack_fn pack, void* arg) override;
  status am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                  size_t count, completion* comp) override;
  /// Writes the local iov to the target's registered memory; complete on return.
  status put_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                   const remote_key& key, completion* comp) override;
  /// Reads the target's registered memory into the local iov, filled in order; complete on return.
  status get_zcopy(const iov* entries, size_t count, uint64_t remote_address,
                   const remote_key& key, completion* comp) override;
  /// The bytes themselves (the peer is this process), checked as get_zcopy checks them.
  status rkey_local_address(uint64_t remote_address, size_t length, const remote_key& key,
                            local_bytes* out) override;
  status pending_add(pending_req* req) override;
  void pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) override;
  status flush(completion* comp) override;
  status tag_eager_short(tag_t tag, const void* data, size_t length) override;
  ssize_t tag_eager_bcopy(tag_t tag, uint64_t imm, pack_fn pack, void* arg) override;
  status tag_eager_zcopy(tag_t tag, uint64_t imm, const iov* entries, size_t count,
                         completion* comp) override;
  status tag_rndv_zcopy(tag_t tag, const void* header, size_t header_length, const iov* entries,
                        size_t count, completion* comp, uint64_t* handle) override;
  status tag_rndv_cancel(uint64_t handle) override;
  status tag_rndv_request(tag_t tag, const void* header, size_t header_length) override;

  /// Retries the parked requests; returns how many finished. Called by the interface.
  unsigned dispatch_pending() { return pending_.dispatch(); }

  /// True while requests are parked.
  bool has_pending() const { return !pending_.empty(); }

  /// On the interface's list of endpoints with parked requests (kept by the interface).
  bool scheduled = false;

private:
  /// Reserves a slot of the target ring, or returns no_resource / connection_reset.
  status reserve(size_t* index);
  /// What a slot being committed carries besides its bytes.
  struct slot_fields {
    slot_kind kind = slot_kind::am;           ///< what the slot carries
    tag_t tag = 0;                            ///< tagged: the sender's tag
    uint64_t imm = 0;                         ///< tagged eager: the immediate value
    uint32_t aux = 0;                         ///< tag_zcopy: iov entries in the slot
    std::shared_ptr<rndv_op> rndv = nullptr;  ///< tag_rndv: the operation
    am_id id = 0;                             ///< am: the active message id
  };
  /// Publishes the filled slot `index` holding `fields` and `length` bytes (`comp` and `origin`
  /// for a zcopy) and wakes the target if it sleeps.
  void commit(size_t index, slot_fields fields, size_t length, completion* comp,
              std::shared_ptr<ep_state> origin);
  /// Ends `op` for the sender: waits out a receiver fetching it, marks it canceled unless it
  /// finished, releases it. True when the receiver will hand a completion back for it.
  bool cancel_rndv(rndv_op& op);
  /// get (write false) or put (write true): the checks, then the copy.
  status rma(const iov* entries, size_t count, uint64_t remote_address, const remote_key& key,
             bool write);
  /// True when the target interface is closed.
  bool target_closed() const;

  self_iface& owner_;
  std::shared_ptr<mailbox> target_;
  const uint64_t target_id_;
  std::shared_ptr<ep_state> state_;
  pending_queue pending_;
  uint64_t next_rndv_handle_ = 1;
};

}  // namespace comm::tl::self
