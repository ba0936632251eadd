// The bootstrap's entry point (comm/bootstrap.hpp): which backend the environment asks for, the
// loud failure when it names a job of several processes that cannot be joined, and the
// operations every backend shares.
#include "bootstrap_impl.hpp"

#include <comm/config.hpp>
#include <comm/log.hpp>

#include <cstdlib>
#include <optional>
#include <string>

namespace comm {

namespace {

/// The value of environment variable `name`, or empty.
std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

/// `text` as a non-negative integer, or nothing.
std::optional<int> parse_count(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || value < 0 || value > (1L << 30)) return std::nullopt;
  return static_cast<int>(value);
}

/// "NAME=value" for a variable that is set, else empty.
std::string shown(const char* name) {
  const std::string value = env(name);
  return value.empty() ? std::string() : std::string(name) + "=" + value;
}

/// The PMIx server variable a launcher that runs one sets ("PMIX_NAMESPACE=..."), or empty.
std::string pmix_evidence() {
  for (const char* name : {"PMIX_NAMESPACE", "PMIX_SERVER_URI41", "PMIX_SERVER_URI4",
                           "PMIX_SERVER_URI3", "PMIX_SERVER_URI2"}) {
    if (std::string found = shown(name); !found.empty()) return found;
  }
  return {};
}

/// A launcher's claim that the job has several processes, with what to do when PMIx is missing.
struct launcher_claim {
  int processes = 0;   ///< 0: no launcher variable says so
  std::string advice;  ///< the failure message
};

/// Reads the launchers' process counts: Open MPI, Slurm, and PMI-1/2 launchers.
launcher_claim read_launcher_claim() {
  struct source {
    const char* variable;
    const char* advice;
  };
  static const source sources[] = {
      {"OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun started it without a PMIx server in the "
                               "environment: use an mpirun built with PMIx (Debian's is)"},
      {"SLURM_STEP_NUM_TASKS", "Slurm's srun started it without PMIx: run it with srun "
                               "--mpi=pmix (or set MpiDefault=pmix in slurm.conf)"},
      {"SLURM_NTASKS", "Slurm allocated several tasks, but this process was not started by srun "
                       "with PMIx: run it with srun --mpi=pmix"},
      {"PMI_SIZE", "a PMI-1/PMI-2 launcher started it: libcomm speaks PMIx only (srun "
                   "--mpi=pmix, mpirun)"},
  };
  for (const source& s : sources) {
    const auto n = parse_count(env(s.variable));
    if (n && *n > 1) {
      return {*n, "the environment says this is one of " + std::to_string(*n) + " processes (" +
                      shown(s.variable) + ") but no PMIx server can be reached: " + s.advice +
                      "; COMM_BOOTSTRAP=single runs each process on its own"};
    }
  }
  return {};
}

/// The backend named by COMM_BOOTSTRAP; nothing for an unknown name.
std::optional<bootstrap_backend> backend_from_environment() {
  const std::string name = env("COMM_BOOTSTRAP");
  if (name.empty() || name == "auto") return bootstrap_backend::automatic;
  if (name == "pmix") return bootstrap_backend::pmix;
  if (name == "address") return bootstrap_backend::address;
  if (name == "single") return bootstrap_backend::single;
  return std::nullopt;
}

/// The address backend's rank-0 address: the parameter, else COMM_BOOTSTRAP_ADDRESS.
std::string job_address(const bootstrap_params& params) {
  return !params.address.empty() ? params.address : env("COMM_BOOTSTRAP_ADDRESS");
}

/// A rank or size: the parameter when set (>= 0), else the variable; -1 when neither is valid.
int param_or_env(int param, const char* variable) {
  if (param >= 0) return param;
  return parse_count(env(variable)).value_or(-1);
}

/// The address backend's job, or invalid_param with `*why` when rank or size is missing or wrong.
status address_job_of(const bootstrap_params& params, detail::address_job* job, std::string* why) {
  job->address = job_address(params);
  job->rank = param_or_env(params.rank, "COMM_RANK");
  job->size = param_or_env(params.size, "COMM_SIZE");
  job->timeout_ms = params.timeout_ms;
  job->auth_key = !params.auth_key.empty() ? params.auth_key : config::from_environment().auth_key;
  if (job->address.empty()) {
    *why = "the address bootstrap needs rank 0's host:port (COMM_BOOTSTRAP_ADDRESS)";
  } else if (job->size < 1 || job->size > detail::bootstrap_max_size) {
    *why = "the address bootstrap needs the job's size, 1 to " +
           std::to_string(detail::bootstrap_max_size) + " (COMM_SIZE)";
  } else if (job->rank < 0 || job->rank >= job->size) {
    *why = "the address bootstrap needs this process's rank, 0 to " +
           std::to_string(job->size - 1) + " (COMM_RANK)";
  } else {
    return status::ok;
  }
  return status::invalid_param;
}

/// The automatic choice: PMIx when a server is in the environment, the address backend when an
/// address is given, single unless a launcher or COMM_SIZE says there are several processes.
bootstrap_choice choose_automatically(const bootstrap_params& params) {
  if (std::string found = pmix_evidence(); !found.empty()) {
    return {bootstrap_backend::pmix, true, "a PMIx server is in the environment (" + found + ")"};
  }
  if (std::string address = job_address(params); !address.empty()) {
    return {bootstrap_backend::address, true, "rank 0 listens at " + address};
  }
  if (launcher_claim claim = read_launcher_claim(); claim.processes > 1) {
    return {bootstrap_backend::pmix, false, claim.advice};
  }
  if (const int size = param_or_env(params.size, "COMM_SIZE"); size > 1) {
    return {bootstrap_backend::address, false,
            "the job has " + std::to_string(size) + " processes (COMM_SIZE) but no rank-0 "
            "address: set COMM_BOOTSTRAP_ADDRESS=host:port (rank 0 listens there)"};
  }
  return {bootstrap_backend::single, true, "no launcher in the environment: one process"};
}

}  // namespace

bootstrap_choice bootstrap::detect(const bootstrap_params& params) {
  if (params.backend != bootstrap_backend::automatic) {
    return {params.backend, true, "chosen by bootstrap_params::backend"};
  }
  const auto named = backend_from_environment();
  if (!named) {
    return {bootstrap_backend::single, false,
            shown("COMM_BOOTSTRAP") + " is not a backend: use pmix, address or single"};
  }
  if (*named != bootstrap_backend::automatic) {
    return {*named, true, "chosen by " + shown("COMM_BOOTSTRAP")};
  }
  return choose_automatically(params);
}

status bootstrap::create(const bootstrap_params& params, std::unique_ptr<bootstrap>* out,
                         std::string* why) {
  std::string ignored;
  std::string& text = why != nullptr ? *why : ignored;
  if (out == nullptr) {
    text = "no place for the bootstrap";
    return status::invalid_param;
  }
  const bootstrap_choice choice = detect(params);
  if (!choice.usable) {
    text = choice.reason;
    COMM_LOG(error, "bootstrap", "%s", text.c_str());
    return choice.backend == bootstrap_backend::pmix ? status::unreachable : status::invalid_param;
  }
  status st = status::ok;
  switch (choice.backend) {
    case bootstrap_backend::pmix:
      st = detail::make_pmix_bootstrap(params.timeout_ms, out, &text);
      break;
    case bootstrap_backend::address: {
      detail::address_job job;
      st = address_job_of(params, &job, &text);
      if (st == status::ok) st = detail::make_address_bootstrap(job, out, &text);
      break;
    }
    default:
      *out = detail::make_single_bootstrap();
      break;
  }
  if (st != status::ok) {
    COMM_LOG(error, "bootstrap", "%s", text.c_str());
    return st;
  }
  COMM_LOG(info, "bootstrap", "rank %d of %d (%s: %s)", (*out)->rank(), (*out)->size(),
           std::string((*out)->backend_name()).c_str(), choice.reason.c_str());
  return status::ok;
}

status bootstrap::allgather(std::string_view key, const std::vector<uint8_t>& mine,
                            std::vector<std::vector<uint8_t>>& all, int timeout_ms) {
  const std::string round = std::string(key) + "#" + std::to_string(allgathers_++);
  status st = put(round, mine.data(), mine.size());
  if (st == status::ok) st = commit();
  if (st == status::ok) st = fence(timeout_ms);
  if (st != status::ok) return st;
  all.assign(static_cast<size_t>(size()), {});
  for (int r = 0; r < size(); ++r) {
    st = get(r, round, all[static_cast<size_t>(r)]);
    if (st != status::ok) {
      return fail(st, "rank " + std::to_string(r) + " stored nothing under \"" + round +
                          "\" in the allgather");
    }
  }
  return status::ok;
}

status bootstrap::fail(status st, std::string text) {
  COMM_LOG(warn, "bootstrap", "%s", text.c_str());
  error_ = std::move(text);
  return st;
}

}  // namespace comm
