// What the tcp transport puts on the wire and into its addresses.
//
// A connection carries, from the connecting endpoint to the accepting interface:
//   TcpHello                                    once, first
//   TcpFrame | protocol header + payload | pad  per message, padded to a multiple of 8 bytes
// and back, from the accepting interface to the endpoint, only
//   TcpAck                                      how many frames were delivered so far
// Acknowledgements do two things. A zcopy completes once the peer holds its data (the transport
// contract), not merely when the kernel took it: its frame asks for a prompt ack. And they return
// send credits: an endpoint has at most `window` frames undelivered (the receiving interface's
// fifo_size, its "receive queue entries", carried in its address); other acks go once half a
// window was delivered, so a ping-pong never waits for one. All three are data-only Cap'n Proto
// structs (serialization/schema/wire.capnp), read in place with wire::read_header after the checks
// below. Padding keeps every frame, and so every payload handed to an am handler, 8-byte aligned in
// the receive buffer.
//
// Device address: the device's IPv4 address plus this host's boot and network namespace identity
// (a loopback address only reaches the same host and namespace). Interface address: the port of the
// interface's data listener plus a random interface id that the hello must name, so a connection
// to a reused port of a closed interface is refused instead of delivering to a stranger.
#pragma once

#include <comm/status.hpp>
#include <comm/transport/transport.hpp>
#include <comm/wire/codec.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace comm::tl::tcp {

// -- limits ---------------------------------------------------------------------------------------

inline constexpr size_t max_short = 256;               ///< am_short header + payload
inline constexpr size_t max_bcopy = 64 * 1024;         ///< am_bcopy payload
inline constexpr size_t max_zcopy = 1024 * 1024;       ///< am_zcopy iov total
inline constexpr size_t max_hdr = 256;                 ///< am_zcopy header
inline constexpr size_t max_iov = 16;                  ///< am_zcopy iov entries
/// Largest `length` a frame may announce (what a zcopy can send).
inline constexpr size_t max_frame_payload = max_hdr + max_zcopy;

/// Bytes of a TcpFrame header as we write it.
inline constexpr size_t frame_header_size = wire::header_size<wire::schema::TcpFrame>();
/// Bytes of a TcpHello as we write it.
inline constexpr size_t hello_size = wire::header_size<wire::schema::TcpHello>();
/// Bytes of a TcpAck as we write it.
inline constexpr size_t ack_size = wire::header_size<wire::schema::TcpAck>();
/// Largest header a (newer) peer may send: data sections beyond this are garbage to us.
inline constexpr size_t max_header_bytes = 16 * sizeof(uint64_t);

inline constexpr uint64_t hello_magic = 0x434f4d4d54435000ull;  ///< "COMMTCP\0"
inline constexpr uint16_t hello_version = 1;

/// `length` rounded up to a multiple of 8.
constexpr size_t pad8(size_t length) { return (length + 7) & ~size_t{7}; }

/// Bytes a frame with `length` bytes after our header occupies on the wire.
constexpr size_t frame_size(size_t length) { return frame_header_size + pad8(length); }

// -- addresses ------------------------------------------------------------------------------------

/// Device address: where the interface listens and who can reach a loopback address.
struct [[gnu::packed]] device_addr {
  uint32_t ipv4 = 0;         ///< network byte order
  uint8_t boot_id[16] = {};  ///< host boot (host_identity)
  uint64_t net_ns = 0;       ///< network namespace (host_identity)

  /// This process on `ipv4`.
  static device_addr local(uint32_t ipv4);
  std::vector<uint8_t> pack() const;
  /// Nothing when `bytes` is not a device address.
  static std::optional<device_addr> unpack(const std::vector<uint8_t>& bytes);
  /// True for 127.0.0.0/8.
  bool loopback() const;
};

/// Frames an endpoint may have undelivered when the interface's fifo_size is 0.
inline constexpr uint32_t default_window = 1024;
/// Bounds of a window (fifo_size) an interface accepts.
inline constexpr uint32_t min_window = 2;
inline constexpr uint32_t max_window = 1u << 20;

/// Interface address: the listening port, the interface's id and its window.
struct [[gnu::packed]] iface_addr {
  uint16_t port = 0;      ///< host byte order
  uint64_t iface_id = 0;  ///< random, never zero
  uint32_t window = 0;    ///< frames a sender may have undelivered (min_window..max_window)

  std::vector<uint8_t> pack() const;
  /// Nothing when `bytes` is not an interface address (port or id 0, window out of bounds).
  static std::optional<iface_addr> unpack(const std::vector<uint8_t>& bytes);
};

// -- frame parsing --------------------------------------------------------------------------------

/// What parse_frame_header found at the start of some received bytes.
enum class parse_result {
  frame,       ///< a valid header: see parsed_frame
  incomplete,  ///< too few bytes yet to tell
  garbage,     ///< not a header we accept: the connection must be closed
};

/// A validated frame header.
struct parsed_frame {
  am_id id = 0;
  bool ack = false;         ///< the sender wants a TcpAck once it is delivered
  size_t header_bytes = 0;  ///< bytes of the TcpFrame struct (payload starts here)
  size_t length = 0;        ///< payload bytes announced
  size_t total = 0;         ///< header + payload + padding
  const char* problem = nullptr;  ///< why, for garbage
};

/// Checks the frame header at `data` (8-byte aligned, `available` bytes): a data-only TcpFrame,
/// an am id below am_id_count and a length within max_frame_payload.
parse_result parse_frame_header(const uint8_t* data, size_t available, parsed_frame* out);

/// Checks the ack at `data` (8-byte aligned) and reads its count into `*delivered`.
parse_result parse_ack(const uint8_t* data, size_t available, size_t* consumed,
                       uint64_t* delivered);

/// Checks the hello at `data` (8-byte aligned) for interface `own_id`; sets `*consumed` and
/// fills `*peer_port`/`*peer_ipv4` when it is valid.
parse_result parse_hello(const uint8_t* data, size_t available, uint64_t own_id, size_t* consumed,
                         uint16_t* peer_port, uint32_t* peer_ipv4, const char** problem);

}  // namespace comm::tl::tcp
