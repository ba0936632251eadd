// cluster::join with a bootstrap made from the environment (kept apart from the rest, so that
// programs that bring their own bootstrap do not need the bootstrap backends).
#include "cluster_am.hpp"

namespace comm::sim {

status cluster::join(const cluster_params& params, std::unique_ptr<cluster>* out,
                     std::string* why) {
  std::string ignored;
  if (why == nullptr) why = &ignored;
  std::unique_ptr<bootstrap> boot;
  const status st = bootstrap::create(params.bootstrap, &boot, why);
  if (st != status::ok) return st;
  bootstrap& b = *boot;
  return connect_cluster(b, std::move(boot), params, out, why);
}

}  // namespace comm::sim
