#include "tcp/tcp_ep.hpp"

#include "tcp/tcp_iface.hpp"

#include <comm/log.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";
constexpr uint32_t base_events = EPOLLIN | EPOLLRDHUP;
constexpr uint32_t out_events = EPOLLOUT;
const uint64_t zero_padding = 0;

bool would_block(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

}  // namespace

tcp_ep::tcp_ep(tcp_iface& owner, int fd, bool connected, uint32_t peer_ip, const iface_addr& peer)
    : owner_(owner),
      fd_(fd),
      connecting_(!connected),
      tx_(send_buffer_size),
      acks_in_(64 * ack_size),
      zring_(new zcopy_slot[max_unacked_zcopy]),
      window_(peer.window),
      peer_ip_(peer_ip),
      peer_(peer),
      target_{poll_target::kind::endpoint, this} {
  owner_.write_hello(peer.iface_id, tx_.reserve(hello_size));
  tx_.commit(hello_size);
  out_watched_ = connecting_;
  if (!owner_.watch(fd_, base_events | (connecting_ ? out_events : 0u), &target_)) {
    failure_ = status::io_error;  // create_ep discards us
    return;
  }
  if (!connecting_) write_queued();
}

tcp_ep::~tcp_ep() {
  // Zcopy operations still in flight are dropped without calling their completions.
  owner_.forget(this);
  if (fd_ < 0) return;
  owner_.unwatch(fd_, &target_);
  // What was accepted still goes out, and acknowledgements still to come must be read, or the
  // kernel would reset the connection and drop what it holds: the interface closes it gracefully.
  byte_queue rest = leftovers();
  if (rest.empty() && zacked_ == zissued_ && !connecting_) {
    ::close(fd_);
  } else {
    owner_.linger(fd_, connecting_, std::move(rest));
  }
}

byte_queue tcp_ep::leftovers() {
  size_t bytes = tx_.size();
  if (zcopy_queued_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) bytes += zop_.vec[i].iov_len;
  }
  if (bytes == 0) return {};
  byte_queue out(bytes);
  uint8_t* dest = out.reserve(bytes);
  std::memcpy(dest, tx_.data(), tx_.size());
  size_t offset = tx_.size();
  if (zcopy_queued_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) {
      std::memcpy(dest + offset, zop_.vec[i].iov_base, zop_.vec[i].iov_len);
      offset += zop_.vec[i].iov_len;
    }
  }
  out.commit(bytes);
  return out;
}

// -- sends ----------------------------------------------------------------------------------------

inline status tcp_ep::refusal() const {
  if (broken()) [[unlikely]] return failure_;
  if (zcopy_queued_ || !window_open() || pending_.blocks_sends()) [[unlikely]] {
    ++owner_.counters().no_resource;
    return status::no_resource;
  }
  return status::ok;
}

inline size_t tcp_ep::put_frame_header(am_id id, size_t length, bool ack, uint8_t* dest) {
  auto& writer = owner_.frame_writer();
  writer.fields().setAmId(id);
  writer.fields().setLength(static_cast<uint32_t>(length));
  writer.fields().setAckRequested(ack);
  return writer.copy_to(dest);
}

inline void tcp_ep::commit_frame(uint8_t* frame, size_t length) {
  std::memset(frame + frame_header_size + length, 0, pad8(length) - length);
  tx_.commit(frame_size(length));
  ++frames_sent_;
  ++owner_.counters().messages_sent;
  if (!out_watched_) write_queued();  // else EPOLLOUT (or the connect) comes first
}

status tcp_ep::am_short(am_id id, const void* header, size_t header_length, const void* payload,
                        size_t payload_length) {
  const size_t length = header_length + payload_length;
  if (length > max_short || id >= am_id_count) [[unlikely]] return status::invalid_param;
  if (const status st = refusal(); st != status::ok) [[unlikely]] return st;
  uint8_t* dest = tx_.reserve(frame_size(length));
  if (dest == nullptr) [[unlikely]] {
    ++owner_.counters().no_resource;
    return status::no_resource;
  }
  const size_t offset = put_frame_header(id, length, false, dest);
  if (header_length != 0) std::memcpy(dest + offset, header, header_length);
  if (payload_length != 0) std::memcpy(dest + offset + header_length, payload, payload_length);
  commit_frame(dest, length);
  return status::ok;
}

ssize_t tcp_ep::am_bcopy(am_id id, pack_fn pack, void* arg) {
  if (id >= am_id_count) [[unlikely]] return static_cast<ssize_t>(status::invalid_param);
  if (const status st = refusal(); st != status::ok) [[unlikely]] {
    return static_cast<ssize_t>(st);
  }
  uint8_t* dest = tx_.reserve(frame_size(max_bcopy));
  if (dest == nullptr) {
    ++owner_.counters().no_resource;
    return static_cast<ssize_t>(status::no_resource);
  }
  const size_t length = pack(dest + frame_header_size, arg);
  if (length > max_bcopy) [[unlikely]] {
    COMM_LOG(error, log_name, "am_bcopy: pack wrote %zu bytes, more than max_bcopy %zu", length,
             max_bcopy);
    return static_cast<ssize_t>(status::invalid_param);
  }
  put_frame_header(id, length, false, dest);
  commit_frame(dest, length);
  return static_cast<ssize_t>(length);
}

status tcp_ep::am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                        size_t count, completion* comp) {
  if (id >= am_id_count || header_length > max_hdr || count > max_iov) [[unlikely]] {
    return status::invalid_param;
  }
  if (const status st = refusal(); st != status::ok) return st;
  if (zissued_ - zacked_ >= max_unacked_zcopy) {
    ++owner_.counters().no_resource;
    return status::no_resource;
  }
  if (!prepare_zcopy(id, header, header_length, entries, count)) return status::invalid_param;
  ++frames_sent_;
  zring_[zissued_ & (max_unacked_zcopy - 1)] = {frames_sent_, comp};
  ++zissued_;
  zcopy_queued_ = true;
  ++owner_.counters().messages_sent;
  if (!out_watched_) write_queued();  // else EPOLLOUT (or the connect) comes first
  return status::in_progress;  // completed by the peer's ack, or with the failure
}

bool tcp_ep::prepare_zcopy(am_id id, const void* header, size_t header_length,
                           const iov* entries, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length > max_zcopy - total) return false;
    total += entries[i].length;
  }
  const size_t length = header_length + total;
  const size_t offset = put_frame_header(id, length, true, zop_.head);
  if (header_length != 0) std::memcpy(zop_.head + offset, header, header_length);
  zop_.count = 0;
  zop_.first = 0;
  zop_.written = 0;
  zop_.vec[zop_.count++] = {zop_.head, offset + header_length};
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length == 0) continue;
    zop_.vec[zop_.count++] = {const_cast<void*>(entries[i].buffer), entries[i].length};
  }
  if (const size_t pad = pad8(length) - length; pad != 0) {
    zop_.vec[zop_.count++] = {const_cast<uint64_t*>(&zero_padding), pad};
  }
  return true;
}

// -- writing --------------------------------------------------------------------------------------

void tcp_ep::write_queued() {
  iovec vec[max_iov + 3];
  size_t n = 0;
  if (!tx_.empty()) vec[n++] = {tx_.data(), tx_.size()};
  if (zcopy_queued_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) vec[n++] = zop_.vec[i];
  }
  if (n != 0) {
    msghdr message{};
    message.msg_iov = vec;
    message.msg_iovlen = n;
    const ssize_t sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && !would_block(errno)) {
      broke(status::connection_reset, "send", errno);
      return;
    }
    if (sent > 0) {
      owner_.counters().bytes_sent += static_cast<size_t>(sent);
      consume_written(static_cast<size_t>(sent));
    }
    if (!tx_.empty() || zcopy_queued_) ++owner_.counters().would_block;
  }
  update_interest();
}

void tcp_ep::consume_written(size_t sent) {
  const size_t from_buffer = std::min(sent, tx_.size());
  tx_.consume(from_buffer);
  sent -= from_buffer;
  if (!zcopy_queued_ || sent == 0) return;
  zop_.written += sent;
  while (sent != 0 && zop_.first < zop_.count) {
    iovec& entry = zop_.vec[zop_.first];
    if (sent >= entry.iov_len) {
      sent -= entry.iov_len;
      ++zop_.first;
    } else {
      entry.iov_base = static_cast<uint8_t*>(entry.iov_base) + sent;
      entry.iov_len -= sent;
      sent = 0;
    }
  }
  if (zop_.first == zop_.count) zcopy_queued_ = false;  // now it waits for its ack
}

void tcp_ep::update_interest() {
  if (fd_ < 0) return;
  const bool want = connecting_ || !tx_.empty() || zcopy_queued_;
  if (want == out_watched_) return;
  out_watched_ = want;
  owner_.rewatch(fd_, base_events | (want ? out_events : 0u), &target_);
}

// -- events, pending, flush, failure --------------------------------------------------------------

unsigned tcp_ep::on_events(uint32_t events) {
  if (broken()) return 0;
  if (connecting_) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return 0;
    if (!finish_connect()) return 1;
    events |= EPOLLOUT;
  }
  unsigned advanced = 0;
  if (events & EPOLLERR) {
    const int error = socket_error(fd_);
    broke(status::connection_reset, "socket error", error != 0 ? error : EIO);
    return 1;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) {
    advanced += read_acks();
    if (broken()) return advanced + 1;
  }
  if (events & EPOLLOUT) {
    write_queued();
    if (broken()) return advanced + 1;
  }
  return advanced + after_progress();
}

bool tcp_ep::finish_connect() {
  const int error = socket_error(fd_);
  if (error != 0) {
    broke(status_of_errno(error, true), "connect", error);
    return false;
  }
  connecting_ = false;
  return true;
}

unsigned tcp_ep::read_acks() {
  unsigned completed = 0;
  for (int round = 0; round < 4; ++round) {
    const size_t room = acks_in_.tail_room(ack_size);
    const ssize_t got = ::recv(fd_, acks_in_.tail(), room, MSG_DONTWAIT);
    if (got < 0 && would_block(errno)) break;
    if (got <= 0) {
      broke(status::connection_reset, got == 0 ? "the peer closed the connection" : "receive",
            got == 0 ? 0 : errno);
      break;
    }
    acks_in_.commit(static_cast<size_t>(got));
    if (!take_acks(&completed)) break;
    if (static_cast<size_t>(got) < room) break;
  }
  return completed;
}

bool tcp_ep::take_acks(unsigned* completed) {
  for (;;) {
    size_t consumed = 0;
    uint64_t delivered = 0;
    const parse_result r = parse_ack(acks_in_.data(), acks_in_.size(), &consumed, &delivered);
    if (r == parse_result::incomplete) return true;
    if (r == parse_result::garbage || delivered < frames_delivered_ || delivered > frames_sent_) {
      ++owner_.counters().malformed;
      broke(status::connection_reset, "the peer sent a bad acknowledgement", 0);
      return false;
    }
    acks_in_.consume(consumed);
    frames_delivered_ = delivered;
    *completed += complete_delivered();
  }
}

unsigned tcp_ep::complete_delivered() {
  unsigned completed = 0;
  while (zacked_ < zissued_) {
    const zcopy_slot slot = zring_[zacked_ & (max_unacked_zcopy - 1)];
    if (slot.frame > frames_delivered_) break;
    ++zacked_;
    ++completed;
    if (slot.comp != nullptr) complete(slot.comp, status::ok);  // may send on this endpoint
  }
  return completed;
}

unsigned tcp_ep::after_progress() {
  unsigned events = 0;
  if (!flushes_.empty() && idle()) {
    std::vector<completion*> done;
    done.swap(flushes_);
    for (completion* comp : done) complete(comp, status::ok);
    events += static_cast<unsigned>(done.size());
  }
  if (!pending_.empty() && !broken() && has_room()) {
    events += pending_.dispatch();
    // Requests that re-parked during the dispatch with room left get another turn next time.
    if (!pending_.empty() && !broken() && has_room()) owner_.redispatch(this);
  }
  return events;
}

unsigned tcp_ep::dispatch_pending() { return after_progress(); }

status tcp_ep::pending_add(pending_req* req) {
  if (broken()) return failure_;
  if (pending_.empty() && !pending_.dispatching() && has_room()) return status::busy;
  pending_.push_back(req);
  return status::ok;
}

void tcp_ep::pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) {
  pending_.purge(cb, arg);
}

status tcp_ep::flush(completion* comp) {
  if (broken()) return failure_;
  if (idle()) return status::ok;
  if (comp != nullptr) flushes_.push_back(comp);
  return status::in_progress;
}

void tcp_ep::broke(status reason, const char* why, int error) {
  if (broken()) return;
  failure_ = reason;
  COMM_LOG(info, log_name, "connection to %s:%u failed: %s%s%s", ipv4_text(peer_ip_).c_str(),
           unsigned{peer_.port}, why, error != 0 ? ": " : "",
           error != 0 ? std::strerror(error) : "");
  owner_.unwatch(fd_, &target_);
  ::close(fd_);
  fd_ = -1;
  tx_.clear();
  owner_.notice_failure(this);
}

void tcp_ep::fail(status reason) {
  zcopy_queued_ = false;
  while (zacked_ < zissued_) {
    completion* comp = zring_[zacked_ & (max_unacked_zcopy - 1)].comp;
    ++zacked_;
    if (comp != nullptr) complete(comp, reason);
  }
  std::vector<completion*> flushes;
  flushes.swap(flushes_);
  for (completion* comp : flushes) complete(comp, reason);
}

std::string tcp_ep::describe() const {
  std::string text = ipv4_text(peer_ip_) + ":" + std::to_string(peer_.port);
  if (broken()) return text + " failed (" + to_string(failure_) + ")";
  text += connecting_ ? " connecting" : " connected";
  if (!tx_.empty()) text += ", " + std::to_string(tx_.size()) + " bytes buffered";
  if (zcopy_queued_) text += ", a zcopy frame half written";
  if (zissued_ != zacked_) {
    text += ", " + std::to_string(zissued_ - zacked_) + " zcopy unacknowledged";
  }
  if (!window_open()) text += ", window full";
  if (!pending_.empty()) text += ", requests parked";
  return text;
}

}  // namespace comm::tl::tcp
