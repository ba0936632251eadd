#!/usr/bin/env bash
# Installs what the build needs (Debian 12, as root), builds libcomm in build/, and runs the demos:
# two processes exchanging tagged and active messages over shared memory (pingpong), then the same
# with CAF actors (actor_pingpong), then a key-value service on remote actors that survives one of
# its servers being killed (kv_service).
#
#   bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
ensure_packages "${COMM_BUILD_PACKAGES[@]}"

jobs=${COMM_JOBS:-2}
timeout 1800 cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
timeout 1800 cmake --build build -j"$jobs" --target pingpong comm_info actor_pingpong kv_service
echo
echo "== comm_info -t shm,self"
timeout 60 build/libcomm/comm_info -t shm,self || echo "(comm_info failed; continuing with the demo)"
echo
echo "== pingpong"
timeout 120 build/examples/pingpong
echo
echo "== actor_pingpong"
timeout 120 build/examples/actor_pingpong
echo
echo "== kv_service"
timeout 120 build/examples/kv_service
