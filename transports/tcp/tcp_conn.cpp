#include "tcp/tcp_conn.hpp"

#include "tcp/tcp_iface.hpp"

#include <comm/log.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace comm::tl::tcp {
namespace {

constexpr const char* log_name = "tcp";

}  // namespace

tcp_conn::tcp_conn(tcp_iface& owner, int fd, uint32_t peer_ip, uint16_t peer_port,
                   uint64_t now_ns)
    : owner_(owner),
      fd_(fd),
      in_(receive_buffer_size),
      peer_ip_(peer_ip),
      peer_port_(peer_port),
      accepted_ns_(now_ns),
      target_{poll_target::kind::connection, this} {}

tcp_conn::~tcp_conn() {
  if (large_) owner_.give_frame_buffer(std::move(large_), large_capacity_);
  ::close(fd_);
}

// -- reading --------------------------------------------------------------------------------------

unsigned tcp_conn::on_readable() {
  unsigned delivered = 0;
  if (!in_.empty()) {
    delivered = deliver_buffered();  // leftovers first, so the buffer has room
    if (closing_ || has_frames()) return delivered;
  }
  if (large_total_ != 0) {
    if (read_large()) {
      finish_large();
      ++delivered;
    }
    return delivered;
  }
  if (!read_small()) return delivered;
  delivered += deliver_buffered();
  if (large_total_ != 0 && read_large()) {  // a large frame began: its bytes are likely there
    finish_large();
    ++delivered;
  }
  return delivered;
}

bool tcp_conn::read_small() {
  // Room for the rest of a known incomplete frame, else for a good batch of small ones.
  size_t need = in_.capacity() / 4;
  parsed_frame f;
  if (hello_done_ && parse_frame_header(in_.data(), in_.size(), &f) == parse_result::frame) {
    need = f.total - in_.size();
  }
  const size_t room = in_.tail_room(need);
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
  if (got == 0) {
    const bool partial = !in_.empty() || large_total_ != 0;
    COMM_LOG(debug, log_name, "connection from %s closed%s", describe().c_str(),
             partial ? " in the middle of a frame" : "");
    closing_ = true;
    return false;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
  COMM_LOG(info, log_name, "connection from %s: receive: %s", describe().c_str(),
           std::strerror(errno));
  closing_ = true;
  return false;
}

// -- frames ---------------------------------------------------------------------------------------

unsigned tcp_conn::deliver_buffered() {
  unsigned delivered = 0;
  while (delivered < frames_per_call && !closing_) {
    if (!hello_done_ && !take_hello()) break;
    parsed_frame f;
    const parse_result r = parse_frame_header(in_.data(), in_.size(), &f);
    if (r == parse_result::garbage) {
      garbage(f.problem);
      break;
    }
    if (r == parse_result::incomplete) break;
    if (f.total > in_.size()) {
      if (f.total > in_.capacity() / 2) start_large(f);
      break;
    }
    deliver(f, in_.data());
    in_.consume(f.total);
    ++delivered;
  }
  return delivered;
}

bool tcp_conn::has_frames() const {
  if (closing_ || in_.empty()) return false;
  if (!hello_done_) return in_.size() >= hello_size;
  parsed_frame f;
  const parse_result r = parse_frame_header(in_.data(), in_.size(), &f);
  return r == parse_result::garbage || (r == parse_result::frame && f.total <= in_.size());
}

bool tcp_conn::take_hello() {
  size_t consumed = 0;
  const char* problem = nullptr;
  const parse_result r = parse_hello(in_.data(), in_.size(), owner_.id(), &consumed,
                                     &sender_port_, &sender_ip_, &problem);
  if (r == parse_result::garbage) garbage(problem);
  if (r != parse_result::frame) return false;
  in_.consume(consumed);
  hello_done_ = true;
  COMM_LOG(debug, log_name, "connection from %s", describe().c_str());
  return true;
}

void tcp_conn::start_large(const parsed_frame& frame) {
  large_ = owner_.take_frame_buffer(frame.total, &large_capacity_);
  std::memcpy(large_.get(), in_.data(), in_.size());
  large_frame_ = frame;
  large_total_ = frame.total;
  large_filled_ = in_.size();
  in_.clear();
}

void tcp_conn::finish_large() {
  deliver(large_frame_, reinterpret_cast<uint8_t*>(large_.get()));
  large_total_ = 0;
  owner_.give_frame_buffer(std::move(large_), large_capacity_);
  large_capacity_ = 0;
}

void tcp_conn::deliver(const parsed_frame& frame, uint8_t* start) {
  ++delivered_;
  ack_urgent_ = ack_urgent_ || frame.ack;
  owner_.deliver(frame.id, start + frame.header_bytes, frame.length);
}

bool tcp_conn::ack_due() const {
  const uint64_t unacked = delivered_ - acks_written_;
  return unacked != 0 && (ack_urgent_ || unacked >= owner_.window() / 2);
}

// -- acknowledgements -----------------------------------------------------------------------------

bool tcp_conn::flush_acks() {
  if (acks_broken_) return false;
  if (ack_unsent_ == 0) {
    if (!ack_due()) return false;
    owner_.write_ack(delivered_, ack_out_);
    acks_written_ = delivered_;
    ack_urgent_ = false;
    ack_unsent_ = ack_size;
  }
  const ssize_t sent =
      ::send(fd_, ack_out_ + ack_size - ack_unsent_, ack_unsent_, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent > 0) {
    ack_unsent_ -= static_cast<size_t>(sent);
  } else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    // The sender stopped reading (it is gone or closing): what it sent is still delivered.
    COMM_LOG(debug, log_name, "connection from %s: acknowledgement: %s", describe().c_str(),
             std::strerror(errno));
    acks_broken_ = true;
    ack_unsent_ = 0;
    return false;
  }
  if (ack_unsent_ == 0 && ack_due()) return flush_acks();
  return ack_unsent_ != 0;
}

void tcp_conn::garbage(const char* why) {
  ++owner_.counters().malformed;
  COMM_LOG(error, log_name, "connection from %s closed: %s", describe().c_str(), why);
  closing_ = true;
}

std::string tcp_conn::describe() const {
  std::string text = ipv4_text(peer_ip_) + ":" + std::to_string(peer_port_);
  if (hello_done_) {
    text += " (interface " + ipv4_text(sender_ip_) + ":" + std::to_string(sender_port_) + ")";
  }
  return text;
}

}  // namespace comm::tl::tcp
