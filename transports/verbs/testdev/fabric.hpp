// The verbs test device's insides: the objects behind each rdma-core handle and the fabric that
// owns them. Every table entry locks the fabric's one mutex (one lock for all devices: work
// requests cross devices), finds its objects by handle, and works on them; nothing here is called
// without that lock, except wait_readable().
//
// How work requests progress: a send work request executes when it is posted (and the ones before
// it have executed): its data lands in the responder's memory and the responder's receive
// completion is written at once, in posting order per QP. What waits is what waits on the wire:
// a SEND refused for want of a receive (RNR, retried after the responder's min_rnr_timer), a
// request nobody answers (retried after the requester's ACK timeout), and RDMA READ responses
// (delivered as soon as the fabric progresses, unless held). The fabric progresses whenever any CQ
// is polled and on its own thread, which sleeps until the next retry or response is due, so a
// consumer that only waits on a completion channel is never stranded. Send completions are
// written in posting order, so a SEND behind an unanswered READ completes after it.
#pragma once

#include "verbs/testdev/testdev.hpp"

#include <netinet/in.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

namespace comm::verbs::testdev::detail {

using clock = std::chrono::steady_clock;

/// A time that never comes (no retry or response due).
constexpr clock::time_point never = clock::time_point::max();

/// Name used in logs.
constexpr const char* log_name = "verbs test device";

/// A queue of events behind a descriptor that is readable exactly while the queue is not empty
/// (an eventfd raised on the first item and lowered with the last), like the fds of a completion
/// channel, a context's async events or an rdmacm event channel.
template <class T>
class event_queue {
 public:
  event_queue() : fd_(::eventfd(0, EFD_CLOEXEC)) {}
  ~event_queue() {
    if (fd_ >= 0) ::close(fd_);
  }
  event_queue(const event_queue&) = delete;
  event_queue& operator=(const event_queue&) = delete;

  /// The descriptor (negative when eventfd failed).
  int fd() const { return fd_; }
  /// Appends an event; the fd becomes readable.
  void push(T item) {
    items_.push_back(std::move(item));
    if (items_.size() == 1) raise();
  }
  /// Takes the oldest event; false when there is none.
  bool pop(T& item) {
    if (items_.empty()) return false;
    item = std::move(items_.front());
    items_.pop_front();
    if (items_.empty()) lower();
    return true;
  }
  /// Drops the events `pred` selects; returns how many.
  template <class Pred>
  size_t remove_if(Pred pred) {
    const size_t before = items_.size();
    items_.erase(std::remove_if(items_.begin(), items_.end(), pred), items_.end());
    if (before != 0 && items_.empty()) lower();
    return before - items_.size();
  }

 private:
  void raise() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(fd_, &one, sizeof(one));
  }
  void lower() {
    uint64_t value = 0;
    [[maybe_unused]] ssize_t n = ::read(fd_, &value, sizeof(value));
  }

  int fd_;
  std::deque<T> items_;
};

/// Waits, without the fabric lock, until `fd` is readable. Returns false with errno EAGAIN at
/// once when the fd is non-blocking (as rdma-core's get-event calls do).
bool wait_readable(int fd);

/// Async events of one object: delivered by get_async_event and acknowledged.
struct event_count {
  unsigned got = 0;    ///< handed out by a get call
  unsigned acked = 0;  ///< acknowledged
  /// True while some handed-out event is not acknowledged.
  bool unacked() const { return got != acked; }
};

struct device_obj;
struct context_obj;
struct pd_obj;
struct cq_obj;
struct srq_obj;
struct qp_obj;
struct cm_id_obj;

/// One port: its attributes and GID table.
struct port_obj {
  ibv_port_attr attr{};                     ///< what query_port reports
  std::vector<ibv_gid_entry> gids;          ///< the GID table
  std::vector<sockaddr_storage> addresses;  ///< IP addresses rdmacm resolves to this port
};

/// One emulated HCA.
struct device_obj {
  ibv_device pub{};                   ///< handed out by get_device_list
  device_limits limits;               ///< what it reports and enforces
  uint64_t guid = 0;                  ///< node GUID
  std::vector<port_obj> ports;        ///< ports[0] is port 1
  context_obj* cm_context = nullptr;  ///< the context rdmacm ids on this device use
};

/// An opened device (ibv_context).
struct context_obj {
  ibv_context pub{};
  device_obj* dev = nullptr;
  event_queue<ibv_async_event> async;  ///< behind pub.async_fd
  bool dead = false;                   ///< its peer is gone: calls fail, destroy releases
  bool for_rdmacm = false;             ///< opened by rdmacm (not the user's to close)
  size_t children = 0;                 ///< PDs, CQs and channels on it
};

/// A protection domain.
struct pd_obj {
  ibv_pd pub{};
  context_obj* ctx = nullptr;
  size_t children = 0;  ///< MRs, QPs and SRQs in it
};

/// A registered memory region.
struct mr_obj {
  ibv_mr pub{};
  pd_obj* pd = nullptr;
  int access = 0;  ///< IBV_ACCESS_* flags
};

/// A completion channel.
struct channel_obj {
  ibv_comp_channel pub{};
  context_obj* ctx = nullptr;
  event_queue<cq_obj*> events;  ///< behind pub.fd
  size_t cqs = 0;               ///< CQs attached
};

/// A completion queue entry, with the work queue slots its polling frees.
struct cqe {
  ibv_wc wc{};
  uint32_t* slots = nullptr;  ///< a QP's send/receive queue or an SRQ: occupancy to lower
  uint32_t covers = 0;        ///< slots freed when polled (unsignaled sends before it, plus one)
  ibv_wc_tm_info tm{};        ///< the TMH's tag and app_ctx (TM-SRQ completions)
};

/// A completion queue.
struct cq_obj {
  ibv_cq pub{};
  ibv_cq_ex ex{};               ///< the handle of an extended CQ (ibv_create_cq_ex)
  bool extended = false;        ///< created by create_cq_ex: its handle is &ex
  std::optional<cqe> current;   ///< the completion start_poll/next_poll made current
  /// The handle the user holds.
  ibv_cq* handle() { return extended ? reinterpret_cast<ibv_cq*>(&ex) : &pub; }
  context_obj* ctx = nullptr;
  channel_obj* channel = nullptr;
  std::deque<cqe> entries;
  size_t capacity = 0;
  bool armed = false;           ///< req_notify_cq called, no event since
  bool solicited_only = false;  ///< armed for solicited completions only
  bool overrun = false;         ///< lost a completion: in error
  size_t qps = 0;               ///< QPs completing into it
  event_count comp_events;      ///< completion events handed out and acknowledged
  event_count async_events;     ///< IBV_EVENT_CQ_ERR handed out and acknowledged
};

/// A receive work request.
struct recv_wqe {
  uint64_t wr_id = 0;
  std::vector<ibv_sge> sge;
};

/// A tagged buffer on a TM-SRQ's list (the test device's model of tag matching).
struct tag_entry {
  bool used = false;
  uint64_t tag = 0;
  uint64_t mask = 0;
  uint64_t recv_wr_id = 0;
  std::vector<ibv_sge> sge;
  uint64_t order = 0;  ///< when it was added: matching goes by it
};

/// A shared receive queue.
struct srq_obj {
  ibv_srq pub{};
  pd_obj* pd = nullptr;
  std::deque<recv_wqe> wqes;
  uint32_t max_wr = 0;
  uint32_t max_sge = 0;
  uint32_t limit = 0;  ///< armed limit (0: disarmed)
  uint32_t slots = 0;  ///< posted and not yet freed by a polled completion
  size_t qps = 0;      ///< QPs attached
  event_count async_events;
  // -- a TM-SRQ (IBV_SRQT_TM): the test device's model of tag matching --
  bool tm = false;
  cq_obj* tm_cq = nullptr;         ///< where list operations and matches complete
  std::vector<tag_entry> tags;     ///< max_num_tags entries; the index is the handle
  uint32_t max_ops = 0;
  uint32_t ops = 0;                ///< list operations whose completion is not polled yet
  uint64_t next_order = 1;
  uint32_t hw_unexpected = 0;      ///< tagged messages it put in ordinary buffers
  uint32_t sw_unexpected = 0;      ///< the count the latest synchronising operation reported
  uint32_t max_rndv_hdr = 0;       ///< largest rendezvous request it matches
};

/// Where a send work request is.
enum class stage {
  queued,          ///< not executed yet (or waiting to be retried)
  read_in_flight,  ///< an RDMA READ executed at the responder, response not yet arrived
  done,            ///< finished (status set); waits for the ones before it to complete
};

/// A send work request, copied at post time (inline data included).
struct send_wqe {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;  ///< IBV_SEND_*
  uint32_t imm_data = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sge;
  std::vector<uint8_t> inline_data;
  uint64_t length = 0;  ///< bytes moved
  stage where = stage::queued;
  ibv_wc_status status = IBV_WC_SUCCESS;
  unsigned rnr_naks = 0;             ///< RNR answers so far
  unsigned timeouts = 0;             ///< ACK timeouts so far
  bool awaiting_answer = false;      ///< sent, nobody answered; a timeout is running
  clock::time_point not_before{};    ///< next attempt (RNR or ACK timer)
  clock::time_point response_due{};  ///< an RDMA READ's response
  bool internal = false;             ///< sent by the device itself (a TM rendezvous FIN): no CQE
};

/// A reliable-connected queue pair.
struct qp_obj {
  ibv_qp pub{};
  pd_obj* pd = nullptr;
  cq_obj* send_cq = nullptr;
  cq_obj* recv_cq = nullptr;
  srq_obj* srq = nullptr;
  ibv_qp_cap cap{};
  bool sig_all = false;
  ibv_qp_attr attr{};  ///< current state and every attribute set so far
  std::deque<send_wqe> sq;
  size_t executed = 0;     ///< sq[0, executed) have executed (or are flushed)
  uint32_t sq_slots = 0;   ///< posted, not yet freed by a polled completion
  uint32_t uncovered = 0;  ///< unsignaled sends completed since the last send completion
  uint64_t send_cqes = 0;  ///< send completions generated (signaled or failed), for tests
  std::deque<recv_wqe> rq;
  uint32_t rq_slots = 0;
  unsigned reads_in_flight = 0;
  std::optional<ibv_wc_status> injected;  ///< fail_next_send
  clock::time_point wake_at = never;      ///< next retry or response due
  event_count async_events;
  cm_id_obj* cm_id = nullptr;  ///< the rdmacm id it was created on
};

/// A delivered or queued rdmacm event with its private data.
struct cm_event_obj {
  rdma_cm_event pub{};
  std::vector<uint8_t> private_data;
  cm_id_obj* counted_on =
      nullptr;             ///< the id whose events it counts as (the listener's for a request)
  bool delivered = false;  ///< handed out by get_cm_event, not yet acknowledged
};

/// An rdmacm event channel.
struct cm_channel_obj {
  rdma_event_channel pub{};
  event_queue<cm_event_obj*> queue;  ///< behind pub.fd
  size_t ids = 0;                    ///< ids on it
  bool destroyed = false;            ///< the user destroyed it while ids remained
};

/// Where an rdmacm id is.
enum class cm_state {
  idle,
  bound,
  addr_resolved,
  route_resolved,
  listening,
  connecting,        ///< active: connect sent, no answer yet
  request_received,  ///< passive: CONNECT_REQUEST delivered, not yet accepted or rejected
  accepted,          ///< passive: accepted, waiting for the client's establish
  connect_response,  ///< active without a QP on its id: CONNECT_RESPONSE, establish not called
  established,
  disconnected,  ///< DISCONNECTED delivered or sent
  failed,        ///< rejected, unreachable, or its peer went away before connecting
};

/// An rdmacm id.
struct cm_id_obj {
  rdma_cm_id pub{};
  cm_channel_obj* channel = nullptr;
  cm_state state = cm_state::idle;
  device_obj* dev = nullptr;  ///< device of its address (null when bound to a wildcard)
  bool holds_port = false;    ///< its source address and port are reserved
  int backlog = 0;
  size_t pending = 0;             ///< listener: requests neither accepted nor rejected
  cm_id_obj* listener = nullptr;  ///< passive id before it is answered
  cm_id_obj* peer = nullptr;      ///< the other end of the connection
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  uint8_t ack_timeout = 19;    ///< the kernel's RoCE default: packet life time 18, plus one
  uint32_t qp_num = 0;         ///< the QP this side announced
  uint32_t psn = 0;            ///< its first send PSN
  bool remote_known = false;   ///< the peer's QP and path below are set
  uint32_t remote_qp_num = 0;  ///< the QP the peer announced
  uint32_t remote_psn = 0;     ///< the peer's first send PSN
  device_obj* remote_dev = nullptr;
  uint8_t remote_port = 0;
  bool disconnect_seen = false;  ///< DISCONNECTED delivered to it already
  bool dead = false;
  event_count events;
  std::unique_ptr<ibv_sa_path_rec> path;
};

/// Owns every object; one exists while a test has it installed.
class fabric {
 public:
  explicit fabric(const std::vector<device_spec>& specs);
  ~fabric();

  std::mutex mutex;                     ///< guards everything below
  std::condition_variable engine_wake;  ///< the progress thread's alarm

  std::vector<std::unique_ptr<device_obj>> devices;
  std::unordered_map<ibv_device**, std::unique_ptr<ibv_device*[]>> device_lists;
  std::unordered_map<ibv_context*, std::unique_ptr<context_obj>> contexts;
  std::unordered_map<ibv_pd*, std::unique_ptr<pd_obj>> pds;
  std::unordered_map<ibv_mr*, std::unique_ptr<mr_obj>> mrs;
  std::unordered_map<ibv_comp_channel*, std::unique_ptr<channel_obj>> channels;
  std::unordered_map<ibv_cq*, std::unique_ptr<cq_obj>> cqs;
  std::unordered_map<ibv_srq*, std::unique_ptr<srq_obj>> srqs;
  std::unordered_map<ibv_qp*, std::unique_ptr<qp_obj>> qps;
  std::unordered_map<uint32_t, qp_obj*> qp_by_num;
  std::unordered_map<uint32_t, mr_obj*> mr_by_key;
  std::unordered_map<rdma_event_channel*, std::unique_ptr<cm_channel_obj>> cm_channels;
  std::unordered_map<rdma_cm_id*, std::unique_ptr<cm_id_obj>> cm_ids;
  std::unordered_map<rdma_cm_event*, std::unique_ptr<cm_event_obj>>
      cm_events;  ///< queued or delivered

  std::set<qp_obj*> timed;               ///< QPs with a retry or response due
  std::vector<qp_obj*> overrun_victims;  ///< QPs to fail once the current operation is done
  counters stats;
  bool reads_held = false;
  uint32_t next_qp_num = 0x100;
  uint32_t next_key = 0x1234;
  uint32_t next_psn = 0x4321;
  uint16_t next_cm_port = 40000;

  // -- testdev_fabric.cpp --

  /// Finishes what an operation left pending (QPs failed by a CQ overrun).
  void settle();
  /// Progresses every QP whose retry or response is due.
  void run_due(clock::time_point now);
  /// Objects the user has not released.
  size_t live_objects() const;

  // -- testdev_resources.cpp --

  /// Queues an async event on `ctx` (dropped when its context is dead).
  void raise_async(context_obj& ctx, ibv_event_type type, void* element);
  /// Puts `cq` in error: IBV_EVENT_CQ_ERR; its QPs fail once the current operation is done.
  void overrun(cq_obj& cq);
  /// Writes a completion into `cq`; arms its channel; overruns it when full.
  void push_cqe(cq_obj& cq, const ibv_wc& wc, uint32_t* slots, uint32_t covers, bool solicited,
                ibv_wc_tm_info tm = {});
  /// The context rdmacm uses on `dev` (opened on first use).
  context_obj& rdmacm_context(device_obj& dev);
  /// The MR registered under `key`, or null.
  mr_obj* find_mr(uint32_t key);

  // -- testdev_qp.cpp --

  /// Moves `qp` to the error state: every outstanding work request completes with
  /// IBV_WC_WR_FLUSH_ERR; an SRQ-attached QP raises IBV_EVENT_QP_LAST_WQE_REACHED.
  void to_error(qp_obj& qp);
  /// Completes every outstanding work request of a QP in error with IBV_WC_WR_FLUSH_ERR.
  void flush_queues(qp_obj& qp);
  /// Creates an RC QP as ibv_create_qp does; null with `error` set on failure.
  qp_obj* create_qp(pd_obj& pd, ibv_qp_init_attr& init, int& error);
  /// Destroys a QP as ibv_destroy_qp does; returns 0 or an errno value.
  int destroy_qp(qp_obj& qp);
  /// Modifies a QP as ibv_modify_qp does; returns 0 or an errno value.
  int modify_qp(qp_obj& qp, const ibv_qp_attr& attr, int mask);
  /// Removes the QP's completions from its CQs (freeing the slots they held).
  void purge_completions(qp_obj& qp);

  // -- testdev_wire.cpp --

  /// Executes, retries and completes what the QP can now; sets its next wake-up.
  void pump(qp_obj& qp, clock::time_point now);
  /// Writes send completions from the head of the send queue, in order.
  void complete_in_order(qp_obj& qp);

  // -- testdev_cm.cpp --

  /// Closes the rdmacm ids on `dev` as its process or host vanishes.
  void cm_peer_gone(device_obj& dev, peer_failure how);

 private:
  void engine_loop();
  bool stopping_ = false;
  std::thread engine_;
};

/// The installed fabric, locked for the life of this guard. Settles pending work before unlocking.
class locked_fabric {
 public:
  locked_fabric();
  ~locked_fabric();
  locked_fabric(const locked_fabric&) = delete;
  locked_fabric& operator=(const locked_fabric&) = delete;
  /// False (errno set to ENODEV) when no fabric is installed.
  explicit operator bool() const { return fabric_ != nullptr; }
  /// The fabric.
  fabric* operator->() const { return fabric_; }
  /// The fabric.
  fabric& operator*() const { return *fabric_; }
  /// Releases the lock early (before a blocking wait).
  void unlock();

 private:
  fabric* fabric_;
  std::unique_lock<std::mutex> lock_;
};

/// The object behind `handle` in `map`, or null.
template <class Map, class Key>
auto find(Map& map, Key handle) -> decltype(map.begin()->second.get()) {
  const auto it = map.find(handle);
  return it == map.end() ? nullptr : it->second.get();
}

/// Sets errno and returns null (the convention of rdma-core's create calls).
template <class T>
T* fail_null(int error) {
  errno = error;
  return nullptr;
}

/// Sets errno and returns -1 (the convention of rdmacm and some verbs calls).
inline int fail_minus_one(int error) {
  errno = error;
  return -1;
}

/// The port `num` (1-based) of `dev`, or null.
inline port_obj* port_of(device_obj& dev, uint32_t num) {
  return num >= 1 && num <= dev.ports.size() ? &dev.ports[num - 1] : nullptr;
}

/// True when the QP's context is gone (peer_gone).
inline bool dead(const qp_obj& qp) { return qp.pd->ctx->dead; }

/// The opcode of error completions. The verbs API leaves it undefined there (hardware leaves
/// whatever was in the caller's array); a consumer that reads it anyway sees no real opcode.
constexpr ibv_wc_opcode undefined_opcode = static_cast<ibv_wc_opcode>(0xff);

/// A completion of `wr_id` on QP `qp_num` with `status` (opcode undefined until set).
inline ibv_wc make_wc(uint64_t wr_id, ibv_wc_status status, uint32_t qp_num) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = undefined_opcode;
  wc.qp_num = qp_num;
  return wc;
}

/// The GID RoCE derives from an IP address (IPv4 as ::ffff:a.b.c.d).
ibv_gid gid_of(const sockaddr_storage& address);

/// The object an async event is about (its QP, CQ or SRQ handle), or null for port events.
const void* element_of(const ibv_async_event& event);

/// Drops queued async events about `element` (as the kernel does when the object goes).
void drop_async_events(context_obj& ctx, const void* element);

/// Fills the entries of devices, contexts, PDs, MRs, channels, CQs and SRQs.
void fill_resources(api& table);
/// Fills the QP entries (create, modify, query, destroy).
void fill_qp(api& table);
/// Fills post_send and post_recv.
void fill_wire(api& table);
/// Fills the rdmacm entries.
void fill_cm(api& table);
/// Fills the extended-CQ and tag-matching entries (create_cq_ex, polling, TM-SRQs).
void fill_tm(api& table);

/// Where a SEND to a QP on a TM-SRQ went (testdev_tm.cpp).
enum class tm_outcome {
  delivered,  ///< into a tagged buffer (matched) or an ordinary one
  not_ready,  ///< no ordinary buffer posted: receiver not ready
  failed,     ///< a matched rendezvous whose READ the requester's memory refused
};

/// Delivers `bytes`, the whole message of `wqe` from `requester`, to `responder`, whose SRQ is a
/// TM-SRQ: its TMH is matched against the tagged buffers, or the message lands in an ordinary one.
tm_outcome tm_deliver(fabric& f, qp_obj& requester, qp_obj& responder, const send_wqe& wqe,
                      const std::vector<uint8_t>& bytes);

}  // namespace comm::verbs::testdev::detail
