# Sourced by demo.sh and test.sh: the Debian 12 packages libcomm builds with, and a function that
# installs whichever of them are missing (as root, through apt-get).

# Compiler, CMake, and every library the build finds (CAF, Cap'n Proto, hwloc, Boost.Test, Google
# Benchmark, rdma-core for the verbs transport, OpenSSL for Cap'n Proto's CMake config, PMIx for
# the bootstrap under mpirun and srun).
COMM_BUILD_PACKAGES=(build-essential cmake pkg-config capnproto libcapnp-dev libssl-dev
  libhwloc-dev libboost-test-dev libbenchmark-dev libcaf-dev libibverbs-dev librdmacm-dev
  libpmix-dev)

# What the tests need besides the build: ip(8), to make the network namespaces of the two-host
# tests; Open MPI's mpirun and Slurm's daemons and srun, to launch jobs (tests/launch.hpp). The
# tests start their own Slurm (tests/slurm_cluster.sh, auth/none: munge is installed with slurmd
# but never used). Installing starts no daemon without an init system (containers, chroots:
# invoke-rc.d finds no runlevel); under systemd munged starts, while slurmd and slurmctld do not
# (their units need /etc/slurm/slurm.conf, which nothing creates). Doxygen, for the test that
# builds the API reference and fails on any warning (the doc target, cmake/CommDoc.cmake).
COMM_TEST_PACKAGES=(iproute2 openmpi-bin slurmctld slurmd slurm-client doxygen)

# What the fuzz step of test.sh and scripts/fuzz.sh need: clang 14 and its runtimes (libFuzzer,
# AddressSanitizer, UBSan).
COMM_FUZZ_PACKAGES=(clang libclang-rt-14-dev)

# What the sanitizer builds of test.sh (address, thread) need besides the tests': llvm-symbolizer,
# which names the frames of a report, and of the CAF hand-offs tests/tsan_caf.supp suppresses by
# function name (test_actors_hostile starts it early for a child that later has no descriptor).
COMM_SANITIZE_PACKAGES=(llvm)

# What bench/compare_ucx.sh needs besides the build: UCX's ucx_perftest, gnuplot, ss.
COMM_BENCH_PACKAGES=(ucx-utils gnuplot-nox iproute2)

# Installs the packages given that are not installed yet. Needs root when any is missing.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  if ((EUID != 0)); then
    echo "missing packages: ${missing[*]}; run as root or: apt-get install -y ${missing[*]}" >&2
    return 1
  fi
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 1200 apt-get update
  timeout 1800 apt-get install -y --no-install-recommends "${missing[@]}"
}
