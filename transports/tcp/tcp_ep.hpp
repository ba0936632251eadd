// A tcp endpoint: the sending end of one connection to a peer interface's listener.
//
// Order on the wire is the order of the calls: queued send-buffer bytes first, then at most one
// zcopy frame whose iov the kernel has not taken completely. While that zcopy is queued every other
// send answers no_resource; short and bcopy messages append to the send buffer while it has room.
// Every frame counts against the peer's window until a TcpAck says it was delivered; a zcopy
// completes when that happens to its frame. Up to max_unacked_zcopy zcopy operations may wait.
#pragma once

#include "base/pending_queue.hpp"
#include "tcp/tcp_buffer.hpp"
#include "tcp/tcp_socket.hpp"
#include "tcp/tcp_wire.hpp"

#include <comm/transport/transport.hpp>

#include <sys/uio.h>

#include <memory>
#include <string>
#include <vector>

namespace comm::tl::tcp {

class tcp_iface;

/// Bytes of an endpoint's send buffer: a hello plus two largest bcopy frames.
inline constexpr size_t send_buffer_size = hello_size + 2 * frame_size(max_bcopy);
/// Zcopy operations of one endpoint that may wait for their acknowledgement (a power of two).
inline constexpr uint64_t max_unacked_zcopy = 128;

class tcp_ep final : public ep {
public:
  /// Takes `fd` (connected, or with its connect in progress) to the interface at `peer_ip`:`peer`.
  tcp_ep(tcp_iface& owner, int fd, bool connected, uint32_t peer_ip, const iface_addr& peer);
  ~tcp_ep() override;

  // -- ep --

  status am_short(am_id id, const void* header, size_t header_length, const void* payload,
                  size_t payload_length) override;
  ssize_t am_bcopy(am_id id, pack_fn pack, void* arg) override;
  /// Always in_progress when accepted: `comp` completes once the peer acknowledged delivery.
  status am_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                  size_t count, completion* comp) override;
  status pending_add(pending_req* req) override;
  void pending_purge(void (*cb)(pending_req* req, void* arg), void* arg) override;
  status flush(completion* comp) override;

  // -- used by tcp_iface --

  /// Handles epoll events of the socket; returns the number of operations advanced.
  unsigned on_events(uint32_t events);

  /// Retries parked requests when there is room (after a dispatch that left some re-parked).
  unsigned dispatch_pending();

  /// Completes outstanding zcopy and flush operations with `reason` (the failure was noticed
  /// earlier: sends already answer with it). Parked requests stay for pending_purge.
  void fail(status reason);

  /// Why the connection failed (set when it broke), or ok.
  status failure() const { return failure_; }

  /// True when requests are parked and sends would be accepted now.
  bool parked_and_ready() const { return !pending_.empty() && !broken() && has_room(); }

  /// "ip:port state" for info().
  std::string describe() const;

  /// Set by the interface while the endpoint is on its failure list / its redispatch list.
  bool failure_queued = false;
  bool redispatch_queued = false;

private:
  /// The zcopy frame the kernel has not taken completely: frame header + protocol header, the
  /// caller's iov, padding.
  struct zcopy_frame {
    alignas(8) uint8_t head[frame_header_size + max_hdr];
    iovec vec[max_iov + 2];
    size_t count = 0;        ///< entries in vec
    size_t first = 0;        ///< first entry not written completely
    size_t written = 0;      ///< bytes written so far
  };

  bool broken() const { return failure_ != status::ok; }
  /// Error for a send refused before anything is queued, or ok.
  status refusal() const;
  /// True when the peer's window has room for another frame.
  bool window_open() const { return frames_sent_ - frames_delivered_ < window_; }
  /// True when any send would be accepted: the window is open, a largest bcopy frame fits, no
  /// zcopy frame is half written and a zcopy would find a slot.
  bool has_room() const {
    return window_open() && !zcopy_queued_ && zissued_ - zacked_ < max_unacked_zcopy &&
           tx_.fits(frame_size(max_bcopy));
  }
  /// True when nothing waits: send buffer empty, no zcopy queued or unacknowledged.
  bool idle() const { return tx_.empty() && !zcopy_queued_ && zacked_ == zissued_; }
  /// Completes the zcopy operations whose frames the peer delivered.
  unsigned complete_delivered();
  /// Writes the frame header for `length` bytes of message `id` at `dest`; returns its size.
  size_t put_frame_header(am_id id, size_t length, bool ack, uint8_t* dest);
  /// Zeroes the padding of the frame of `length` bytes built at `frame` (tx_.tail()), appends
  /// it and writes.
  void commit_frame(uint8_t* frame, size_t length);
  /// Builds the zcopy frame in zop_; returns false when the iov is too long.
  bool prepare_zcopy(am_id id, const void* header, size_t header_length, const iov* entries,
                     size_t count);
  /// Hands queued bytes to the kernel.
  void write_queued();
  /// Counts `sent` bytes off the send buffer and then the queued zcopy frame.
  void consume_written(size_t sent);
  /// Finishes a nonblocking connect; false when it failed.
  bool finish_connect();
  /// Reads acknowledgements (and notices EOF or errors: the connection is then broken).
  unsigned read_acks();
  /// Completes the zcopy operations the acks in acks_in_ cover; false on a bad ack.
  bool take_acks(unsigned* completed);
  /// After progress on the socket: completes finished flushes, dispatches parked requests.
  unsigned after_progress();
  /// Records the failure, closes the socket and asks the interface to report it.
  void broke(status reason, const char* why, int error);
  /// Watches EPOLLOUT while bytes are queued (or the connect is in progress), else not.
  void update_interest();
  /// What must still go out when the endpoint is destroyed: the send buffer and the rest of a
  /// half-written zcopy frame (its iov is still valid: its completion has not run).
  byte_queue leftovers();

  tcp_iface& owner_;
  int fd_ = -1;
  bool connecting_ = false;
  bool out_watched_ = false;
  bool zcopy_queued_ = false;
  status failure_ = status::ok;
  byte_queue tx_;
  zcopy_frame zop_;
  byte_queue acks_in_;
  /// A zcopy operation waiting for the peer to deliver its frame.
  struct zcopy_slot {
    uint64_t frame = 0;          ///< frames_sent_ once its frame was counted
    completion* comp = nullptr;  ///< the caller's completion, may be null
  };
  /// Zcopy operations in issue order: [zacked_, zissued_) wait for their ack.
  std::unique_ptr<zcopy_slot[]> zring_;
  uint64_t zissued_ = 0;
  uint64_t zacked_ = 0;
  uint64_t frames_sent_ = 0;       ///< frames accepted for sending
  uint64_t frames_delivered_ = 0;  ///< frames the peer said it delivered
  const uint32_t window_;          ///< frames the peer accepts undelivered
  pending_queue pending_;
  std::vector<completion*> flushes_;
  const uint32_t peer_ip_;
  const iface_addr peer_;
  poll_target target_;
};

}  // namespace comm::tl::tcp
