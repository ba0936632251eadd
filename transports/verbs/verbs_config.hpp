// The verbs transport's configuration: the limits and timers of an interface and the COMM_VERBS_*
// variables that set them, with their defaults, limits and help text. Read from the options an
// interface is opened with (iface_params::opts); iface_params::fifo_size and segment_size, when
// set, win over COMM_VERBS_RX_BUFFERS and COMM_VERBS_SEG_SIZE.
//
// A malformed, out-of-range or unknown COMM_VERBS_* value is refused: the interface does not open,
// and the message names the variable.
#pragma once

#include <comm/status.hpp>
#include <comm/transport/options.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace comm::verbs {

/// Limits and timers of a verbs interface. Memory is bounded by them: rx_buffers and tx_buffers
/// of segment_size bytes each, tx_queue send requests per connection, max_connections
/// connections, reg_cache idle implicit registrations.
struct verbs_config {
  size_t rx_buffers = 1024;      ///< receive buffers on the shared receive queue
  size_t segment_size = 8192;    ///< bytes of one receive or send buffer (header included)
  size_t tx_buffers = 256;       ///< registered send buffers (bcopy, zcopy headers)
  uint32_t tx_queue = 128;       ///< send work requests per connection
  uint16_t credits = 32;         ///< receive buffers granted to each peer
  uint32_t inline_size = 128;    ///< inline bytes asked for (am_short)
  size_t reg_cache = 64;         ///< idle implicit registrations kept
  uint8_t ack_timeout = 14;      ///< 4.096 us * 2^ack_timeout before a retry (14: 67 ms)
  uint8_t retry_count = 7;       ///< retries before IBV_WC_RETRY_EXC_ERR
  uint8_t rnr_retry = 7;         ///< RNR retries (7: for ever)
  uint8_t min_rnr_timer = 12;    ///< RNR back-off asked of peers (12: 0.64 ms)
  int connect_timeout_ms = 2000; ///< address and route resolution
  bool tag_matching = true;      ///< use the device's tag-matching SRQs when it offers them

  /// `base` with the knobs `opts` sets applied, into `*out`: ok, or invalid_param with the
  /// refusal (variable, value, what it accepts) in `*why`.
  static status parse(const tl::options& opts, const verbs_config& base, verbs_config* out,
                      std::string* why);
};

/// COMM_VERBS_DEVICE.
inline constexpr tl::knob device_knob{
    "COMM_VERBS_DEVICE", "comma-separated ports to use as <device>:<port>, in that order",
    "every active InfiniBand or RoCE port"};
/// COMM_VERBS_RX_BUFFERS.
inline constexpr tl::knob rx_buffers_knob{
    "COMM_VERBS_RX_BUFFERS",
    "receive buffers on the shared receive queue, 4..65536, at least twice COMM_VERBS_CREDITS",
    "1024"};
/// COMM_VERBS_SEG_SIZE.
inline constexpr tl::knob seg_size_knob{
    "COMM_VERBS_SEG_SIZE", "bytes of one receive or send buffer, header included, 256..1m", "8k"};
/// COMM_VERBS_TX_BUFFERS.
inline constexpr tl::knob tx_buffers_knob{
    "COMM_VERBS_TX_BUFFERS", "registered send buffers per interface, 2..65536", "256"};
/// COMM_VERBS_TX_QUEUE.
inline constexpr tl::knob tx_queue_knob{
    "COMM_VERBS_TX_QUEUE", "send work requests per connection, 4..16384", "128"};
/// COMM_VERBS_CREDITS.
inline constexpr tl::knob credits_knob{
    "COMM_VERBS_CREDITS", "receive buffers granted to each peer, 2..32768", "32"};
/// COMM_VERBS_INLINE.
inline constexpr tl::knob inline_knob{
    "COMM_VERBS_INLINE", "inline bytes asked of a QP for short messages, 0..1024", "128"};
/// COMM_VERBS_REG_CACHE.
inline constexpr tl::knob reg_cache_knob{
    "COMM_VERBS_REG_CACHE", "idle implicit memory registrations kept, 0..65536", "64"};
/// COMM_VERBS_ACK_TIMEOUT.
inline constexpr tl::knob ack_timeout_knob{
    "COMM_VERBS_ACK_TIMEOUT", "ACK timeout exponent: 4.096 us * 2^value before a retry, 1..31",
    "14"};
/// COMM_VERBS_RETRY_COUNT.
inline constexpr tl::knob retry_count_knob{
    "COMM_VERBS_RETRY_COUNT", "transport retries before a connection fails, 0..7", "7"};
/// COMM_VERBS_RNR_RETRY.
inline constexpr tl::knob rnr_retry_knob{
    "COMM_VERBS_RNR_RETRY", "receiver-not-ready retries, 0..7 (7: for ever)", "7"};
/// COMM_VERBS_CONNECT_TIMEOUT (ms).
inline constexpr tl::knob connect_timeout_knob{
    "COMM_VERBS_CONNECT_TIMEOUT", "ms for rdmacm address and route resolution, 1..600000",
    "2000"};
/// COMM_VERBS_TM.
inline constexpr tl::knob tm_knob{
    "COMM_VERBS_TM",
    "1: use the device's tag-matching SRQs (cap_tag_*) when it offers them, 0: never", "1"};
/// Every knob of verbs.
inline constexpr std::array<tl::knob, 13> verbs_knobs{
    device_knob,     rx_buffers_knob, seg_size_knob,    tx_buffers_knob,
    tx_queue_knob,   credits_knob,    inline_knob,      reg_cache_knob,
    ack_timeout_knob, retry_count_knob, rnr_retry_knob, connect_timeout_knob,
    tm_knob};

/// COMM_VERBS_DEVICE as `opts` sets it, empty when unset (a refusal of the other knobs is
/// check_options' to report).
std::vector<std::string> configured_ports(const tl::options& opts);

}  // namespace comm::verbs
