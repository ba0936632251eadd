#include <comm/status.hpp>

namespace comm {

const char* to_string(status s) noexcept {
  switch (s) {
    case status::ok: return "OK";
    case status::in_progress: return "IN_PROGRESS";
    case status::no_message: return "NO_MESSAGE";
    case status::no_resource: return "NO_RESOURCE";
    case status::io_error: return "IO_ERROR";
    case status::no_memory: return "NO_MEMORY";
    case status::invalid_param: return "INVALID_PARAM";
    case status::unreachable: return "UNREACHABLE";
    case status::invalid_addr: return "INVALID_ADDR";
    case status::not_implemented: return "NOT_IMPLEMENTED";
    case status::message_truncated: return "MESSAGE_TRUNCATED";
    case status::no_progress: return "NO_PROGRESS";
    case status::buffer_too_small: return "BUFFER_TOO_SMALL";
    case status::no_elem: return "NO_ELEM";
    case status::busy: return "BUSY";
    case status::canceled: return "CANCELED";
    case status::shmem_segment: return "SHMEM_SEGMENT";
    case status::already_exists: return "ALREADY_EXISTS";
    case status::out_of_range: return "OUT_OF_RANGE";
    case status::timed_out: return "TIMED_OUT";
    case status::exceeds_limit: return "EXCEEDS_LIMIT";
    case status::unsupported: return "UNSUPPORTED";
    case status::rejected: return "REJECTED";
    case status::not_connected: return "NOT_CONNECTED";
    case status::connection_reset: return "CONNECTION_RESET";
    case status::endpoint_timeout: return "ENDPOINT_TIMEOUT";
    case status::protocol_error: return "PROTOCOL_ERROR";
    case status::protection_error: return "PROTECTION_ERROR";
    case status::length_error: return "LENGTH_ERROR";
    case status::privileges_violation: return "PRIVILEGES_VIOLATION";
    case status::flushed: return "FLUSHED";
  }
  return "UNKNOWN_STATUS";
}

}  // namespace comm
