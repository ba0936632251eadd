#include "tcp/tcp_conn.hpp"

#include "tcp/tcp_ep.hpp"
#include "tcp/tcp_iface.hpp"

#include <comm/log.hpp>

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";
constexpr uint32_t base_events = EPOLLIN | EPOLLRDHUP;
/// Bytes of the handshake records one side writes (hello + proof, or challenge + welcome).
constexpr size_t handshake_out_size = 256;
static_assert(hello_size + proof_record_size <= handshake_out_size);
static_assert(challenge_size + welcome_size <= handshake_out_size);
/// A handshake must be over by then; a connector told "duplicate" waits as long for the peer's.
constexpr uint64_t handshake_timeout_ns = 10'000'000'000;
/// The roles in the proofs (base/auth.hpp): each side proves the key against the other's nonce.
constexpr std::string_view connector_role = "comm tcp connector";
constexpr std::string_view acceptor_role = "comm tcp acceptor";
const uint64_t zero_padding = 0;

bool would_block(int error) { return error == EAGAIN || error == EWOULDBLOCK || error == EINTR; }

/// Bytes one read into the receive buffer asks for when no known frame needs more.
constexpr size_t read_batch = 64 * 1024;

/// Moves `*first` past `bytes` of the entries `vec[*first..count)`, cutting the front off an
/// entry done in part.
void advance_iov(iovec* vec, size_t count, size_t* first, size_t bytes) {
  while (bytes != 0 && *first < count) {
    iovec& entry = vec[*first];
    if (bytes >= entry.iov_len) {
      bytes -= entry.iov_len;
      ++*first;
    } else {
      entry.iov_base = static_cast<uint8_t*>(entry.iov_base) + bytes;
      entry.iov_len -= bytes;
      bytes = 0;
    }
  }
}

}  // namespace

// -- construction ---------------------------------------------------------------------------------

tcp_conn::tcp_conn(tcp_iface& owner, int fd, bool connected, const ip_address& peer_ip,
                   const iface_addr& peer, uint64_t now_ns)
    : owner_(owner),
      fd_(fd),
      role_(role::connector),
      phase_(connected ? phase::handshake : phase::connecting),
      started_ns_(now_ns),
      peer_ip_(peer_ip),
      peer_port_(peer.port),
      peer_id_(peer.iface_id),
      listen_ip_(peer_ip),
      listen_port_(peer.port),
      window_(peer.window),
      own_nonce_(auth::make_nonce()),
      hs_out_(handshake_out_size),
      tx_(send_buffer_size + control_room),
      in_(receive_buffer_size),
      target_{poll_target::kind::connection, this} {
  owner_.writer().hello(owner_.port(), owner_.address(), owner_.id(), peer_id_, owner_.window(),
                        own_nonce_.data(), hs_out_.reserve(hello_size));
  hs_out_.commit(hello_size);
  out_watched_ = true;  // the connect, or the hello to write
  if (!owner_.watch(fd_, base_events | EPOLLOUT, &target_)) {
    phase_ = phase::finished;  // create_ep discards us
    return;
  }
  if (phase_ == phase::handshake) write_queued();
}

tcp_conn::tcp_conn(tcp_iface& owner, int fd, const ip_address& peer_ip, uint16_t peer_port,
                   uint64_t now_ns)
    : owner_(owner),
      fd_(fd),
      role_(role::acceptor),
      phase_(phase::handshake),
      started_ns_(now_ns),
      peer_ip_(peer_ip),
      peer_port_(peer_port),
      own_nonce_(auth::make_nonce()),
      keyed_(!owner.auth_key().empty()),
      hs_out_(handshake_out_size),
      tx_(send_buffer_size + control_room),
      in_(receive_buffer_size),
      target_{poll_target::kind::connection, this} {
  owner_.writer().challenge(owner_.id(), keyed_, own_nonce_.data(),
                            hs_out_.reserve(challenge_size));
  hs_out_.commit(challenge_size);
  if (!owner_.watch(fd_, base_events, &target_)) {
    phase_ = phase::finished;  // the interface discards us
    return;
  }
  write_queued();  // the challenge goes right after accept
}

tcp_conn::~tcp_conn() {
  if (large_) owner_.give_frame_buffer(std::move(large_), large_capacity_);
  if (fd_ >= 0) ::close(fd_);
}

// -- endpoints ------------------------------------------------------------------------------------

template <class F>
void tcp_conn::for_each_ep(F&& f) {
  ++iterating_;
  for (size_t i = 0; i < eps_.size(); ++i) {
    if (eps_[i] != nullptr) f(eps_[i]);
  }
  if (--iterating_ == 0 && holes_ != 0) {
    eps_.erase(std::remove(eps_.begin(), eps_.end(), nullptr), eps_.end());
    holes_ = 0;
  }
}

void tcp_conn::attach(tcp_ep* ep) {
  eps_.push_back(ep);
  had_eps_ = true;
}

void tcp_conn::detach(tcp_ep* ep) {
  if (zcopy_queued_ && zop_owner_ == ep) own_zcopy_rest();
  orphan_rma(ep);
  auto it = std::find(eps_.begin(), eps_.end(), ep);
  if (it == eps_.end()) return;
  if (iterating_ != 0) {
    *it = nullptr;
    ++holes_;
  } else {
    eps_.erase(it);
  }
  if (endpoints() == 0) maybe_bye();
}

void tcp_conn::own_zcopy_rest() {
  size_t bytes = 0;
  for (size_t i = zop_.first; i < zop_.count; ++i) bytes += zop_.vec[i].iov_len;
  auto copy = std::make_unique<uint8_t[]>(bytes);
  size_t offset = 0;
  for (size_t i = zop_.first; i < zop_.count; ++i) {
    std::memcpy(copy.get() + offset, zop_.vec[i].iov_base, zop_.vec[i].iov_len);
    offset += zop_.vec[i].iov_len;
  }
  zop_.vec[0] = {copy.get(), bytes};
  zop_.first = 0;
  zop_.count = 1;
  zop_copy_ = std::move(copy);
  zop_owner_ = nullptr;
}

// -- sending --------------------------------------------------------------------------------------

size_t tcp_conn::put_header(am_id id, size_t length, bool ack, uint8_t* dest) {
  ack_sent_ = delivered_;
  ack_urgent_ = false;
  return owner_.writer().frame(frame_kind::message, id, length, ack, delivered_, dest);
}

void tcp_conn::commit_message(uint8_t* frame, size_t length) {
  std::memset(frame + frame_header_size + length, 0, pad8(length) - length);
  tx_.commit(frame_size(length));
  ++frames_sent_;
  ++owner_.counters().messages_sent;
  if (!out_watched_ && phase_ == phase::open) write_queued();  // else EPOLLOUT comes first
}

uint64_t tcp_conn::queue_zcopy(tcp_ep* by, am_id id, const void* header, size_t header_length,
                               const iov* entries, size_t count, size_t total) {
  const size_t length = header_length + total;
  const size_t offset = put_header(id, length, true, zop_.head);
  if (header_length != 0) std::memcpy(zop_.head + offset, header, header_length);
  queue_zcopy_frame(offset + header_length, entries, count);
  zop_owner_ = by;
  ++frames_sent_;
  ++owner_.counters().messages_sent;
  const uint64_t number = frames_sent_;
  if (!out_watched_ && phase_ == phase::open) write_queued();
  return number;
}

void tcp_conn::queue_zcopy_frame(size_t head, const iov* entries, size_t count) {
  zop_.count = 0;
  zop_.first = 0;
  zop_.vec[zop_.count++] = {zop_.head, head};
  size_t length = head;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length == 0) continue;
    zop_.vec[zop_.count++] = {const_cast<void*>(entries[i].buffer), entries[i].length};
    length += entries[i].length;
  }
  if (const size_t pad = pad8(length) - length; pad != 0) {
    zop_.vec[zop_.count++] = {const_cast<uint64_t*>(&zero_padding), pad};
  }
  zcopy_queued_ = true;
}

void tcp_conn::write_queued() {
  if (fd_ < 0 || phase_ == phase::connecting || phase_ == phase::finished) return;
  iovec vec[max_iov + 4];
  size_t n = 0;
  if (!hs_out_.empty()) vec[n++] = {hs_out_.data(), hs_out_.size()};
  if (phase_ == phase::open) {
    if (!tx_.empty()) vec[n++] = {tx_.data(), tx_.size()};
    if (zcopy_queued_) {
      for (size_t i = zop_.first; i < zop_.count; ++i) vec[n++] = zop_.vec[i];
    }
  }
  if (n != 0) {
    ssize_t sent;
    if (n == 1) {
      sent = ::send(fd_, vec[0].iov_base, vec[0].iov_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } else {
      msghdr message{};
      message.msg_iov = vec;
      message.msg_iovlen = n;
      sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (sent < 0 && !would_block(errno)) {
      fail(status_of_errno(errno, false), "send", errno);
      return;
    }
    if (sent > 0) {
      owner_.counters().bytes_sent += static_cast<size_t>(sent);
      consume_written(static_cast<size_t>(sent));
      owner_.expect_answers();
    }
    if (!hs_out_.empty() || (phase_ == phase::open && (!tx_.empty() || zcopy_queued_))) {
      ++owner_.counters().would_block;
    }
  }
  update_interest();
}

void tcp_conn::consume_written(size_t sent) {
  const size_t from_handshake = std::min(sent, hs_out_.size());
  hs_out_.consume(from_handshake);
  sent -= from_handshake;
  const size_t from_buffer = std::min(sent, tx_.size());
  tx_.consume(from_buffer);
  sent -= from_buffer;
  if (!zcopy_queued_ || sent == 0) return;
  advance_iov(zop_.vec, zop_.count, &zop_.first, sent);
  if (zop_.first == zop_.count) {  // now it waits for its ack (a message) or the answer (rma)
    zcopy_queued_ = false;
    zop_owner_ = nullptr;
    zop_answer_ = false;
    zop_copy_.reset();
  }
}

void tcp_conn::update_interest() {
  if (fd_ < 0 || phase_ == phase::finished) return;
  const bool want = phase_ == phase::connecting || !hs_out_.empty() ||
                    (phase_ == phase::open && (!tx_.empty() || zcopy_queued_));
  if (want == out_watched_) return;
  out_watched_ = want;
  owner_.rewatch(fd_, base_events | (want ? uint32_t{EPOLLOUT} : 0u), &target_);
}

bool tcp_conn::ack_due() const {
  const uint64_t unacked = delivered_ - ack_sent_;
  return unacked != 0 && (ack_urgent_ || unacked >= owner_.window() / 2);
}

bool tcp_conn::append_control(frame_kind kind, bool ask) {
  // Never behind a half-written zcopy frame: the record would land inside it.
  uint8_t* dest = zcopy_queued_ ? nullptr : tx_.reserve(frame_header_size);
  if (dest == nullptr) return false;  // the records in the buffer carry `delivered` meanwhile
  owner_.writer().frame(kind, 0, 0, ask, delivered_, dest);
  tx_.commit(frame_header_size);
  ack_sent_ = delivered_;
  ack_urgent_ = false;
  return true;
}

void tcp_conn::send_ack_if_due() {
  if (!ack_due() || !append_control(frame_kind::ack, false)) return;
  ++owner_.counters().acks_sent;
  if (!out_watched_) write_queued();
}

void tcp_conn::maybe_bye() {
  if (bye_sent_ || phase_ != phase::open || endpoints() != 0) return;
  if (!had_eps_ && !bye_received_) return;  // the peer may still open endpoints on it
  if (!append_control(frame_kind::bye, false)) return;  // after every message
  bye_sent_ = true;
  owner_.unmap(this);  // new endpoints to the peer open a new connection
  COMM_LOG(debug, log_name, "connection %s: no endpoints left, bye", describe().c_str());
  if (!out_watched_) write_queued();
}

byte_queue tcp_conn::leftovers() {
  size_t bytes = hs_out_.size() + tx_.size();
  if (zcopy_queued_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) bytes += zop_.vec[i].iov_len;
  }
  if (bytes == 0) return {};
  byte_queue out(bytes);
  uint8_t* dest = out.reserve(bytes);
  std::memcpy(dest, hs_out_.data(), hs_out_.size());
  size_t offset = hs_out_.size();
  std::memcpy(dest + offset, tx_.data(), tx_.size());
  offset += tx_.size();
  if (zcopy_queued_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) {
      std::memcpy(dest + offset, zop_.vec[i].iov_base, zop_.vec[i].iov_len);
      offset += zop_.vec[i].iov_len;
    }
  }
  out.commit(bytes);
  return out;
}

void tcp_conn::close_gracefully() {
  COMM_LOG(debug, log_name, "connection %s: both sides said bye, closing", describe().c_str());
  owner_.unwatch(fd_, &target_);
  owner_.linger(fd_, leftovers());
  fd_ = -1;
  finish();
}

// -- progress -------------------------------------------------------------------------------------

unsigned tcp_conn::on_events(uint32_t events) {
  if (phase_ == phase::finished || fd_ < 0) return 0;
  if (phase_ == phase::connecting) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return 0;
    finish_connect();
    if (phase_ != phase::handshake) return 0;
    events |= EPOLLOUT;
  }
  unsigned delivered = 0;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    delivered = on_readable();
    if (phase_ == phase::finished || fd_ < 0) return delivered;
  }
  if (events & EPOLLOUT) write_queued();
  return delivered;
}

void tcp_conn::finish_connect() {
  const int error = socket_error(fd_);
  if (error != 0) {
    fail(status_of_errno(error, true), "connect", error);
    return;
  }
  phase_ = phase::handshake;
  write_queued();
}

unsigned tcp_conn::after_io() {
  unsigned events = 0;
  if (phase_ == phase::finished) return 0;
  if (phase_ == phase::open) {
    if (!answers_.empty()) send_rma_answers();
    if (!rma_waiting_.empty()) send_rma_requests();
  }
  if (!rma_done_.empty()) {
    std::vector<rma_result> done;
    done.swap(rma_done_);
    for (const rma_result& r : done) r.ep->rma_done(r.comp, r.result);  // may issue more
    events += static_cast<unsigned>(done.size());
    if (phase_ == phase::finished) return events;
  }
  if (acks_advanced_) {
    acks_advanced_ = false;
    for_each_ep([&](tcp_ep* ep) { events += ep->complete_delivered(peer_delivered_); });
    if (phase_ == phase::finished) return events;
  }
  if (phase_ == phase::open) {
    send_ack_if_due();
    maybe_bye();
    if (bye_sent_ && bye_received_ && phase_ == phase::open) {
      close_gracefully();
      return events;
    }
  }
  if (endpoints() != 0) for_each_ep([&](tcp_ep* ep) { events += ep->after_progress(); });
  return events;
}

void tcp_conn::finish() {
  phase_ = phase::finished;
  owner_.unmap(this);  // no endpoint may attach to it any more
  owner_.reap(this);
}

void tcp_conn::fail(status reason, const char* why, int error) {
  if (phase_ == phase::finished) return;
  if (why != nullptr) {
    COMM_LOG(info, log_name, "connection %s failed: %s%s%s", describe().c_str(), why,
             error != 0 ? ": " : "", error != 0 ? std::strerror(error) : "");
  }
  phase_ = phase::finished;
  owner_.unmap(this);
  zcopy_queued_ = false;
  zop_owner_ = nullptr;
  zop_answer_ = false;
  fail_rma(reason);
  for_each_ep([&](tcp_ep* ep) { ep->conn_failed(reason); });
  if (iterating_ != 0) {
    for (tcp_ep*& ep : eps_) {
      if (ep != nullptr) {
        ep = nullptr;
        ++holes_;
      }
    }
  } else {
    eps_.clear();
    holes_ = 0;
  }
  owner_.reap(this);
}

bool tcp_conn::check_deadline(uint64_t now_ns) {
  if (phase_ == phase::connecting || phase_ == phase::handshake) {
    if (now_ns - started_ns_ <= handshake_timeout_ns) return false;
    if (role_ == role::connector) {
      fail(status::unreachable, "no handshake within 10 s", 0);
      return true;
    }
    if (hello_done_ && keyed_) {
      ++owner_.counters().auth_failures;
      COMM_LOG(warn, log_name, "connection %s closed: no proof of the key within 10 s",
               describe().c_str());
    } else {
      ++owner_.counters().malformed;
      COMM_LOG(warn, log_name, "connection %s closed: no hello within 10 s", describe().c_str());
    }
    finish();
    return true;
  }
  if (phase_ == phase::awaiting && now_ns > deadline_ns_) {
    fail(status::unreachable, "the peer's own connection did not come within 10 s", 0);
    return true;
  }
  return false;
}

// -- liveness -------------------------------------------------------------------------------------

bool tcp_conn::check_liveness(uint64_t now_ns) {
  if (phase_ != phase::open || fd_ < 0) return false;
  peer_answers answers;
  if (read_peer_answers(fd_, &answers) && host_silent(answers)) return false;
  const bool undelivered = frames_sent_ != peer_delivered_;
  const bool stall_bounded = owner_.config().stall_timeout_s != 0;
  if (stall_bounded && peer_stalled(now_ns, undelivered)) return false;
  return answers.waiting || (stall_bounded && undelivered);
}

bool tcp_conn::host_silent(const peer_answers& answers) {
  const bool silent = answers.waiting && answers.asking &&
                      answers.silent_ms >= owner_.config().silence_limit_ms();
  silent_checks_ = silent ? silent_checks_ + 1 : 0;
  if (silent_checks_ < 2) return false;  // a probe sent just before this check may be answered
  ++owner_.counters().silent_hosts;
  const std::string why =
      "the peer's host answered nothing for " + std::to_string(answers.silent_ms) + " ms";
  fail(status::endpoint_timeout, why.c_str(), 0);
  return true;
}

bool tcp_conn::peer_stalled(uint64_t now_ns, bool undelivered) {
  if (!undelivered || peer_delivered_ != delivered_seen_) {
    delivered_seen_ = peer_delivered_;
    progress_ns_ = now_ns;
    heartbeat_sent_ = false;
    return false;
  }
  // The timer did not run while nothing waited: the wait began when it started again at the
  // earliest.
  const uint64_t since = std::max(progress_ns_, owner_.timer_started_ns());
  if (now_ns - since >= owner_.config().stall_timeout_ns()) {
    ++owner_.counters().stalled_peers;
    fail(status::endpoint_timeout, "the peer delivered none of our messages within "
                                   "COMM_TCP_STALL_TIMEOUT", 0);
    return true;
  }
  if (!heartbeat_sent_ && append_control(frame_kind::ack, true)) {
    heartbeat_sent_ = true;
    ++owner_.counters().heartbeats_sent;
    if (!out_watched_) write_queued();
  }
  return false;
}

// -- reading --------------------------------------------------------------------------------------

unsigned tcp_conn::on_readable() {
  unsigned delivered = 0;
  if (!in_.empty()) {
    delivered = deliver_buffered();  // leftovers first, so the buffer has room
    if (phase_ == phase::finished || fd_ < 0 || has_frames()) return delivered;
  }
  if (sink_.active) {
    if (read_sink()) finish_sink();
    return delivered;
  }
  if (large_total_ != 0) {
    if (read_large()) delivered += finish_large();
    return delivered;
  }
  if (!read_small()) return delivered;
  delivered += deliver_buffered();
  // A large frame or rma data began: its bytes are likely there.
  if (large_total_ != 0 && fd_ >= 0 && read_large()) delivered += finish_large();
  if (sink_.active && fd_ >= 0 && read_sink()) finish_sink();
  return delivered;
}

bool tcp_conn::read_small() {
  // Room for the rest of a known incomplete message frame, else for a good batch of small ones;
  // the data of an rma frame is not read here beyond what comes with its header (see sink_).
  size_t need = read_batch;
  parsed_frame f;
  if (phase_ == phase::open &&
      parse_frame_header(in_.data(), in_.size(), &f) == parse_result::frame &&
      f.total > in_.size() && !is_rma(f.kind)) {
    need = std::max(need, f.total - in_.size());
  }
  const size_t room = std::min(in_.tail_room(need), need);
  const ssize_t got = ::recv(fd_, in_.tail(), room, MSG_DONTWAIT);
  if (!account(got)) return false;
  in_.commit(static_cast<size_t>(got));
  return true;
}

bool tcp_conn::read_large() {
  auto* base = reinterpret_cast<uint8_t*>(large_.get());
  const ssize_t got =
      ::recv(fd_, base + large_filled_, large_total_ - large_filled_, MSG_DONTWAIT);
  if (!account(got)) return false;
  large_filled_ += static_cast<size_t>(got);
  return large_filled_ == large_total_;
}

bool tcp_conn::account(ssize_t got) {
  if (got > 0) {
    owner_.counters().bytes_received += static_cast<size_t>(got);
    return true;
  }
  if (got < 0 && would_block(errno)) return false;
  const int error = got < 0 ? errno : 0;
  const char* why = error == 0 ? "the peer closed the connection" : "receive";
  const bool partial = !in_.empty() || large_total_ != 0;
  if (role_ == role::acceptor && phase_ == phase::handshake) {
    if (hello_done_ && keyed_) {
      ++owner_.counters().auth_failures;
      COMM_LOG(warn, log_name, "connection %s closed without proving the key",
               describe().c_str());
    } else {
      COMM_LOG(debug, log_name, "connection %s closed during the handshake", describe().c_str());
    }
    finish();
    return false;
  }
  if (phase_ == phase::open && endpoints() == 0) {
    // Nobody here sends on it: the peer went away (or closed after our bye); nothing fails.
    COMM_LOG(debug, log_name, "connection %s: %s%s", describe().c_str(), why,
             partial ? " in the middle of a frame" : "");
    finish();
    return false;
  }
  fail(error != 0 ? status_of_errno(error, false) : status::connection_reset, why, error);
  return false;
}

unsigned tcp_conn::deliver_buffered() {
  unsigned delivered = 0;
  unsigned records = 0;
  while (records < frames_per_call && phase_ != phase::finished && fd_ >= 0) {
    ++records;
    if (phase_ != phase::open) {
      if (!take_handshake_record()) break;
      continue;
    }
    parsed_frame f;
    const parse_result r = parse_frame_header(in_.data(), in_.size(), &f);
    if (r == parse_result::garbage) {
      garbage(f.problem);
      break;
    }
    if (r == parse_result::incomplete) break;
    if (is_rma(f.kind)) {
      if (!take_rma(f)) break;
      ++delivered;
      if (sink_.active) break;  // its data is read straight into memory
      continue;
    }
    if (f.total > in_.size()) {
      if (f.total > in_.capacity() / 2) start_large(f);
      break;
    }
    delivered += take_frame(f, in_.data());
    in_.consume(f.total);
    if (desc_kept_) {
      desc_kept_ = false;
      desc_pool& descs = owner_.descs();
      descs.lend(in_.replace_storage(descs.replacement(in_.capacity())), in_.capacity());
    }
  }
  return delivered;
}

bool tcp_conn::has_frames() const {
  if (phase_ == phase::finished || fd_ < 0 || in_.empty() || large_total_ != 0 || sink_.active) {
    return false;
  }
  if (phase_ != phase::open) {
    size_t bytes = 0;
    return record_extent(in_.data(), in_.size(), &bytes) != parse_result::incomplete;
  }
  parsed_frame f;
  const parse_result r = parse_frame_header(in_.data(), in_.size(), &f);
  if (r == parse_result::frame && is_rma(f.kind)) {
    parsed_rma rma;  // enough to start: the frame and rma headers
    const size_t after = in_.size() - std::min(in_.size(), f.header_bytes);
    return parse_rma(in_.data() + f.header_bytes, after, &f, &rma) != parse_result::incomplete;
  }
  return r == parse_result::garbage ||
         (r == parse_result::frame && (f.total <= in_.size() || f.total > in_.capacity() / 2));
}

bool tcp_conn::note_delivered(const parsed_frame& frame) {
  if (frame.delivered == peer_delivered_) return true;
  if (frame.delivered < peer_delivered_ || frame.delivered > frames_sent_) {
    garbage("a bad acknowledgement");
    return false;
  }
  peer_delivered_ = frame.delivered;
  acks_advanced_ = true;
  return true;
}

unsigned tcp_conn::take_frame(const parsed_frame& frame, uint8_t* start) {
  if (!note_delivered(frame)) return 0;
  switch (frame.kind) {
    case frame_kind::message:
      if (bye_received_) {
        garbage("a message after bye");
        return 0;
      }
      ++delivered_;
      ack_urgent_ = ack_urgent_ || frame.ack;
      desc_kept_ = owner_.deliver(frame.id, start + frame.header_bytes, frame.length);
      return 1;
    case frame_kind::ack:
      ack_urgent_ = ack_urgent_ || frame.ack;  // a heartbeat: the sender waits for our count
      return 0;
    case frame_kind::bye:
      if (bye_received_) {
        garbage("a second bye");
        return 0;
      }
      bye_received_ = true;
      return 0;
    default:
      return 0;  // rma frames go through take_rma
  }
}

void tcp_conn::start_large(const parsed_frame& frame) {
  large_ = owner_.take_frame_buffer(frame.total, &large_capacity_);
  std::memcpy(large_.get(), in_.data(), in_.size());
  large_frame_ = frame;
  large_total_ = frame.total;
  large_filled_ = in_.size();
  in_.clear();
}

unsigned tcp_conn::finish_large() {
  large_total_ = 0;
  const unsigned delivered = take_frame(large_frame_, reinterpret_cast<uint8_t*>(large_.get()));
  if (desc_kept_) {
    desc_kept_ = false;
    owner_.descs().lend(std::move(large_), large_capacity_);
  } else if (large_) {
    owner_.give_frame_buffer(std::move(large_), large_capacity_);
  }
  large_capacity_ = 0;
  return delivered;
}

void tcp_conn::garbage(const char* why) {
  ++owner_.counters().malformed;
  COMM_LOG(error, log_name, "connection %s closed: %s", describe().c_str(), why);
  if (endpoints() == 0) {
    finish();
  } else {
    fail(status::protocol_error, nullptr, 0);
  }
}

// -- put and get ----------------------------------------------------------------------------------

void tcp_conn::queue_rma(tcp_ep* by, bool write, const iov* entries, size_t count, uint32_t slot,
                         uint64_t generation, uint64_t address, uint64_t length,
                         completion* comp) {
  rma_op& op = rma_waiting_.emplace_back();
  op.ep = by;
  op.comp = comp;
  op.write = write;
  op.slot = slot;
  op.generation = generation;
  op.address = address;
  op.length = length;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].length != 0) op.entries[op.count++] = entries[i];
  }
  if (phase_ == phase::open) send_rma_requests();
}

uint8_t* tcp_conn::reserve_rma_record() {
  constexpr size_t bytes = frame_header_size + rma_header_size;
  return tx_.size() + bytes <= send_buffer_size ? tx_.reserve(bytes) : nullptr;
}

void tcp_conn::send_rma_requests() {
  bool queued = false;
  while (!rma_waiting_.empty() && rma_sent_.size() < max_rma_in_flight && !zcopy_queued_ &&
         fd_ >= 0) {
    rma_op& op = rma_waiting_.front();
    parsed_rma record;
    record.op = rma_numbered_ + 1;
    record.slot = op.slot;
    record.generation = op.generation;
    record.address = op.address;
    record.length = op.length;
    if (op.write) {
      const size_t head = owner_.writer().rma(frame_kind::rma_put, delivered_, record, op.length,
                                              zop_.head);
      queue_zcopy_frame(head, op.entries, op.count);
      zop_owner_ = op.ep;
    } else {
      uint8_t* dest = reserve_rma_record();
      if (dest == nullptr) break;
      owner_.writer().rma(frame_kind::rma_get, delivered_, record, 0, dest);
      tx_.commit(frame_header_size + rma_header_size);
    }
    ack_sent_ = delivered_;
    ack_urgent_ = false;
    op.number = ++rma_numbered_;
    ++owner_.counters().rma_requests;
    rma_sent_.push_back(op);
    rma_waiting_.pop_front();
    queued = true;
  }
  if (queued && !out_watched_) write_queued();
}

void tcp_conn::send_rma_answers() {
  bool queued = false;
  while (!answers_.empty() && !zcopy_queued_ && fd_ >= 0) {
    rma_answer& a = answers_.front();
    parsed_rma record;
    record.op = a.op;
    record.result = a.result;
    record.length = a.length;
    if (a.data != nullptr) {
      const size_t head = owner_.writer().rma(frame_kind::rma_reply, delivered_, record, a.length,
                                              zop_.head);
      const iov data{a.data, a.length};
      queue_zcopy_frame(head, &data, 1);
      zop_owner_ = nullptr;
      zop_answer_ = !a.copy;
      zop_slot_ = a.slot;
      zop_generation_ = a.generation;
      zop_copy_ = std::move(a.copy);
    } else {
      uint8_t* dest = reserve_rma_record();
      if (dest == nullptr) break;
      owner_.writer().rma(frame_kind::rma_reply, delivered_, record, 0, dest);
      tx_.commit(frame_header_size + rma_header_size);
    }
    ack_sent_ = delivered_;
    ack_urgent_ = false;
    ++owner_.counters().rma_answers;
    answers_.pop_front();
    queued = true;
  }
  if (queued && !out_watched_) write_queued();
}

bool tcp_conn::take_rma(parsed_frame& frame) {
  parsed_rma rma;
  const size_t after = in_.size() - std::min(in_.size(), frame.header_bytes);
  const parse_result r = parse_rma(in_.data() + frame.header_bytes, after, &frame, &rma);
  if (r == parse_result::incomplete) return false;
  if (r == parse_result::garbage) {
    garbage(frame.problem);
    return false;
  }
  if (!note_delivered(frame)) return false;
  const size_t head = frame.header_bytes + rma.record_bytes;
  const size_t rest = frame.total - head;  // data and padding
  switch (frame.kind) {
    case frame_kind::rma_get:
      take_get_request(rma);
      break;
    case frame_kind::rma_put:
      start_put(rma, rest);
      break;
    default:
      take_answer(rma, rest);
      break;
  }
  if (phase_ == phase::finished || fd_ < 0) return false;
  in_.consume(head);
  if (sink_.active) sink_from_buffer();
  return true;
}

void tcp_conn::take_get_request(const parsed_rma& rma) {
  if (answers_.size() >= max_rma_in_flight) return garbage("more puts and gets than allowed");
  tcp_md& md = owner_.tcp_memory_domain();
  const status result = md.check(rma.slot, rma.generation, rma.address, rma.length);
  md.count_access(false, result);
  rma_answer& a = answers_.emplace_back();
  a.op = rma.op;
  a.result = result;
  if (result == status::ok) {
    a.slot = rma.slot;
    a.generation = rma.generation;
    a.data = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(rma.address));
    a.length = rma.length;
  }
}

void tcp_conn::start_put(const parsed_rma& rma, size_t rest) {
  if (answers_.size() >= max_rma_in_flight) return garbage("more puts and gets than allowed");
  tcp_md& md = owner_.tcp_memory_domain();
  const status result = md.check(rma.slot, rma.generation, rma.address, rma.length);
  md.count_access(true, result);
  sink_ = rma_sink{};
  sink_.active = true;
  sink_.put = true;
  sink_.keep = result == status::ok;
  if (sink_.keep) {
    owner_.counters().rma_bytes_received += rma.length;
    keep_answers_before_put(rma.address, rma.length);
  }
  sink_.left = rest;
  sink_.op = rma.op;
  sink_.result = result;
  sink_.slot = rma.slot;
  sink_.generation = rma.generation;
  if (sink_.keep) {
    sink_.vec[sink_.count++] = {reinterpret_cast<void*>(static_cast<uintptr_t>(rma.address)),
                                rma.length};
    if (rest != rma.length) sink_.vec[sink_.count++] = {&pad_sink_, rest - rma.length};
  }
  if (rest == 0) finish_sink();
}

void tcp_conn::keep_answers_before_put(uint64_t address, uint64_t length) {
  const auto overlaps = [&](const void* data, uint64_t bytes) {
    const auto start = reinterpret_cast<uintptr_t>(data);
    return start < address + length && address < start + bytes;
  };
  for (rma_answer& a : answers_) {
    if (a.data == nullptr || a.copy || !overlaps(a.data, a.length)) continue;
    a.copy.reset(new uint8_t[a.length]);
    std::memcpy(a.copy.get(), a.data, a.length);
    a.data = a.copy.get();
  }
  if (zcopy_queued_ && zop_answer_) {
    for (size_t i = zop_.first; i < zop_.count; ++i) {
      if (!overlaps(zop_.vec[i].iov_base, zop_.vec[i].iov_len)) continue;
      own_zcopy_rest();
      zop_answer_ = false;
      break;
    }
  }
}

void tcp_conn::take_answer(const parsed_rma& rma, size_t rest) {
  if (rma_sent_.empty() || rma_sent_.front().number != rma.op) {
    return garbage("an answer to no put or get");
  }
  const rma_op op = rma_sent_.front();
  const bool with_data = !op.write && rma.result == status::ok;
  if (with_data ? rma.data_bytes != op.length || rma.length != op.length : rma.data_bytes != 0) {
    return garbage("an answer that does not fit its put or get");
  }
  rma_sent_.pop_front();
  if (!with_data) {
    if (op.ep != nullptr) rma_finished(op.ep, op.comp, rma.result);
    return;
  }
  owner_.counters().rma_bytes_received += op.length;
  sink_ = rma_sink{};
  sink_.active = true;
  sink_.keep = op.ep != nullptr;
  sink_.left = rest;
  sink_.ep = op.ep;
  sink_.comp = op.comp;
  if (sink_.keep) {
    for (size_t i = 0; i < op.count; ++i) {
      sink_.vec[sink_.count++] = {const_cast<void*>(op.entries[i].buffer), op.entries[i].length};
    }
    if (rest != op.length) sink_.vec[sink_.count++] = {&pad_sink_, rest - op.length};
  }
}

void tcp_conn::sink_from_buffer() {
  const size_t bytes = std::min(in_.size(), sink_.left);
  if (sink_.keep) {
    size_t done = 0;
    for (size_t i = sink_.first; i < sink_.count && done < bytes; ++i) {
      const size_t n = std::min(sink_.vec[i].iov_len, bytes - done);
      std::memcpy(sink_.vec[i].iov_base, in_.data() + done, n);
      done += n;
    }
  }
  in_.consume(bytes);
  advance_sink(bytes);
  if (sink_.left == 0) finish_sink();
}

bool tcp_conn::read_sink() {
  iovec scratch;
  const iovec* vec = sink_.vec + sink_.first;
  int count = static_cast<int>(sink_.count - sink_.first);
  if (!sink_.keep) {
    size_t capacity = 0;
    scratch = {owner_.scratch(&capacity), std::min(capacity, sink_.left)};
    vec = &scratch;
    count = 1;
  }
  const ssize_t got = ::readv(fd_, vec, count);
  if (!account(got)) return false;
  advance_sink(static_cast<size_t>(got));
  return sink_.left == 0;
}

void tcp_conn::advance_sink(size_t bytes) {
  sink_.left -= bytes;
  if (sink_.keep) advance_iov(sink_.vec, sink_.count, &sink_.first, bytes);
}

void tcp_conn::finish_sink() {
  rma_sink done = sink_;
  sink_ = rma_sink{};
  if (!done.put) {
    if (done.ep != nullptr) rma_finished(done.ep, done.comp, status::ok);
    return;
  }
  rma_answer& a = answers_.emplace_back();
  a.op = done.op;
  a.result = done.result;
}

void tcp_conn::rma_finished(tcp_ep* ep, completion* comp, status result) {
  rma_done_.push_back({ep, comp, result});
}

void tcp_conn::fail_rma(status reason) {
  for (const rma_result& r : rma_done_) r.ep->rma_failed(r.comp, r.result);
  rma_done_.clear();
  if (sink_.active && !sink_.put && sink_.ep != nullptr) sink_.ep->rma_failed(sink_.comp, reason);
  sink_ = rma_sink{};
  for (auto* queue : {&rma_sent_, &rma_waiting_}) {
    for (const rma_op& op : *queue) {
      if (op.ep != nullptr) op.ep->rma_failed(op.comp, reason);
    }
    queue->clear();
  }
  answers_.clear();
}

void tcp_conn::orphan_rma(tcp_ep* ep) {
  rma_waiting_.remove_if([&](const rma_op& op) { return op.ep == ep; });
  for (rma_op& op : rma_sent_) {
    if (op.ep == ep) op.ep = nullptr;
  }
  rma_done_.erase(std::remove_if(rma_done_.begin(), rma_done_.end(),
                                 [&](const rma_result& r) { return r.ep == ep; }),
                  rma_done_.end());
  if (sink_.active && !sink_.put && sink_.ep == ep) {
    sink_.ep = nullptr;
    sink_.keep = false;  // the rest is dropped
  }
}

void tcp_conn::region_gone(uint32_t slot, uint64_t generation) {
  for (rma_answer& a : answers_) {
    if (a.data != nullptr && !a.copy && a.slot == slot && a.generation == generation) {
      a.data = nullptr;
      a.length = 0;
      a.result = status::protection_error;
    }
  }
  if (zcopy_queued_ && zop_answer_ && zop_slot_ == slot && zop_generation_ == generation) {
    own_zcopy_rest();
    zop_answer_ = false;
  }
  if (sink_.active && sink_.put && sink_.keep && sink_.slot == slot &&
      sink_.generation == generation) {
    sink_.keep = false;
    sink_.result = status::protection_error;
  }
}

// -- handshake ------------------------------------------------------------------------------------

bool tcp_conn::take_handshake_record() {
  if (role_ == role::acceptor) return hello_done_ ? take_proof() : take_hello();
  return hello_done_ ? take_welcome() : take_challenge();
}

bool tcp_conn::take_hello() {
  size_t consumed = 0;
  parsed_hello hello;
  const char* problem = nullptr;
  const parse_result r =
      parse_hello(in_.data(), in_.size(), owner_.id(), &consumed, &hello, &problem);
  if (r == parse_result::garbage) garbage(problem);
  if (r != parse_result::frame) return false;
  in_.consume(consumed);
  hello_done_ = true;
  peer_id_ = hello.src_iface_id;
  listen_ip_ = hello.src_address;
  listen_port_ = hello.src_port;
  window_ = hello.window;
  std::memcpy(peer_nonce_, hello.nonce, sizeof(peer_nonce_));
  COMM_LOG(debug, log_name, "connection %s: hello", describe().c_str());
  if (!keyed_) decide();
  return phase_ != phase::finished;
}

bool tcp_conn::take_proof() {
  size_t consumed = 0;
  uint8_t proof[auth::proof_size];
  const char* problem = nullptr;
  const parse_result r = parse_proof(in_.data(), in_.size(), &consumed, proof, &problem);
  if (r == parse_result::incomplete) return false;
  ++owner_.counters().auth_checks;
  if (r == parse_result::garbage) {
    ++owner_.counters().auth_failures;
    COMM_LOG(warn, log_name, "connection %s refused: %s instead of a proof of the key",
             describe().c_str(), problem);
    refuse(outcome::refused);
    return false;
  }
  in_.consume(consumed);
  if (!auth::check_proof(owner_.auth_key(), connector_role, own_nonce_.data(), own_nonce_.size(),
                         peer_nonce_, sizeof(peer_nonce_), proof, sizeof(proof))) {
    ++owner_.counters().auth_failures;
    COMM_LOG(warn, log_name, "connection %s refused: wrong proof of the key", describe().c_str());
    refuse(outcome::refused);
    return false;
  }
  decide();
  return phase_ != phase::finished;
}

void tcp_conn::decide() {
  const tcp_iface::admission a = owner_.admit(this);
  switch (a.verdict) {
    case tcp_iface::admission::kind::open:
      queue_welcome(outcome::accepted);
      become_open();
      break;
    case tcp_iface::admission::kind::duplicate:
      COMM_LOG(debug, log_name, "connection %s: ours to that interface is kept instead",
               describe().c_str());
      refuse(outcome::duplicate);
      break;
    case tcp_iface::admission::kind::adopt:
      queue_welcome(outcome::accepted);
      a.into->take_socket(*this);
      break;
  }
}

void tcp_conn::queue_welcome(outcome result) {
  auth::proof proof{};
  const bool prove = keyed_ && result == outcome::accepted;
  if (prove) {
    proof = auth::make_proof(owner_.auth_key(), acceptor_role, peer_nonce_, sizeof(peer_nonce_),
                             own_nonce_.data(), own_nonce_.size());
  }
  owner_.writer().welcome(result, prove ? proof.data() : nullptr, hs_out_.reserve(welcome_size));
  hs_out_.commit(welcome_size);
}

void tcp_conn::refuse(outcome result) {
  queue_welcome(result);
  owner_.unwatch(fd_, &target_);
  owner_.linger(fd_, leftovers());  // the welcome still goes, then the socket closes
  fd_ = -1;
  in_.clear();
  finish();
}

bool tcp_conn::take_challenge() {
  size_t consumed = 0;
  uint64_t iface_id = 0;
  bool keyed = false;
  uint8_t nonce[auth::nonce_size];
  const char* problem = nullptr;
  const parse_result r =
      parse_challenge(in_.data(), in_.size(), &consumed, &iface_id, &keyed, nonce, &problem);
  if (r == parse_result::garbage) garbage(problem);
  if (r != parse_result::frame) return false;
  in_.consume(consumed);
  if (iface_id != peer_id_) {
    // The port belongs to another interface now (ours closed and the port was reused).
    fail(status::unreachable, "another interface listens there", 0);
    return false;
  }
  hello_done_ = true;
  std::memcpy(peer_nonce_, nonce, sizeof(peer_nonce_));
  const bool have_key = !owner_.auth_key().empty();
  if (keyed && !have_key) {
    reject_peer("it requires a key and this interface has none");
    return false;
  }
  if (!keyed && have_key) {
    reject_peer("it does not prove that it holds the key");
    return false;
  }
  keyed_ = keyed;
  if (keyed_) {
    const auth::proof proof =
        auth::make_proof(owner_.auth_key(), connector_role, peer_nonce_, sizeof(peer_nonce_),
                         own_nonce_.data(), own_nonce_.size());
    owner_.writer().proof(proof.data(), hs_out_.reserve(proof_record_size));
    hs_out_.commit(proof_record_size);
    write_queued();
  }
  return phase_ != phase::finished;
}

bool tcp_conn::take_welcome() {
  size_t consumed = 0;
  outcome result = outcome::refused;
  uint8_t proof[auth::proof_size];
  const char* problem = nullptr;
  const parse_result r = parse_welcome(in_.data(), in_.size(), &consumed, &result, proof,
                                       &problem);
  if (r == parse_result::garbage) garbage(problem);
  if (r != parse_result::frame) return false;
  in_.consume(consumed);
  switch (result) {
    case outcome::accepted:
      if (keyed_) {
        ++owner_.counters().auth_checks;
        if (!auth::check_proof(owner_.auth_key(), acceptor_role, own_nonce_.data(),
                               own_nonce_.size(), peer_nonce_, sizeof(peer_nonce_), proof,
                               sizeof(proof))) {
          reject_peer("its proof of the key is wrong");
          return false;
        }
      }
      become_open();
      return phase_ != phase::finished;
    case outcome::duplicate:
      // Both interfaces connected at once and the peer keeps its own connection: it is on its
      // way (its hello was sent already). Our messages wait for it.
      COMM_LOG(debug, log_name, "connection %s: the peer keeps its own connection",
               describe().c_str());
      owner_.unwatch(fd_, &target_);
      ::close(fd_);
      fd_ = -1;
      in_.clear();
      hs_out_.clear();
      out_watched_ = false;
      hello_done_ = false;
      keyed_ = false;
      phase_ = phase::awaiting;
      deadline_ns_ = owner_.now_ns() + handshake_timeout_ns;
      return false;
    case outcome::refused:
      ++owner_.counters().auth_failures;
      COMM_LOG(warn, log_name, "connection %s refused by the peer: authentication failed",
               describe().c_str());
      fail(status::rejected, nullptr, 0);
      return false;
  }
  return false;
}

void tcp_conn::reject_peer(const char* why) {
  ++owner_.counters().auth_failures;
  COMM_LOG(warn, log_name, "connection %s refused: %s", describe().c_str(), why);
  fail(status::rejected, nullptr, 0);
}

void tcp_conn::become_open() {
  phase_ = phase::open;
  progress_ns_ = owner_.now_ns();
  COMM_LOG(debug, log_name, "connection %s open", describe().c_str());
  write_queued();  // the welcome (acceptor) and the messages that waited
}

void tcp_conn::take_socket(tcp_conn& from) {
  if (fd_ >= 0) {
    owner_.unwatch(fd_, &target_);
    ::close(fd_);
  }
  fd_ = from.fd_;
  from.fd_ = -1;
  role_ = role::acceptor;
  peer_ip_ = from.peer_ip_;
  peer_port_ = from.peer_port_;
  listen_ip_ = from.listen_ip_;
  listen_port_ = from.listen_port_;
  window_ = from.window_;
  keyed_ = from.keyed_;
  hello_done_ = true;
  own_nonce_ = from.own_nonce_;
  std::memcpy(peer_nonce_, from.peer_nonce_, sizeof(peer_nonce_));
  std::swap(in_, from.in_);
  std::swap(hs_out_, from.hs_out_);
  owner_.retarget(fd_, base_events, &from.target_, &target_);
  out_watched_ = false;
  from.finish();
  become_open();
  owner_.add_backlog(this);  // frames that came along, flushes and parked requests of ours
}

std::string tcp_conn::describe() const {
  std::string text;
  if (role_ == role::connector && phase_ != phase::open) {
    text = "to " + address_text(listen_ip_, listen_port_);
  } else {
    text = (role_ == role::connector ? "to " : "from ") + address_text(peer_ip_, peer_port_);
    if (role_ == role::acceptor && peer_id_ != 0) {
      text += " (interface " + address_text(listen_ip_, listen_port_) + ")";
    }
  }
  return text;
}

}  // namespace comm::tl::tcp
