// The pmix backend: the launcher's PMIx server (Open MPI's mpirun, Slurm's srun --mpi=pmix) keeps
// the key-value store. Put is PMIx_Put(PMIX_GLOBAL) of a byte object, a fence is PMIx_Fence over
// the whole namespace with PMIX_COLLECT_DATA (so that later gets are local) and PMIX_TIMEOUT, a
// get is PMIx_Get with PMIX_OPTIONAL (the local store only: a missing key answers at once).
// Both launchers fail a fence with PMIX_ERR_PARTIAL_SUCCESS within about a second when a rank
// dies in it (measured here), and with PMIX_ERR_TIMEOUT when a rank does not come.
#include "bootstrap_impl.hpp"

#include <pmix.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace comm::detail {

namespace {

/// "NAME (code)" of a PMIx status.
std::string pmix_text(pmix_status_t rc) {
  return std::string(PMIx_Error_string(rc)) + " (" + std::to_string(rc) + ")";
}

/// What a fence's PMIx status means for the caller.
status fence_status(pmix_status_t rc) {
  switch (rc) {
    case PMIX_SUCCESS:
      return status::ok;
    case PMIX_ERR_TIMEOUT:
      return status::endpoint_timeout;
    case PMIX_ERR_PARTIAL_SUCCESS:
    case PMIX_ERR_PROC_ABORTED:
    case PMIX_ERR_PROC_ABORTED_BY_SIG:
    case PMIX_ERR_LOST_CONNECTION:
    case PMIX_ERR_UNREACH:
      return status::connection_reset;
    default:
      return status::io_error;
  }
}

/// Rank and size in the launcher's job.
class pmix_bootstrap final : public bootstrap {
public:
  pmix_bootstrap(const pmix_proc_t& me, int size, int timeout_ms)
      : me_(me), size_(size), timeout_ms_(timeout_ms) {}

  ~pmix_bootstrap() override { PMIx_Finalize(nullptr, 0); }

  int rank() const noexcept override { return static_cast<int>(me_.rank); }
  int size() const noexcept override { return size_; }
  std::string_view backend_name() const noexcept override { return "pmix"; }

  status put(std::string_view key, const void* value, size_t length) override {
    std::string why;
    if (value == nullptr && length != 0) return fail(status::invalid_param, "a null value");
    if (const status st = budget_.charge(key, length, &why); st != status::ok) return fail(st, why);
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = static_cast<char*>(const_cast<void*>(value));
    v.data.bo.size = length;
    const pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, std::string(key).c_str(), &v);
    if (rc == PMIX_SUCCESS) return status::ok;
    return fail(status::io_error, "PMIx_Put of \"" + std::string(key) + "\": " + pmix_text(rc));
  }

  status commit() override {
    const pmix_status_t rc = PMIx_Commit();
    if (rc == PMIX_SUCCESS) return status::ok;
    return fail(status::io_error, "PMIx_Commit: " + pmix_text(rc));
  }

  status fence(int timeout_ms) override {
    const int limit_ms = timeout_ms < 0 ? timeout_ms_ : timeout_ms;
    int seconds = std::max(1, (limit_ms + 999) / 1000);  // PMIx counts whole seconds
    bool collect = true;
    pmix_info_t info[2];
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me_.nspace, PMIX_RANK_WILDCARD);
    const pmix_status_t rc = PMIx_Fence(&all, 1, info, 2);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    const status st = fence_status(rc);
    if (st == status::ok) return st;
    std::string what = "the PMIx server failed it";
    if (st == status::endpoint_timeout) {
      what = "a rank did not enter it within " + std::to_string(seconds) + " s";
    } else if (st == status::connection_reset) {
      what = "a rank of the job is gone";
    }
    return fail(st, "fence at rank " + std::to_string(rank()) + ": " + what + " (PMIx_Fence: " +
                        pmix_text(rc) + ")");
  }

  status get(int rank, std::string_view key, std::vector<uint8_t>& out) override {
    if (rank < 0 || rank >= size_) return status::invalid_param;
    std::string why;
    if (check_record(key, 0, &why) != status::ok) return status::invalid_param;
    pmix_proc_t whom;
    PMIX_LOAD_PROCID(&whom, me_.nspace, static_cast<pmix_rank_t>(rank));
    bool local_only = true;
    pmix_info_t info;
    PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &local_only, PMIX_BOOL);
    pmix_value_t* v = nullptr;
    const pmix_status_t rc = PMIx_Get(&whom, std::string(key).c_str(), &info, 1, &v);
    PMIX_INFO_DESTRUCT(&info);
    if (rc != PMIX_SUCCESS) return rc == PMIX_ERR_NOT_FOUND ? status::no_elem : status::io_error;
    status st = status::unsupported;  // a value of another type, put by someone else
    if (v->type == PMIX_BYTE_OBJECT) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(v->data.bo.bytes);
      out.assign(bytes, bytes + v->data.bo.size);
      st = status::ok;
    }
    PMIX_VALUE_RELEASE(v);
    return st;
  }

private:
  pmix_proc_t me_;
  int size_;
  int timeout_ms_;
  put_budget budget_;
};

/// The job's size (PMIX_JOB_SIZE), or 0.
int job_size(const pmix_proc_t& me) {
  pmix_proc_t job;
  PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
  pmix_value_t* v = nullptr;
  if (PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &v) != PMIX_SUCCESS) return 0;
  const int size = v->type == PMIX_UINT32 ? static_cast<int>(v->data.uint32) : 0;
  PMIX_VALUE_RELEASE(v);
  return size;
}

}  // namespace

status make_pmix_bootstrap(int timeout_ms, std::unique_ptr<bootstrap>* out, std::string* why) {
  pmix_proc_t me;
  PMIX_PROC_CONSTRUCT(&me);
  const pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
  if (rc != PMIX_SUCCESS) {
    const char* ns = std::getenv("PMIX_NAMESPACE");
    *why = "cannot join the launcher's PMIx server (PMIx_Init: " + pmix_text(rc) + "): " +
           (ns != nullptr ? "the environment names one (PMIX_NAMESPACE=" + std::string(ns) +
                                ") but it does not answer"
                          : std::string("start the program with mpirun or srun --mpi=pmix"));
    return status::unreachable;
  }
  const int size = job_size(me);
  if (size < 1 || size > bootstrap_max_size || me.rank >= static_cast<pmix_rank_t>(size)) {
    *why = "the PMIx server gave no usable job size (PMIX_JOB_SIZE " + std::to_string(size) +
           ", rank " + std::to_string(me.rank) + ")";
    PMIx_Finalize(nullptr, 0);
    return status::io_error;
  }
  *out = std::make_unique<pmix_bootstrap>(me, size, timeout_ms);
  return status::ok;
}

}  // namespace comm::detail
