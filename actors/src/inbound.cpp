// Frames from other nodes: checked, put in sequence, and handled by kind. Runs inside the
// worker's progress call, on the thread holding the turn lock (the progress thread, or a sender
// moving a full connection along); whatever must be sent in return is queued.
#include "node_state.hpp"
#include "payload.hpp"
#include "tsan_handoff.hpp"

#include <comm/log.hpp>

#include <caf/actor_cast.hpp>
#include <caf/actor_proxy.hpp>
#include <caf/sec.hpp>

#include <map>

namespace comm::actors::detail {

namespace {

/// How far ahead of the expected frame a peer's frame may be.
constexpr uint32_t max_hold_distance = 1u << 20;

/// What holding a frame costs beyond its bytes: the frame and the map's node around it.
constexpr size_t held_frame_overhead =
    sizeof(std::map<uint32_t, held_frame>::value_type) + 4 * sizeof(void*);

/// Longest name a lookup may ask for.
constexpr size_t max_name_length = 4096;

}  // namespace

comm::status node_state::on_frame(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const comm::am_recv_params& params) {
  auto* self = static_cast<node_state*>(arg);
  comm::endpoint* ep = (params.attr & comm::am_recv_reply_ep) ? params.reply_ep : nullptr;
  if (ep != self->rx_ep_ || ep == nullptr) {
    self->rx_peer_ = ep != nullptr ? self->peer_of(ep) : nullptr;
    self->rx_ep_ = self->rx_peer_ ? ep : nullptr;
  }
  const std::shared_ptr<peer>& p = self->rx_peer_;
  if (!p || !p->ready) {
    COMM_LOG(debug, "actors", "frame from an unknown connection: dropped");
    return comm::status::ok;
  }
  auto h = header_length >= envelope_writer::size()
               ? decode_envelope(header, envelope_writer::size())
               : std::nullopt;
  if (h && (h->flags & flag_lent) != 0) {
    self->receive_lent(p, *h, header, header_length, data, length);
    return comm::status::ok;
  }
  frame_parts parts;
  comm::worker* owner =
      (params.attr & comm::am_recv_data_persistent) != 0 ? self->worker_.get() : nullptr;
  if (!h || !split_frame(*h, header, header_length, data, length, owner, parts)) {
    self->violation(p, "malformed envelope");
    return comm::status::ok;
  }
  self->receive(p, *h, parts);
  return comm::status::ok;  // data this frame kept is detached from the worker by now
}

void node_state::receive(const std::shared_ptr<peer>& p, const frame_header& h,
                         frame_parts& parts) {
  received_.add(1);
  bytes_received_.add(parts.length + h.attached);
  if (h.seq != p->recv_seq) {
    hold(p, h, parts);
    return;
  }
  dispatch(p, h, parts);
  ++p->recv_seq;
  while (p->alive.load(std::memory_order_relaxed) && !p->held.empty()) {
    auto it = p->held.find(p->recv_seq);
    if (it == p->held.end()) break;
    held_frame next = std::move(it->second);
    p->held.erase(it);
    p->held_bytes -= next.cost;
    frame_parts kept{next.payload.data(), next.payload.size(), std::move(next.attached)};
    dispatch(p, next.header, kept);
    ++p->recv_seq;
  }
}

void node_state::hold(const std::shared_ptr<peer>& p, const frame_header& h, frame_parts& parts) {
  const uint32_t ahead = h.seq - p->recv_seq;
  if (ahead > max_hold_distance || p->held.count(h.seq) != 0) {
    violation(p, "frame out of sequence");
    return;
  }
  const size_t cost = parts.length + parts.attached.remaining() + held_frame_overhead;
  if (p->held_bytes + cost > params_.max_held_bytes) {
    violation(p, "more bytes waiting for an earlier frame than max_held_bytes");
    return;
  }
  const auto* bytes = static_cast<const char*>(parts.payload);
  parts.attached.own();
  p->held.emplace(h.seq, held_frame{h, std::vector<char>(bytes, bytes + parts.length),
                                    std::move(parts.attached), cost});
  p->held_bytes += cost;
  frames_held_.add(1);
  if (p->held_bytes > peak_bytes_held_.get()) peak_bytes_held_.set(p->held_bytes);
}

void node_state::dispatch(const std::shared_ptr<peer>& p, const frame_header& h,
                          frame_parts& parts) {
  const void* data = parts.payload;
  const size_t length = parts.length;
  switch (h.kind) {
    case frame_kind::message:
      on_message(p, h, parts);
      break;
    case frame_kind::monitor:
      on_monitor(p, h.receiver);
      break;
    case frame_kind::down:
      on_down(*p, h, data, length);
      break;
    case frame_kind::link:
    case frame_kind::unlink:
      on_link(*p, h, h.kind == frame_kind::link);
      break;
    case frame_kind::lookup:
      on_lookup(p, h, data, length);
      break;
    case frame_kind::lookup_reply:
      on_lookup_reply(p, h, data, length);
      break;
    case frame_kind::release:
      on_release(p, data, length);
      break;
  }
}

// -- messages ------------------------------------------------------------------------------------

void node_state::on_message(const std::shared_ptr<peer>& p, const frame_header& h,
                            frame_parts& parts) {
  const caf::message_id mid{h.message_id};
  if (mid.is_response() && p->pending.erase({h.receiver, mid.request_id().integer_value()})) {
    pending_gauge_.sub(1);
  }
  const bool sender_inside = h.location() == sender_location::in_payload;
  message_payload body;
  if (auto err = read_message_payload(&unit_, reader_, parts.payload, parts.length,
                                      parts.attached, sender_inside, (h.flags & flag_stages) != 0,
                                      h.type_count, body)) {
    unreadable_.add(1);
    if (mid.is_request()) {
      reply_error(p, h, err);
    } else if (mid.is_response()) {
      fail_response(*p, h, err);
    } else {
      drop_unreadable(*p, h, err);
    }
    return;
  }
  auto receiver = receiver_of(*p, h.receiver);
  if (!receiver) {
    if (mid.is_request()) reply_error(p, h, caf::make_error(caf::sec::request_receiver_down));
    return;
  }
  auto sender = sender_inside ? std::move(body.sender) : sender_of(*p, h);
  const void* content = body.content.vals().get();
  auto element = caf::make_mailbox_element(std::move(sender), mid, std::move(body.stages),
                                           std::move(body.content));
  handed_over(content);
  receiver->enqueue(std::move(element), delivery_unit());
}

void node_state::fail_response(peer& p, const frame_header& h, const caf::error& err) {
  COMM_LOG(debug, "actors", "response for actor %llu unreadable: %s; its request fails",
           static_cast<unsigned long long>(h.receiver), caf::to_string(err).c_str());
  auto requester = receiver_of(p, h.receiver);
  if (!requester) return;
  const bool sender_inside = h.location() == sender_location::in_payload;
  requester->enqueue(caf::make_mailbox_element(sender_inside ? nullptr : sender_of(p, h),
                                               caf::message_id{h.message_id}, {},
                                               caf::make_message(err)),
                     delivery_unit());
}

void node_state::drop_unreadable(const peer& p, const frame_header& h, const caf::error& err) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_unreadable_report_ < unreadable_report_interval) {
    ++unreported_unreadable_;
    return;
  }
  COMM_LOG(warn, "actors",
           "message from connection %llu to actor %llu unreadable: %s; dropped (%llu more "
           "dropped since the last report; node_stats::unreadable_messages counts them all)",
           static_cast<unsigned long long>(p.serial), static_cast<unsigned long long>(h.receiver),
           caf::to_string(err).c_str(), static_cast<unsigned long long>(unreported_unreadable_));
  last_unreadable_report_ = now;
  unreported_unreadable_ = 0;
}

caf::strong_actor_ptr node_state::receiver_of(peer& p, caf::actor_id aid) {
  if (aid != p.last_receiver_id || !p.last_receiver) {
    p.last_receiver = sys_.registry().get(aid);
    p.last_receiver_id = aid;
  }
  return p.last_receiver;
}

caf::strong_actor_ptr node_state::sender_of(peer& p, const frame_header& h) {
  if (h.sender == caf::invalid_actor_id) return nullptr;
  switch (h.location()) {
    case sender_location::sending_node:
      if (h.sender != p.last_sender_id || !p.last_sender) {
        p.last_sender = proxies_.get_or_put(p.id, h.sender);
        p.last_sender_id = h.sender;
      }
      return p.last_sender;
    case sender_location::receiving_node:
      return sys_.registry().get(h.sender);
    default:
      return nullptr;
  }
}

void node_state::reply_error(const std::shared_ptr<peer>& p, const frame_header& h,
                             const caf::error& err) {
  const caf::message_id response = caf::message_id{h.message_id}.response_id();
  if (h.location() == sender_location::receiving_node) {
    if (auto requester = sys_.registry().get(h.sender)) {
      requester->enqueue(nullptr, response, caf::make_message(err), delivery_unit());
    }
    return;
  }
  if (h.location() != sender_location::sending_node || h.sender == caf::invalid_actor_id) return;
  outgoing* item = new_frame(p, frame_kind::message);
  item->header.receiver = h.sender;
  item->header.message_id = response.integer_value();
  item->header.type_count = 1;
  if (write_content_payload(&unit_, caf::make_message(err), item->payload)) {
    delete item;
    return;
  }
  submit(item);
}

caf::execution_unit* node_state::delivery_unit() noexcept {
  // A sender that progresses the worker (see send_now) hands what arrives to the scheduler.
  return params_.mode == delivery::progress_thread && on_progress_thread() ? &unit_ : nullptr;
}

// -- down, link, unlink --------------------------------------------------------------------------

void node_state::on_down(const peer& p, const frame_header& h, const void* data, size_t length) {
  caf::error reason;
  if (read_reason_payload(&unit_, data, length, reason)) reason = caf::exit_reason::unknown;
  proxies_.erase(p.id, h.sender, std::move(reason));
}

void node_state::on_link(const peer& p, const frame_header& h, bool linked) {
  // A link to an actor that is gone needs nothing: the remote proxy's down frame is under way.
  auto local = sys_.registry().get(h.receiver);
  auto remote = proxies_.get_or_put(p.id, h.sender);
  if (!local || !remote) return;
  auto* proxy = static_cast<caf::actor_proxy*>(caf::actor_cast<caf::abstract_actor*>(remote));
  if (linked) {
    proxy->add_link(local->get());
  } else {
    proxy->remove_link(local->get());
  }
}

// -- lookups -------------------------------------------------------------------------------------

void node_state::on_lookup(const std::shared_ptr<peer>& p, const frame_header& h,
                           const void* data, size_t length) {
  if (length > max_name_length) {
    violation(p, "lookup name too long");
    return;
  }
  const std::string name(static_cast<const char*>(data), length);
  published_actor found;
  {
    std::lock_guard<std::mutex> g(mtx_);
    auto it = names_.find(name);
    if (it != names_.end()) found = it->second;
  }
  outgoing* item = new_frame(p, frame_kind::lookup_reply);
  item->header.message_id = h.message_id;
  if (found.handle) {
    make_reachable(caf::actor_cast<caf::strong_actor_ptr>(found.handle));
    item->header.receiver = found.handle.id();
    encode_interface(found.ifs, item->payload);
  } else {
    item->header.status = static_cast<int16_t>(comm::status::no_elem);
  }
  submit(item);
}

void node_state::on_lookup_reply(const std::shared_ptr<peer>& p, const frame_header& h,
                                 const void* data, size_t length) {
  auto it = p->asked.find(h.message_id);
  if (it == p->asked.end()) return;
  auto call = std::move(it->second);
  p->asked.erase(it);
  if (h.receiver == caf::invalid_actor_id) {
    const auto st = h.status < 0 ? static_cast<comm::status>(h.status) : comm::status::no_elem;
    call->complete(make_error(st));
    return;
  }
  interface published;
  if (!decode_interface(data, length, published)) {
    call->complete(make_error(comm::status::protocol_error));
    violation(p, "malformed interface in a lookup reply");
    return;
  }
  auto proxy = proxies_.get_or_put(p->id, h.receiver);
  if (!proxy) {
    call->complete(make_error(comm::status::not_connected));
    return;
  }
  call->complete(checked(caf::actor_cast<caf::actor>(proxy), published, *call));
}

namespace {

/// "{a, b}" for an interface, "{}" for none.
std::string describe(const interface& ifs) {
  std::string out = "{";
  for (const auto& signature : ifs) {
    if (out.size() > 1) out += ", ";
    out += signature;
  }
  return out + "}";
}

}  // namespace

caf::expected<caf::actor> node_state::checked(const caf::actor& found, const interface& published,
                                              const lookup_call& call) const {
  if (call.expected.empty() || sys_.assignable(published, call.expected)) return found;
  const std::string what =
      published.empty()
          ? "\"" + call.name + "\" was not published as a typed actor; expected " +
                describe(call.expected)
          : "\"" + call.name + "\" was published as " + describe(published) + "; expected " +
                describe(call.expected);
  return caf::make_error(caf::sec::unexpected_actor_messaging_interface, what);
}

void node_state::violation(const std::shared_ptr<peer>& p, const char* what) {
  COMM_LOG(error, "actors", "connection %llu: %s; closed",
           static_cast<unsigned long long>(p->serial), what);
  fail_peer(p, comm::status::protocol_error);
}

}  // namespace comm::actors::detail
