#include "verbs/verbs_config.hpp"

namespace comm::verbs {

status verbs_config::parse(const tl::options& opts, const verbs_config& base, verbs_config* out,
                           std::string* why) {
  tl::option_reader reader("verbs", verbs_knobs, opts);
  verbs_config c = base;
  reader.list(device_knob);
  c.rx_buffers = reader.number(rx_buffers_knob, c.rx_buffers, 4, 65536);
  c.segment_size = reader.size(seg_size_knob, c.segment_size, 256, size_t{1} << 20);
  c.tx_buffers = reader.number(tx_buffers_knob, c.tx_buffers, 2, 65536);
  c.tx_queue = static_cast<uint32_t>(reader.number(tx_queue_knob, c.tx_queue, 4, 16384));
  c.credits = static_cast<uint16_t>(reader.number(credits_knob, c.credits, 2, 32768));
  c.inline_size = static_cast<uint32_t>(reader.number(inline_knob, c.inline_size, 0, 1024));
  c.reg_cache = reader.number(reg_cache_knob, c.reg_cache, 0, 65536);
  c.ack_timeout = static_cast<uint8_t>(reader.number(ack_timeout_knob, c.ack_timeout, 1, 31));
  c.retry_count = static_cast<uint8_t>(reader.number(retry_count_knob, c.retry_count, 0, 7));
  c.rnr_retry = static_cast<uint8_t>(reader.number(rnr_retry_knob, c.rnr_retry, 0, 7));
  c.connect_timeout_ms =
      static_cast<int>(reader.number(connect_timeout_knob, c.connect_timeout_ms, 1, 600000));
  c.tag_matching = reader.number(tm_knob, c.tag_matching ? 1 : 0, 0, 1) != 0;
  const status st = reader.result(why);
  if (st != status::ok) return st;
  if (c.rx_buffers < 2u * c.credits) {
    if (why != nullptr) {
      *why = std::string(rx_buffers_knob.name) + "=" + std::to_string(c.rx_buffers) +
             " refused: at least twice COMM_VERBS_CREDITS (" + std::to_string(c.credits) + ")";
    }
    return status::invalid_param;
  }
  *out = c;
  return status::ok;
}

std::vector<std::string> configured_ports(const tl::options& opts) {
  return tl::option_reader("verbs", verbs_knobs, opts).list(device_knob);
}

}  // namespace comm::verbs
