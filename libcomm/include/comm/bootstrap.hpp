// Bootstrap: how the processes of one job learn their rank, the job's size and each other's
// worker addresses, before any endpoint exists (PMI's role in MPI, PMIx under mpirun and srun).
//
// Usage, the same under every launcher:
//
//   std::unique_ptr<comm::bootstrap> boot;
//   std::string why;
//   if (comm::bootstrap::create({}, &boot, &why) != comm::status::ok) { print why; exit }
//   std::vector<std::vector<uint8_t>> addresses;
//   boot->allgather("comm.worker", w->address(), addresses, 30000);   // addresses[r] is rank r's
//
// Create one per process and share it (the simulation engine, an actor node's join): under the
// address backend a second rank 0 would find its port taken.
//
// Backends, chosen by bootstrap_params::backend (COMM_BOOTSTRAP) or, by default, from the
// environment:
//   - pmix:    the launcher's PMIx server (Open MPI's mpirun, Slurm's srun --mpi=pmix);
//   - address: processes started by hand; rank 0 listens on bootstrap_params::address
//              (COMM_BOOTSTRAP_ADDRESS, "host:port"), the others connect to it; rank and size come
//              from bootstrap_params (COMM_RANK, COMM_SIZE);
//   - single:  one process on its own (rank 0 of 1).
// When the environment says the job has several processes (a launcher's variables) but none of
// these can be reached, create() fails with a message that says so: a job never runs as N
// independent single processes.
//
// Limits: keys are 1 to 255 bytes without a NUL, values at most 1 MiB, and what one rank stores
// (keys and values, overwritten keys counted once) at most 16 MiB, so a process holds at most
// size() x 16 MiB of others' data; the address backend checks the same of what arrives, and the
// job has at most 65536 ranks.
#pragma once

#include <comm/status.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace comm {

/// Which mechanism a bootstrap uses.
enum class bootstrap_backend {
  automatic,  ///< pmix under a launcher, address when an address is given, else single
  pmix,       ///< the launcher's PMIx server
  address,    ///< a rank-0 socket address, for processes started by hand
  single,     ///< one process, rank 0 of 1
};

/// Parameters of bootstrap::create. Unset fields come from the environment (variables named).
struct bootstrap_params {
  /// The mechanism (COMM_BOOTSTRAP=pmix|address|single); automatic decides from the environment.
  bootstrap_backend backend = bootstrap_backend::automatic;
  /// address backend: rank 0's "host:port" (COMM_BOOTSTRAP_ADDRESS); rank 0 listens there.
  std::string address;
  /// address backend: this process's rank (COMM_RANK); -1 reads the environment.
  int rank = -1;
  /// address backend: the number of processes (COMM_SIZE); -1 reads the environment.
  int size = -1;
  /// Limit on reaching the launcher or rank 0 and on every collective call without a timeout of
  /// its own, in milliseconds.
  int timeout_ms = 30000;
  /// address backend: cluster secret the ranks prove to each other (COMM_AUTH_KEY or
  /// COMM_AUTH_KEY_FILE); empty: none (rank 0 then accepts anyone who reaches its address).
  std::string auth_key;
};

/// What bootstrap::detect found: the backend create() would use and why, or why it would fail.
struct bootstrap_choice {
  bootstrap_backend backend = bootstrap_backend::single;  ///< never automatic
  bool usable = true;  ///< false: create() fails (the environment contradicts itself)
  std::string reason;  ///< one line: the variables that decided, or what to do
};

/// A process's membership in a job: its rank, the job's size, and a key-value exchange among the
/// job's processes (put, commit, fence, get). Every call is made from one thread.
class bootstrap {
public:
  /// Joins the job the environment (or `params`) describes; with the address backend it returns
  /// once every rank is there. On failure `*why` (when not null) says what was tried and what went
  /// wrong; the returned status is unreachable (no launcher or rank 0 answered, or rank 0 cannot
  /// listen), invalid_param (missing or contradictory parameters), rejected (rank 0 refused this
  /// process: its rank is taken, another job size, another auth key), protocol_error (the process
  /// at the address is not rank 0 of this job), endpoint_timeout (a rank did not come in time) or
  /// connection_reset (a rank left while the others joined).
  static status create(const bootstrap_params& params, std::unique_ptr<bootstrap>* out,
                       std::string* why = nullptr);

  /// The backend create(params) would choose in this environment, without contacting anyone.
  static bootstrap_choice detect(const bootstrap_params& params = {});

  /// Leaves the job (PMIx_Finalize, closing the connection to rank 0).
  virtual ~bootstrap() = default;

  /// This process's rank, in [0, size()).
  virtual int rank() const noexcept = 0;

  /// The number of processes in the job.
  virtual int size() const noexcept = 0;

  /// The backend in use: "pmix", "address" or "single".
  virtual std::string_view backend_name() const noexcept = 0;

  /// Stores `value` under `key` for every rank to read after the next fence. Keys are at most 255
  /// bytes; values at most 1 MiB (exceeds_limit).
  virtual status put(std::string_view key, const void* value, size_t length) = 0;

  /// Makes this rank's puts since the last commit visible at the next fence.
  virtual status commit() = 0;

  /// Collective: returns once every rank has called fence, with every rank's committed puts
  /// readable. endpoint_timeout after `timeout_ms` (negative: bootstrap_params::timeout_ms);
  /// connection_reset when a rank is gone.
  virtual status fence(int timeout_ms = -1) = 0;

  /// Reads what `rank` stored under `key` before the last fence. no_elem when it stored nothing
  /// there, invalid_param for a rank out of range. Under PMIx a value committed after the last
  /// fence may be read instead (its server shares committed data with its node's processes at
  /// once): give values that change from one fence to the next keys of their own.
  /// The pmix backend returns unsupported for a value of another type (one the launcher put).
  virtual status get(int rank, std::string_view key, std::vector<uint8_t>& out) = 0;

  /// Collective: puts `mine`, commits, fences, then reads every rank r's into all[r]. The key put
  /// is `key` followed by the number of this allgather ("key#3"), so that allgathers under one key
  /// never mix rounds (under PMIx a fast rank's next round could be read otherwise).
  status allgather(std::string_view key, const std::vector<uint8_t>& mine,
                   std::vector<std::vector<uint8_t>>& all, int timeout_ms = -1);

  /// Collective: returns once every rank has called barrier (a fence without data).
  status barrier(int timeout_ms = -1) { return fence(timeout_ms); }

  /// Why the last failed call failed, in words (which rank, what happened, what to do); empty
  /// while every call succeeded.
  const std::string& last_error() const noexcept { return error_; }

protected:
  bootstrap() = default;
  bootstrap(const bootstrap&) = delete;
  bootstrap& operator=(const bootstrap&) = delete;

  /// Records `text` as last_error() and returns `st`.
  status fail(status st, std::string text);

private:
  std::string error_;
  uint64_t allgathers_ = 0;  ///< allgathers so far (the same on every rank: they are collective)
};

}  // namespace comm
