// The shm transport's own configuration: its COMM_SHM_* variables with their defaults, limits and
// help text. Read from the options an interface is opened with (iface_params::opts); explicit
// iface_params::fifo_size and segment_size win over them.
//
//   COMM_SHM_FIFO_SIZE  cells of an interface's receive FIFO, a power of two in 2..65536 (256)
//   COMM_SHM_SEG_SIZE   bytes of one receive buffer, the largest bcopy: a multiple of 64 in
//                       1024..1m (8192)
#pragma once

#include <comm/transport/options.hpp>

#include <array>
#include <cstdint>
#include <string>

namespace comm::tl::shm {

/// COMM_SHM_FIFO_SIZE.
inline constexpr knob fifo_size_knob{
    "COMM_SHM_FIFO_SIZE", "cells of a receive FIFO, a power of two in 2..65536", "256"};
/// COMM_SHM_SEG_SIZE.
inline constexpr knob segment_size_knob{
    "COMM_SHM_SEG_SIZE", "bytes of a receive buffer (the largest bcopy), a multiple of 64 in 1k..1m",
    "8192"};
/// Every knob of shm.
inline constexpr std::array<knob, 2> shm_knobs{fifo_size_knob, segment_size_knob};

/// The knobs of one interface.
struct shm_config {
  uint32_t fifo_size = 256;     ///< COMM_SHM_FIFO_SIZE
  uint32_t segment_size = 8192; ///< COMM_SHM_SEG_SIZE

  /// The knobs `opts` sets into `*out`: ok, or invalid_param with the refusal in `*why`.
  static status parse(const options& opts, shm_config* out, std::string* why);
};

}  // namespace comm::tl::shm
