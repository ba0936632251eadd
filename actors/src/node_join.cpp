// A node joining a job (node::join): the ranks' node addresses travel through the job's bootstrap
// (libcomm's public comm::bootstrap), and each rank connects to the ranks below it by looking up
// a name nobody publishes: the lookup connects first, and its no_elem answer proves the
// connection works both ways. Lookups by rank are lookups by the address that rank gave.
#include <comm/actors/node.hpp>
#include <comm/bootstrap.hpp>

#include <algorithm>
#include <cstdint>

namespace comm::actors {

namespace detail {

/// The job a node joined.
struct job_table {
  int rank = -1;                       ///< this node's rank
  std::vector<std::string> addresses;  ///< every rank's node address
};

}  // namespace detail

namespace {

/// The bootstrap key of the node addresses.
constexpr const char* address_key = "comm.actors.node";

/// A name nobody publishes: looking it up only connects.
constexpr const char* connect_probe = "comm.actors.join.connect";

int milliseconds(std::chrono::milliseconds timeout) {
  return static_cast<int>(std::min<int64_t>(timeout.count(), INT32_MAX));
}

}  // namespace

caf::error node::join(comm::bootstrap& boot, std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> g(job_mtx_);
    if (job_) return make_error(comm::status::already_exists);
  }
  const std::string mine = address();
  if (mine.empty()) return make_error(comm::status::invalid_param);
  std::vector<std::vector<uint8_t>> all;
  const comm::status gathered = boot.allgather(
      address_key, std::vector<uint8_t>(mine.begin(), mine.end()), all, milliseconds(timeout));
  if (gathered != comm::status::ok) return make_error(gathered);
  auto table = std::make_shared<detail::job_table>();
  table->rank = boot.rank();
  for (const auto& bytes : all) table->addresses.emplace_back(bytes.begin(), bytes.end());
  for (int r = 0; r < table->rank; ++r) {
    auto probe = lookup(table->addresses[static_cast<size_t>(r)], connect_probe, timeout);
    if (!probe && status_of(probe.error()) != comm::status::no_elem) return probe.error();
  }
  // Once every rank passed the barrier, every connection is established on both sides.
  if (const comm::status st = boot.barrier(milliseconds(timeout)); st != comm::status::ok) {
    return make_error(st);
  }
  std::lock_guard<std::mutex> g(job_mtx_);
  job_ = std::move(table);
  return caf::error{};
}

int node::rank() const {
  std::lock_guard<std::mutex> g(job_mtx_);
  return job_ ? job_->rank : -1;
}

int node::job_size() const {
  std::lock_guard<std::mutex> g(job_mtx_);
  return job_ ? static_cast<int>(job_->addresses.size()) : 0;
}

caf::expected<caf::actor> node::lookup(int rank, const std::string& name) {
  auto where = address_of(rank);
  if (!where) return std::move(where.error());
  return lookup(*where, name);
}

caf::expected<caf::actor> node::lookup(int rank, const std::string& name,
                                       std::chrono::milliseconds timeout) {
  auto where = address_of(rank);
  if (!where) return std::move(where.error());
  return lookup(*where, name, timeout);
}

caf::expected<std::string> node::address_of(int rank) const {
  std::lock_guard<std::mutex> g(job_mtx_);
  if (!job_) return make_error(comm::status::not_connected);
  if (rank < 0 || static_cast<size_t>(rank) >= job_->addresses.size()) {
    return make_error(comm::status::invalid_param);
  }
  return job_->addresses[static_cast<size_t>(rank)];
}

}  // namespace comm::actors
