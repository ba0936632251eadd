// The transports built into this library, in preference order.
#include "self/self_iface.hpp"
#include "shm/shm_iface.hpp"
#include "tcp/tcp_iface.hpp"

#include <comm/transport/transport.hpp>

namespace comm::tl {

std::vector<component*> all_components() {
  return {&self::self_component(), &shm::shm_component(), &tcp::tcp_component()};
}

}  // namespace comm::tl
