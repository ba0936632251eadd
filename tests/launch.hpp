// Launching a program as a job of N processes, the ways a user does: under Open MPI's mpirun,
// under Slurm's srun (a single-node Slurm the test starts and stops itself, with
// tests/slurm_cluster.sh), and by hand (N processes given COMM_BOOTSTRAP_ADDRESS, COMM_RANK and
// COMM_SIZE). For the bootstrap's tests and for anyone testing a program that joins a job through
// comm::bootstrap.
//
//   comm::test::launch_options opt;
//   opt.env = {"COMM_LOG_LEVEL=warn"};
//   auto r = comm::test::run_mpirun(4, {program, "arg"}, opt);
//   BOOST_TEST(r.exit_code == 0);
//   BOOST_TEST(r.count("ok") == 4u);                  // lines of output that contain "ok"
//
//   comm::test::slurm_cluster& slurm = comm::test::shared_slurm();  // started once per process
//   BOOST_REQUIRE_MESSAGE(slurm.ok(), slurm.why());
//   auto s = slurm.srun(2, {program}, opt);           // srun --mpi=pmix -n 2 program
//
//   auto h = comm::test::run_by_hand(3, {program}, opt);   // rank 0 listens on a free port
//
// The programs: COMM_TESTS_BINARY_DIR "/comm_bootstrap_probe" (tests/bootstrap_probe.cpp) checks
// the bootstrap; bench's and examples' programs are in their own build folders.
//
// Every launch runs in a process group of its own with a time limit (launch_options::timeout_ms):
// past it the group gets SIGTERM (srun and mpirun then stop their tasks), two seconds later
// SIGKILL. What is left of the group when the launch ends is killed too. The launched processes
// die with the test process (PR_SET_PDEATHSIG), and the Slurm daemons are stopped by a watchdog
// when the test process is gone. stdout and stderr of every process go to one temporary file,
// returned as launch_result::output.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef COMM_TESTS_SOURCE_DIR
#error "COMM_TESTS_SOURCE_DIR must name the tests/ folder (tests/CMakeLists.txt defines it)"
#endif

namespace comm::test {

/// What a launch gave.
struct launch_result {
  /// The launcher's exit code (by hand: the first non-zero exit code of the processes, else 0);
  /// -1 when it was killed (by a signal, or at the time limit).
  int exit_code = -1;
  bool timed_out = false;  ///< it ran into launch_options::timeout_ms
  double seconds = 0;      ///< how long it ran
  std::string output;      ///< stdout and stderr of every process, interleaved

  /// Number of lines of output that contain `text`.
  size_t count(const std::string& text) const {
    std::istringstream in(output);
    size_t n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
    return n;
  }
};

/// How to launch.
struct launch_options {
  std::vector<std::string> env;  ///< "NAME=value" entries added to the processes' environment
  int timeout_ms = 60000;        ///< limit of the whole launch
};

/// Options of run_by_hand.
struct hand_options {
  /// Rank 0's address; empty: 127.0.0.1 and a free port.
  std::string address;
  /// COMM_SIZE given to the processes; 0: as many as are started.
  int size = 0;
  /// The COMM_RANK of each process started, in order; empty: 0 to size - 1. Leave a rank out
  /// for one that never comes, or name one twice.
  std::vector<int> ranks;
  /// Runs in the child of process `index` (into `ranks`) before the program starts (e.g.
  /// netns_pair::enter, or setenv for that process only); false: the child exits with 126.
  std::function<bool(size_t index)> setup;
};

namespace detail {

using clock_type = std::chrono::steady_clock;

/// A temporary file that collects output; removed with the object.
class output_file {
public:
  output_file() {
    char name[] = "/tmp/comm-launch.XXXXXX";
    fd_ = ::mkstemp(name);
    path_ = name;
  }
  ~output_file() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  int fd() const { return fd_; }
  std::string contents() const {
    std::ifstream in(path_);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

private:
  int fd_ = -1;
  std::string path_;
};

/// In a forked child: output to `out`, environment `env` added, a process group `group` (0: a new
/// one), death with the parent; then runs `setup` and execs argv. Never returns.
[[noreturn]] inline void exec_child(const std::vector<std::string>& argv,
                                    const std::vector<std::string>& env, int out, pid_t group,
                                    const std::function<bool()>& setup) {
  ::setpgid(0, group);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(out, STDERR_FILENO);
  const int null = ::open("/dev/null", O_RDONLY);
  if (null >= 0) ::dup2(null, STDIN_FILENO);
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) ::setenv(entry.substr(0, eq).c_str(), entry.c_str() + eq + 1, 1);
  }
  if (setup && !setup()) ::_exit(126);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "launch: cannot run %s\n", args[0]);
  ::_exit(127);
}

/// Starts argv in a child (see exec_child); its pid, or -1.
inline pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   int out, pid_t group, const std::function<bool()>& setup = {}) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) exec_child(argv, env, out, group, setup);
  if (pid > 0) ::setpgid(pid, group == 0 ? pid : group);  // no race with the child's own call
  return pid;
}

/// Waits for every pid until the deadline; then SIGTERM to `group`, and SIGKILL two seconds later.
/// Returns the first non-zero exit code (-1 for a signal), or 0; sets `*timed_out`.
inline int reap(std::vector<pid_t> pids, pid_t group, clock_type::time_point deadline,
                bool* timed_out) {
  int first_failure = 0;
  bool terminated = false;
  auto kill_at = clock_type::time_point::max();
  while (!pids.empty()) {
    for (size_t i = 0; i < pids.size();) {
      int wstatus = 0;
      if (::waitpid(pids[i], &wstatus, WNOHANG) != pids[i]) {
        ++i;
        continue;
      }
      const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
      if (first_failure == 0 && code != 0) first_failure = code;
      pids.erase(pids.begin() + static_cast<long>(i));
    }
    const auto now = clock_type::now();
    if (!terminated && now >= deadline && !pids.empty()) {
      *timed_out = true;
      terminated = true;
      ::kill(-group, SIGTERM);
      kill_at = now + std::chrono::seconds(2);
    }
    if (now >= kill_at) ::kill(-group, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(-group, SIGKILL);  // what the launch left behind
  return *timed_out ? -1 : first_failure;
}

/// A TCP port on 127.0.0.1 that nobody listens on now.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in where{};
  where.sin_family = AF_INET;
  where.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(where);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&where), sizeof(where)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&where), &length) == 0) {
    port = ntohs(where.sin_port);
  }
  ::close(fd);
  return port;
}

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

}  // namespace detail

/// Runs argv (a launcher, or any program) in a process group of its own within the time limit.
inline launch_result run_command(const std::vector<std::string>& argv, const launch_options& opt) {
  detail::output_file out;
  launch_result r;
  const auto start = detail::clock_type::now();
  const pid_t pid = detail::spawn(argv, opt.env, out.fd(), 0);
  if (pid < 0) return r;
  r.exit_code = detail::reap({pid}, pid, start + std::chrono::milliseconds(opt.timeout_ms),
                             &r.timed_out);
  r.seconds = detail::seconds_since(start);
  r.output = out.contents();
  return r;
}

/// mpirun --allow-run-as-root --oversubscribe -np n argv (the environment reaches every rank).
inline launch_result run_mpirun(int n, const std::vector<std::string>& argv,
                                const launch_options& opt) {
  std::vector<std::string> full = {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
                                   std::to_string(n)};
  full.insert(full.end(), argv.begin(), argv.end());
  return run_command(full, opt);
}

/// Starts processes of argv by hand (n, or one per hand_options::ranks entry), each with
/// COMM_BOOTSTRAP_ADDRESS, COMM_RANK and COMM_SIZE, in one process group, and waits for them all.
inline launch_result run_by_hand(int n, const std::vector<std::string>& argv,
                                 const launch_options& opt, const hand_options& hand = {}) {
  detail::output_file out;
  launch_result r;
  const std::string address =
      !hand.address.empty() ? hand.address : "127.0.0.1:" + std::to_string(detail::free_port());
  std::vector<int> ranks = hand.ranks;
  if (ranks.empty()) {
    for (int rank = 0; rank < n; ++rank) ranks.push_back(rank);
  }
  const int size = hand.size > 0 ? hand.size : n;
  const auto start = detail::clock_type::now();
  std::vector<pid_t> pids;
  pid_t group = 0;
  for (size_t index = 0; index < ranks.size(); ++index) {
    std::vector<std::string> env = opt.env;
    env.push_back("COMM_BOOTSTRAP_ADDRESS=" + address);
    env.push_back("COMM_RANK=" + std::to_string(ranks[index]));
    env.push_back("COMM_SIZE=" + std::to_string(size));
    std::function<bool()> setup;
    if (hand.setup) setup = [&hand, index] { return hand.setup(index); };
    const pid_t pid = detail::spawn(argv, env, out.fd(), group, setup);
    if (pid < 0) break;
    if (group == 0) group = pid;
    pids.push_back(pid);
  }
  r.exit_code = detail::reap(pids, group, start + std::chrono::milliseconds(opt.timeout_ms),
                             &r.timed_out);
  r.seconds = detail::seconds_since(start);
  r.output = out.contents();
  return r;
}

/// A single-node Slurm (slurmctld + slurmd as root, no munge, no systemd) in a temporary folder,
/// started by tests/slurm_cluster.sh in the constructor (a few seconds) and stopped in the
/// destructor; a watchdog stops it should this process die first.
class slurm_cluster {
public:
  slurm_cluster() {
    char name[] = "/tmp/comm-slurm.XXXXXX";
    if (::mkdtemp(name) == nullptr) {
      why_ = "cannot make a temporary folder";
      return;
    }
    dir_ = name;
    launch_options opt;
    opt.timeout_ms = 100000;  // the script retries three times for 30 s at most
    const launch_result r = run_command(
        {"bash", script(), "start", dir_, std::to_string(::getpid())}, opt);
    ok_ = r.exit_code == 0;
    if (!ok_) why_ = "the Slurm daemons did not start:\n" + r.output;
  }

  ~slurm_cluster() {
    if (dir_.empty()) return;
    launch_options opt;
    opt.timeout_ms = 30000;
    run_command({"bash", script(), "stop", dir_}, opt);
  }

  slurm_cluster(const slurm_cluster&) = delete;
  slurm_cluster& operator=(const slurm_cluster&) = delete;

  /// True when the node is up.
  bool ok() const { return ok_; }
  /// Why it is not.
  const std::string& why() const { return why_; }
  /// The configuration file (SLURM_CONF) of the cluster.
  std::string conf() const { return dir_ + "/slurm.conf"; }

  /// srun <srun_args> -n n argv, srun_args defaulting to --mpi=pmix.
  launch_result srun(int n, const std::vector<std::string>& argv, const launch_options& opt,
                     const std::vector<std::string>& srun_args = {"--mpi=pmix"}) const {
    std::vector<std::string> full = {"srun"};
    full.insert(full.end(), srun_args.begin(), srun_args.end());
    full.insert(full.end(), {"-n", std::to_string(n)});
    full.insert(full.end(), argv.begin(), argv.end());
    launch_options with_conf = opt;
    with_conf.env.push_back("SLURM_CONF=" + conf());
    return run_command(full, with_conf);
  }

private:
  static std::string script() { return std::string(COMM_TESTS_SOURCE_DIR) + "/slurm_cluster.sh"; }

  std::string dir_;
  bool ok_ = false;
  std::string why_;
};

/// One Slurm cluster for the whole test process, started at the first call and stopped at exit.
inline slurm_cluster& shared_slurm() {
  static slurm_cluster cluster;
  return cluster;
}

}  // namespace comm::test
