// Frames to other nodes: made on any thread (a proxy serialises on its sender's thread), sent by
// whichever thread holds the turn lock, which numbers them and keeps the requests they carry until
// answered.
#include "node_state.hpp"
#include "payload.hpp"

#include <comm/log.hpp>

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/sec.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>

namespace comm::actors::detail {

namespace {

#ifndef COMM_SLOW_BUILD_FACTOR
#define COMM_SLOW_BUILD_FACTOR 1  // the ThreadSanitizer build sets 30 (see CMakeLists.txt)
#endif

/// How long a sender waits for a connection's backlog to shrink at all before it gives up (the
/// peer takes nothing: stopped, or never reading): 100 ms, times the build's slowness.
constexpr std::chrono::milliseconds backlog_stall{100 * COMM_SLOW_BUILD_FACTOR};

/// How long a sender waiting for the backlog sleeps between looks. The receiver takes half of
/// max_backlog's 1024 frames in about 140 us on a core of its own, so a nap (plus the timer's
/// slack, 50 us by default) leaves it work. A sender that offered its core on every look stayed
/// runnable, and when other programs load the cores the kernel shares them out by runnable
/// threads (per session, with autogroups), so it took its share from the receiving thread, whose
/// share is the one-way rate (actor_perftest -d; actors/README.md, "Under load").
constexpr std::chrono::microseconds backlog_nap{20};

/// Actors a thread recently made reachable through one node (actor ids are never reused).
struct reachable_cache {
  uint64_t generation = 0;
  caf::actor_id ids[8] = {};
  unsigned next = 0;
};

thread_local reachable_cache recently_reachable;

/// Where a thread serialises payloads before they get a buffer of their own.
thread_local std::vector<char> scratch;

/// A thread's message writer, for the node of one generation at a time.
struct thread_writer {
  uint64_t generation = 0;
  content_writer writer;
};

thread_local thread_writer writers;

}  // namespace

outgoing* node_state::new_frame(const std::shared_ptr<peer>& to, frame_kind kind) {
  auto* item = new outgoing;
  item->to = to;
  item->header.kind = kind;
  return item;
}

// -- made on any thread --------------------------------------------------------------------------

void node_state::forward(const std::shared_ptr<peer>& to, caf::actor_id receiver,
                         caf::mailbox_element& what, caf::execution_unit* ctx) {
  frame_header h = message_header(*to, receiver, what);
  scratch.clear();
  attachment_list attached;
  caf::error err = what.content().size() > UINT16_MAX
                       ? caf::make_error(caf::sec::invalid_argument, "message too long")
                       : write_message_payload(&serializer_unit_, writer(), what,
                                               h.location() == sender_location::in_payload,
                                               (h.flags & flag_stages) != 0, scratch, attached);
  if (err) {
    COMM_LOG(warn, "actors", "cannot send to actor %llu: %s",
             static_cast<unsigned long long>(receiver), caf::to_string(err).c_str());
    if (what.mid.is_request() && what.sender) {
      what.sender->enqueue(nullptr, what.mid.response_id(), caf::make_message(std::move(err)),
                           ctx);
    }
    return;
  }
  // Small frames leave from here when the worker is free; others queue for whoever holds it.
  if (!attached.empty() || scratch.size() >= buffer_pool::large || !send_now(to, h)) {
    h.attached = attached.bytes();
    outgoing* item = new_frame(to, frame_kind::message);
    item->header = h;
    item->payload = buffer_pool::detach(scratch);
    item->attached = std::move(attached);
    item->unsent = true;
    to->unsent_frames.fetch_add(1, std::memory_order_relaxed);
    submit(item);
  }
  if (backlog_of(*to) > params_.max_backlog && !to->backlog_stuck.load(std::memory_order_relaxed)) {
    wait_for_backlog(*to);
  }
}

size_t node_state::backlog_of(const peer& p) noexcept {
  return p.queued_frames.load(std::memory_order_relaxed) +
         p.unsent_frames.load(std::memory_order_relaxed);
}

void node_state::wait_for_backlog(peer& p) {
  // The progress thread cannot wait for itself; it sends what actors running on it made.
  if (on_progress_thread() || holds_lock()) return;
  backlog_waits_.fetch_add(1, std::memory_order_relaxed);
  const size_t resume_at = params_.max_backlog / 2;
  size_t least = backlog_of(p);
  auto since = std::chrono::steady_clock::now();
  for (bool first = true; p.alive.load(std::memory_order_relaxed); first = false) {
    // The peer may need this very core to take them: the first look offers it (one hand-over,
    // after which a receiver on this core has taken all it could), later ones sleep, as a thread
    // that stays runnable takes its share of the cores from the receiving side whenever the
    // cores are shared with other programs (see backlog_nap).
    if (first) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(backlog_nap);
    }
    if (try_acquire()) {
      progress_locked();
      release();
    }
    const size_t queued = backlog_of(p);
    if (queued <= resume_at) return;
    const auto now = std::chrono::steady_clock::now();
    if (queued < least) {
      least = queued;
      since = now;
    } else if (now - since >= backlog_stall) {
      // The peer takes nothing: max_queued_bytes decides, and senders do not wait again until
      // it takes a frame.
      p.backlog_stuck.store(true, std::memory_order_relaxed);
      backlog_stalls_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

frame_header node_state::message_header(const peer& to, caf::actor_id receiver,
                                        const caf::mailbox_element& what) {
  frame_header h;
  h.receiver = receiver;
  h.message_id = what.mid.integer_value();
  h.type_count = static_cast<uint16_t>(what.content().size());
  sender_location where = sender_location::none;
  if (what.sender) {
    const caf::node_id& home = what.sender->node();
    h.sender = what.sender->id();
    if (home == sys_.node()) {
      where = sender_location::sending_node;
      make_sender_reachable(what.sender);
    } else {
      where = home == to.id ? sender_location::receiving_node : sender_location::in_payload;
    }
  }
  h.set_location(where);
  if (!what.stages.empty()) h.flags |= flag_stages;
  return h;
}

bool node_state::send_now(const std::shared_ptr<peer>& to, const frame_header& h) {
  const bool held = holds_lock();
  if (held ? (in_callback_ || draining_) : !try_acquire() && !wait_for_turn()) return false;
  drain();  // frames queued earlier leave first
  outgoing frame;
  frame.header = h;
  frame.payload.swap(scratch);
  const bool sent = transmit(*to, frame, true);
  scratch.swap(frame.payload);
  if (!sent) {
    // The connection is full: the frame waits in libcomm's queue, and this thread, which holds
    // the worker anyway, progresses it to move the queue along.
    outgoing* item = new_frame(to, frame_kind::message);
    item->header = h;
    item->payload = buffer_pool::detach(scratch);
    transmit(item);
    if (!held) progress_locked();
  }
  if (!held) release();
  return true;
}

void node_state::announce_link(const std::shared_ptr<peer>& to, bool linked,
                               caf::strong_actor_ptr local, caf::actor_id remote) {
  outgoing* item = new_frame(to, linked ? frame_kind::link : frame_kind::unlink);
  item->header.set_location(sender_location::sending_node);
  item->header.sender = local->id();
  item->header.receiver = remote;
  item->local = std::move(local);
  post(item);
}

void node_state::report_down(const std::weak_ptr<peer>& to, caf::actor_id aid,
                             const caf::error& reason) {
  auto p = to.lock();
  if (!p || !p->alive.load(std::memory_order_relaxed)) return;
  outgoing* item = new_frame(p, frame_kind::down);
  item->header.sender = aid;
  if (write_reason_payload(&serializer_unit_, reason, item->payload)) {
    item->payload.clear();
    (void)write_reason_payload(&serializer_unit_, caf::exit_reason::unknown, item->payload);
  }
  post(item);
}

content_writer& node_state::writer() {
  if (writers.generation != generation_) {
    writers.writer = content_writer{};
    writers.generation = generation_;
  }
  return writers.writer;
}

void node_state::make_sender_reachable(const caf::strong_actor_ptr& sender) {
  reachable_cache& cache = recently_reachable;
  if (cache.generation != generation_) cache = reachable_cache{generation_};
  for (caf::actor_id id : cache.ids) {
    if (id == sender->id()) return;
  }
  make_reachable(sender);
  cache.ids[cache.next++ % std::size(cache.ids)] = sender->id();
}

void node_state::make_reachable(const caf::strong_actor_ptr& local) {
  sys_.registry().put(local->id(), local);
}

// -- sent on the progress thread -----------------------------------------------------------------

void node_state::transmit(outgoing* item) {
  if (item->unsent) {
    item->unsent = false;
    item->to->unsent_frames.fetch_sub(1, std::memory_order_relaxed);
  }
  transmit(*item->to, *item, false);
  // A send still in progress owns the item now (on_sent deletes it).
}

bool node_state::transmit(peer& p, outgoing& item, bool immediate) {
  if (!p.alive.load(std::memory_order_relaxed) || !p.ready) {
    bounce(p, item.header);
    if (!immediate) delete &item;
    return true;
  }
  if (item.local) make_reachable(item.local);
  item.header.seq = p.send_seq;
  if (item.header.attached != 0 && !immediate) lend_attached(p, item);
  // A copy: libcomm may complete the send, and on_sent delete the item, inside am_send.
  const frame_header h = item.header;
  comm::request_params rp;
  rp.flags = comm::request_reply_endpoint | (immediate ? comm::request_force_immediate : 0u);
  rp.send_cb = immediate ? nullptr : &node_state::on_sent;
  rp.user_data = immediate ? nullptr : &item;
  if (!immediate) queue_up(item);
  const void* head = envelope_.encode(h);
  size_t head_length = envelope_writer::size();
  const void* data = item.payload.data();
  size_t bytes = item.payload.size();
  if ((h.flags & flag_lent) != 0) {
    lay_out_lent(item, head, head_length, data, bytes);
  } else if (h.attached != 0) {
    lay_out_attached(item, head, head_length, data, bytes);
  }
  comm::op o = p.ep->am_send(frame_am_id, head, head_length, data, bytes, rp);
  if (immediate && o.st == comm::status::no_resource) return false;  // nothing was sent
  ++p.send_seq;
  sent_.add(1);
  bytes_sent_.add(bytes);
  sent_frame(p, h);
  if (o.pending()) {
    worker_->release(o.req);  // the item is on_sent's now (maybe gone already)
    // Its completion needs progress: the progress thread may be asleep if this is a sender.
    if (!on_progress_thread()) wake();
    return true;
  }
  if (!immediate) unqueue(p, item);  // not queued after all
  if (o.failed()) {
    COMM_LOG(debug, "actors", "send on connection %llu failed: %s",
             static_cast<unsigned long long>(p.serial), comm::to_string(o.st));
    bounce(p, h);
  }
  if (!immediate) delete &item;
  return true;
}

void node_state::lay_out_attached(outgoing& item, const void*& head, size_t& head_length,
                                  const void*& data, size_t& length) {
  attachment_list& a = item.attached;
  if (a.runs.size() == 1 && head_length + item.payload.size() <= worker_->max_am_header()) {
    // The usual case: the payload rides in the AM header, the run is the AM's data as it is.
    const auto* envelope = static_cast<const char*>(head);
    joined_.assign(envelope, envelope + head_length);
    joined_.insert(joined_.end(), item.payload.begin(), item.payload.end());
    head = joined_.data();
    head_length = joined_.size();
    data = a.runs.front().data();
    length = a.runs.front().size();
    return;
  }
  // Several runs, or a payload too long for a header: one buffer of payload and runs.
  blob all(item.payload.size() + a.bytes());
  char* out = all.mutable_data();
  std::memcpy(out, item.payload.data(), item.payload.size());
  out += item.payload.size();
  for (const blob& run : a.runs) {
    std::memcpy(out, run.data(), run.size());
    out += run.size();
  }
  a.runs.assign(1, all);
  data = all.data();
  length = all.size();
}

void node_state::sent_frame(peer& p, const frame_header& h) {
  if (h.kind == frame_kind::message) {
    track_request(p, h);
  } else if (h.kind == frame_kind::down && p.watched.erase(h.sender) != 0) {
    watched_gauge_.sub(1);
  }
}

void node_state::queue_up(outgoing& item) {
  peer& p = *item.to;
  item.owner = this;
  in_flight_.add(1);
  const size_t frames = p.queued_frames.load(std::memory_order_relaxed) + 1;
  p.queued_frames.store(frames, std::memory_order_relaxed);
  if (frames > peak_frames_queued_.get()) peak_frames_queued_.set(frames);
  const size_t before = p.queued_bytes;
  p.queued_bytes += queued_cost(item);
  if (before > params_.max_queued_bytes || p.queued_bytes <= params_.max_queued_bytes) return;
  // The first frame beyond the limit: the peer goes once this send is done with.
  post_task([this, to = item.to] {
    if (to->alive.load(std::memory_order_relaxed)) {
      violation(to, "more bytes waiting to be sent than max_queued_bytes");
    }
  });
}

void node_state::unqueue(peer& p, const outgoing& item) {
  p.queued_bytes -= queued_cost(item);
  p.queued_frames.store(p.queued_frames.load(std::memory_order_relaxed) - 1,
                        std::memory_order_relaxed);
  if (p.backlog_stuck.load(std::memory_order_relaxed)) {
    p.backlog_stuck.store(false, std::memory_order_relaxed);
  }
  in_flight_.sub(1);
}

void node_state::on_sent(comm::request*, comm::status, void* user_data) {
  auto* item = static_cast<outgoing*>(user_data);
  item->owner->unqueue(*item->to, *item);
  delete item;
}

void node_state::track_request(peer& p, const frame_header& h) {
  const caf::message_id mid{h.message_id};
  if (h.location() != sender_location::sending_node || !mid.is_request()) return;
  if (p.pending.emplace(request_key{h.sender, mid.request_id().integer_value()}, h.message_id)
          .second) {
    pending_gauge_.add(1);
  }
  if (p.pending.size() >= p.prune_at) prune_requests(p);
}

void node_state::prune_requests(peer& p) {
  // Requests whose requester is gone can never be answered to anyone: forget them. (Requests a
  // remote actor never answers stay until their connection ends.)
  for (auto it = p.pending.begin(); it != p.pending.end();) {
    if (sys_.registry().get(it->first.requester)) {
      ++it;
    } else {
      it = p.pending.erase(it);
      pending_gauge_.sub(1);
    }
  }
  p.prune_at = std::max(peer::first_prune, 2 * p.pending.size());
}

void node_state::bounce(peer& p, const frame_header& h) {
  if (h.kind == frame_kind::lookup) {
    auto it = p.asked.find(h.message_id);
    if (it != p.asked.end()) {
      auto call = std::move(it->second);
      p.asked.erase(it);
      retry_lookup(call, comm::status::not_connected);
    }
    return;
  }
  const caf::message_id mid{h.message_id};
  if (h.kind != frame_kind::message || h.location() != sender_location::sending_node ||
      !mid.is_request()) {
    return;
  }
  if (p.pending.erase({h.sender, mid.request_id().integer_value()}) != 0) {
    pending_gauge_.sub(1);
  }
  if (auto requester = sys_.registry().get(h.sender)) {
    requester->enqueue(nullptr, mid.response_id(),
                       caf::make_message(caf::make_error(caf::sec::request_receiver_down)),
                       nullptr);
  }
}

}  // namespace comm::actors::detail
