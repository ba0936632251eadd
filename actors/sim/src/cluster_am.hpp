// The cluster over libcomm, for cluster::join's two forms.
#pragma once

#include <comm/sim/cluster.hpp>

#include <memory>
#include <string>

namespace comm::sim {

/// Connects the processes `boot` describes (a local cluster for a job of one); `owned`, when set,
/// is `boot` itself, kept alive by the cluster.
status connect_cluster(bootstrap& boot, std::unique_ptr<bootstrap> owned,
                       const cluster_params& params, std::unique_ptr<cluster>* out,
                       std::string* why);

}  // namespace comm::sim
