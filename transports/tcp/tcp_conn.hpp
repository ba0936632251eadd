// An accepted tcp connection: the receiving end of one peer endpoint. It reads into its receive
// buffer, checks the hello, then cuts complete frames out of the byte stream and hands them to the
// interface's handlers in place (frames are padded to 8 bytes, so payloads stay 8-byte aligned).
// A frame too large for the receive buffer is read straight into a frame buffer of its own. A
// partial frame waits for more bytes; at most frames_per_call frames go per call. Delivered frames
// are acknowledged with a cumulative TcpAck written back on the connection: at the end of a call
// that delivered a zcopy frame, else once half of the interface's window was delivered unacked.
#pragma once

#include "tcp/tcp_buffer.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace comm::tl::tcp {

class tcp_iface;

/// Bytes of a connection's receive buffer (a frame larger than half of it gets a buffer of its
/// own).
inline constexpr size_t receive_buffer_size = 256 * 1024;
/// Frames delivered per connection per progress() call.
inline constexpr unsigned frames_per_call = 64;

class tcp_conn {
public:
  /// Takes the accepted socket `fd` from `peer_ip`:`peer_port`, accepted at `now_ns`.
  tcp_conn(tcp_iface& owner, int fd, uint32_t peer_ip, uint16_t peer_port, uint64_t now_ns);
  ~tcp_conn();
  tcp_conn(const tcp_conn&) = delete;
  tcp_conn& operator=(const tcp_conn&) = delete;

  /// Reads what the socket has (once) and delivers complete frames; returns the number delivered.
  /// Afterwards closing() tells whether the connection is over (EOF, error, garbage).
  unsigned on_readable();

  /// Delivers complete frames already in the buffer; returns the number delivered.
  unsigned deliver_buffered();

  /// True when complete frames wait in the buffer.
  bool has_frames() const;

  /// Writes the acknowledgement of the frames delivered so far, if one is due; returns true
  /// while part of it waits for EPOLLOUT.
  bool flush_acks();

  /// True once the connection must be closed.
  bool closing() const { return closing_; }

  /// True while the hello has not arrived; `accepted_ns` is when the connection was accepted.
  bool awaiting_hello() const { return !hello_done_; }
  uint64_t accepted_ns() const { return accepted_ns_; }

  int fd() const { return fd_; }
  poll_target* target() { return &target_; }

  /// Set by the interface while the connection is on its backlog list / watched for EPOLLOUT.
  bool in_backlog = false;
  bool out_watched = false;
  /// Position in the interface's connection list (kept by the interface).
  size_t index = 0;

  /// "ip:port (sender iface ip:port)" for logs and info().
  std::string describe() const;

private:
  /// Reads into the frame buffer of a large frame; true when it is complete.
  bool read_large();
  /// Reads into the receive buffer; false when nothing came.
  bool read_small();
  /// Counts a recv result; false when nothing came (and closing_ on EOF or an error).
  bool account(ssize_t got);
  /// Consumes the hello; false when it is incomplete or bad.
  bool take_hello();
  /// Moves the incomplete `frame` at the head into a frame buffer of its own.
  void start_large(const parsed_frame& frame);
  /// Delivers the completed large frame and gives its buffer back.
  void finish_large();
  /// Marks the connection for closing because of bytes that break the protocol.
  void garbage(const char* why);
  /// Hands one frame to the interface, counting it for the next acknowledgement.
  void deliver(const parsed_frame& frame, uint8_t* start);
  /// True when an acknowledgement should go now.
  bool ack_due() const;

  tcp_iface& owner_;
  int fd_;
  byte_queue in_;
  std::unique_ptr<uint64_t[]> large_;   ///< a frame larger than half of the receive buffer
  size_t large_capacity_ = 0;
  size_t large_total_ = 0;              ///< bytes of that frame, 0 when none
  size_t large_filled_ = 0;
  parsed_frame large_frame_;
  bool hello_done_ = false;
  bool closing_ = false;
  uint64_t delivered_ = 0;              ///< frames delivered
  uint64_t acks_written_ = 0;           ///< the count in the last acknowledgement started
  bool ack_urgent_ = false;             ///< a zcopy frame was delivered since that ack
  alignas(8) uint8_t ack_out_[ack_size];
  size_t ack_unsent_ = 0;               ///< bytes of ack_out_ the kernel has not taken
  bool acks_broken_ = false;            ///< writing failed: the peer no longer reads
  const uint32_t peer_ip_;
  const uint16_t peer_port_;
  uint32_t sender_ip_ = 0;              ///< from the hello: the sending interface
  uint16_t sender_port_ = 0;
  const uint64_t accepted_ns_;
  poll_target target_;
};

}  // namespace comm::tl::tcp
