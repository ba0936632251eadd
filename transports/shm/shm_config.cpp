#include "shm/shm_config.hpp"

namespace comm::tl::shm {

status shm_config::parse(const options& opts, shm_config* out, std::string* why) {
  option_reader reader("shm", shm_knobs, opts);
  shm_config c;
  c.fifo_size = static_cast<uint32_t>(reader.power_of_two(fifo_size_knob, c.fifo_size, 2, 1u << 16));
  c.segment_size =
      static_cast<uint32_t>(reader.size(segment_size_knob, c.segment_size, 1024, 1u << 20, 64));
  *out = c;
  return reader.result(why);
}

}  // namespace comm::tl::shm
