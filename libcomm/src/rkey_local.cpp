// endpoint::rkey_local_address: a peer's registered bytes read in place, through the mapping the
// endpoint's transport keeps of the peer's memory (tl::ep::rkey_local_address); and
// endpoint::peer_process_fd, which tells a user of such memory when the peer process is gone.
#include "rma.hpp"

#include <fcntl.h>

#include <cerrno>

namespace comm {

using detail::endpoint_impl;
using detail::impl;
using detail::worker_impl;

result<local_memory> endpoint::rkey_local_address(rkey& key, uint64_t remote_address,
                                                  size_t length) {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (key.ep != &ep) return status::invalid_param;
  if (ep.state == endpoint_impl::phase::failed || ep.state == endpoint_impl::phase::closing) {
    return status::connection_reset;
  }
  if (ep.lane == nullptr) return status::not_connected;
  if ((key.access & mem_remote_read) == 0) return status::privileges_violation;
  // Software keys have no transport key: the owner's worker serves them, nothing is mapped.
  if (key.software) return status::unsupported;
  tl::local_bytes found;
  const status st = ep.lane->rkey_local_address(remote_address, length, key.key, &found);
  if (st != status::ok) return st;
  return local_memory{found.data, length, std::move(found.mapping)};
}

result<int> endpoint::peer_process_fd() {
  endpoint_impl& ep = impl(*this);
  worker_impl::guard g(ep.owner);
  if (ep.state == endpoint_impl::phase::failed || ep.state == endpoint_impl::phase::closing) {
    return status::connection_reset;
  }
  if (ep.lane == nullptr) return status::not_connected;
  const int pidfd = ep.lane->peer_process_fd();
  if (pidfd < 0) return status::unsupported;
  const int copy = ::fcntl(pidfd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return errno == EMFILE || errno == ENFILE ? status::no_resource : status::io_error;
  return copy;
}

}  // namespace comm
