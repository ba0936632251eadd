// Tag matching of the verbs transport over a tag-matching SRQ (IBV_SRQT_TM): the transport's
// posted receives (iface::tag_recv_zcopy) are the device's tagged buffers, added and deleted with
// ibv_post_srq_ops, and the device matches arriving tagged SENDs against them. What the device
// does not match (nothing posted yet, or the device out of synch with the software after an
// unexpected message) lands in an ordinary SRQ buffer and is matched here, in software, against
// the same receives in post order, so the tl contract (the earliest posted receive at the time
// progress() meets the message) holds whichever side matched:
//   - the software keeps every posted receive (tag, mask, iov, the device's handle, post order);
//   - a device match (IBV_WC_TM_RECV) ends its receive: tag_consumed, then completed (or rndv
//     for a software rendezvous request);
//   - an unexpected EAGER or RNDV message counts as unexpected (the count every ADD, DEL and
//     SYNC reports, so the device resumes matching only once the software has seen all of them);
//     it takes the earliest posted receive whose tag accepts it (deleted from the device first:
//     while out of synch the device matches nothing), or goes to the unexpected handlers;
//   - a rendezvous taken here is fetched with an RDMA READ and acknowledged with an rndv_fin
//     message (the device sends a FIN for the ones it matched);
//   - active messages come as EAGER messages with am_tag (verbs_wire.hpp) and count as unexpected
//     too: the protocol layer may match a tagged message carried in one in software, and the
//     device must not match a later message to a receive that an earlier active message takes;
//   - a receive that would accept am_tag, and every receive posted after it while it is posted,
//     stays in software (the device never sees it): the device only holds receives posted before
//     any software-only one, so what it matches is what the software would have matched;
//   - a cancel deletes the buffer and waits for the DEL's completion: when the device matched it
//     first with an eager message that fits, the message is copied out and handed to the
//     unexpected handler in its place in the completion order, and the cancel succeeds; a
//     rendezvous or a truncated message is delivered to the receive instead (no_elem).
// Not thread safe: it belongs to one interface, used by one thread.
#pragma once

#include "verbs/verbs_md.hpp"
#include "verbs/verbs_wire.hpp"

#include <comm/transport/transport.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace comm::verbs {

class verbs_iface;
class verbs_conn;

/// One completion read from the CQ, with the TMH's tag and app_ctx of a tagged buffer's.
struct work_completion {
  ibv_wc wc{};          ///< the completion (from an extended CQ: the fields it read)
  ibv_wc_tm_info tm{};  ///< IBV_WC_TM_RECV: the TMH's tag and app_ctx
  int64_t staged = -1;  ///< a device match a cancel turned into an unexpected message (its id)
};

/// The posted receives of one interface on its tag-matching SRQ (see the file comment).
class verbs_tags {
public:
  /// wr_id bit of tagged buffers and list operations (receive buffers use bit 63).
  static constexpr uint64_t wr_id_flag = 1ull << 62;

  /// At most `max_outstanding` receives of at most `max_iov` entries, and `max_ops` list
  /// operations in flight, on `owner`'s SRQ.
  verbs_tags(verbs_iface& owner, size_t max_outstanding, size_t max_iov, uint32_t max_ops);
  ~verbs_tags();
  verbs_tags(const verbs_tags&) = delete;
  verbs_tags& operator=(const verbs_tags&) = delete;

  /// iface::set_tag_handlers.
  void set_handlers(tl::tag_unexp_eager_fn eager, void* eager_arg, tl::tag_unexp_rndv_fn rndv,
                    void* rndv_arg);
  /// iface::tag_recv_zcopy: ok, exceeds_limit, invalid_param, or io_error (registration).
  status post(tl::tag_t tag, tl::tag_t mask, const tl::iov* entries, size_t count,
              tl::tag_context* ctx);
  /// iface::tag_recv_cancel: ok, or no_elem (not posted, or the device matched it first: its
  /// completion ran).
  status cancel(tl::tag_context* ctx, bool force);

  /// A completion of a list operation or a tagged buffer (wr_id_flag set).
  void handle(const work_completion& c);
  /// Handles `c` at once when it is a list operation's (no callback runs); false otherwise.
  bool take_list_op(const work_completion& c);
  /// True when `m` (in an ordinary buffer) is an active message; counts it as unexpected.
  bool active_message(const tagged_message& m, const ibv_wc& wc);
  /// Counts `m` as unexpected when the device did (an EAGER or RNDV message nobody will handle).
  void count_unexpected(const tagged_message& m);
  /// Hands the device match staged by a cancel to the unexpected handler.
  void deliver_staged(int64_t id);
  /// An EAGER, RNDV or FIN message that landed in receive buffer `buffer` from `conn`.
  void handle_tagged(verbs_conn& conn, uint32_t buffer, const tagged_message& m,
                     const work_completion& c);
  /// After a batch of completions: reports the unexpected count (SYNC) when it changed, and
  /// posts rendezvous fetches that waited for a send slot.
  void after_poll();

  /// Most receives posted at once.
  size_t max_outstanding() const { return entries_.size(); }
  /// Receives posted now.
  size_t posted() const { return posted_; }
  /// One line for info().
  std::string info() const;

private:
  static constexpr uint32_t none = UINT32_MAX;
  /// wr_id bit of list operations (with wr_id_flag).
  static constexpr uint64_t op_flag = 1ull << 61;

  /// One posted receive.
  struct entry {
    tl::tag_context* ctx = nullptr;  ///< null while free
    tl::tag_t tag = 0;
    tl::tag_t mask = 0;
    std::vector<tl::iov> iov;
    size_t capacity = 0;
    uint64_t order = 0;       ///< post order
    uint32_t generation = 0;  ///< bumped at every post
    uint32_t handle = 0;      ///< the device's handle of its tagged buffer
    bool in_device = false;   ///< on the device's list (else matched in software only)
    pin_set pins;             ///< registrations of its iov while the device may write it
  };
  struct fetch;
  /// A device match a cancel took back: an unexpected eager message now.
  struct staged_message {
    tl::tag_t tag = 0;
    uint64_t imm = 0;
    std::vector<uint8_t> data;
  };

  uint32_t find(const tl::tag_context* ctx) const;
  status add_to_device(uint32_t index, tl::tag_t tag, tl::tag_t mask, const tl::iov* entries,
                       size_t count);
  uint32_t find_match(tl::tag_t stag) const;
  entry take(uint32_t index);
  int post_op(ibv_ops_wr& op);
  bool delete_from_device(uint32_t handle, uint64_t* wr_id);
  void list_op_done(const work_completion& c);
  void match_done(const work_completion& c);
  void deliver_eager(const entry& e, tl::tag_t stag, uint64_t imm, const uint8_t* data,
                     size_t length, bool request);
  void unexpected_eager(verbs_conn& conn, uint32_t buffer, const tagged_message& m, uint64_t imm,
                        bool request);
  void unexpected_rndv(verbs_conn& conn, const tagged_message& m);
  void start_fetch(verbs_conn& conn, const entry& e, const tagged_message& m);
  bool post_fetch(fetch& f);
  static void fetched(tl::completion* comp);
  bool wait_for_delete(uint64_t wr_id);
  bool stage(const entry& e, work_completion& match);

  verbs_iface& owner_;
  size_t max_iov_;
  uint32_t max_ops_;
  std::vector<entry> entries_;
  std::vector<uint32_t> free_;
  size_t posted_ = 0;
  size_t software_only_ = 0;    ///< posted receives the device does not hold
  std::unordered_map<int64_t, staged_message> staged_;
  int64_t next_staged_ = 0;
  uint64_t next_order_ = 1;
  uint64_t next_op_ = 1;
  uint32_t ops_ = 0;            ///< list operations whose completion is not read yet
  uint32_t unexpected_ = 0;     ///< tagged messages that landed in ordinary buffers
  bool sync_due_ = false;       ///< the device has not been told unexpected_ yet
  uint64_t waited_del_ = 0;     ///< the DEL a cancel waits for
  bool del_done_ = false;
  ibv_wc_status del_status_ = IBV_WC_SUCCESS;
  std::deque<std::unique_ptr<fetch>> waiting_;  ///< fetches waiting for a send slot

  tl::tag_unexp_eager_fn eager_fn_ = nullptr;
  void* eager_arg_ = nullptr;
  tl::tag_unexp_rndv_fn rndv_fn_ = nullptr;
  void* rndv_arg_ = nullptr;

  uint64_t device_matched_ = 0;
  uint64_t software_matched_ = 0;
  uint64_t unexpected_eager_ = 0;
  uint64_t unexpected_rndv_ = 0;
  uint64_t canceled_ = 0;
  uint64_t dropped_ = 0;
  uint64_t syncs_ = 0;
  uint64_t raced_ = 0;          ///< device matches a cancel turned into unexpected messages
};

}  // namespace comm::verbs
