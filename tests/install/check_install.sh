#!/usr/bin/env bash
# Installs a built libcomm into a scratch prefix and builds and runs the programs of this folder
# against it twice: as a CMake project using find_package(libcomm), and with the compiler alone
# using pkg-config's flags. Run by CTest (test install_consumer, see tests/CMakeLists.txt):
#
#   check_install.sh <build dir> <scratch dir>
#
# Environment: CXX (the compiler), COMM_LAUNCHER (e.g. ccache, may be empty), COMM_CXX_FLAGS
# (sanitizer flags of the build, for compiling and linking), COMM_LIBDIR (the install's library
# folder, relative to the prefix), COMM_WITH_ACTORS (1: also the actor program).
# The scratch dir is emptied first and removed at exit, whatever happens; CTest shows the output
# of every step when the test fails.
set -euo pipefail
build=$1
scratch=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=$scratch/prefix
programs=(self_tag)
[[ ${COMM_WITH_ACTORS:-1} == 1 ]] && programs+=(actor_echo)

rm -rf "$scratch"
mkdir -p "$scratch"
trap 'rm -rf "$scratch"' EXIT

# Runs the built program $1, which prints "<name>: ok" and exits 0 when it did its work.
run() {
  local out status=0
  out=$(timeout 60 "$1") || status=$?
  echo "$out"
  [[ $status == 0 && $out == "$(basename "$1"): ok" ]] || { echo "$1 failed: exit $status" >&2; return 1; }
}

echo "== cmake --install $build --prefix $prefix"
timeout 300 cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/$COMM_LIBDIR/cmake/libcomm/libcommConfig.cmake"
test -f "$prefix/$COMM_LIBDIR/pkgconfig/libcomm.pc"

echo "== find_package(libcomm)"
with_actors=OFF
[[ ${COMM_WITH_ACTORS:-1} == 1 ]] && with_actors=ON
timeout 300 cmake -S "$here" -B "$scratch/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_CXX_COMPILER_LAUNCHER="${COMM_LAUNCHER:-}" \
  -DCMAKE_CXX_FLAGS="${COMM_CXX_FLAGS:-}" -DCONSUMER_ACTORS=$with_actors
timeout 600 cmake --build "$scratch/cmake" -j2
for p in "${programs[@]}"; do run "$scratch/cmake/$p"; done

echo "== pkg-config"
export PKG_CONFIG_PATH=$prefix/$COMM_LIBDIR/pkgconfig
mkdir -p "$scratch/pkg-config"
for p in "${programs[@]}"; do
  module=libcomm
  [[ $p == actor_* ]] && module=libcomm-actors
  # shellcheck disable=SC2046,SC2086  # the flags are words
  timeout 600 ${COMM_LAUNCHER:-} "$CXX" -std=c++20 ${COMM_CXX_FLAGS:-} "$here/$p.cpp" \
    -o "$scratch/pkg-config/$p" $(pkg-config --cflags --libs $module) \
    -Wl,-rpath,"$(pkg-config --variable=libdir $module)"
  run "$scratch/pkg-config/$p"
done
