#include "base/host_identity.hpp"

#include <comm/log.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>

namespace comm::tl {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/// Parses the UUID text of boot_id ("xxxxxxxx-xxxx-...") into 16 bytes; false if malformed.
bool read_boot_id(uint8_t (&out)[16]) {
  std::FILE* file = std::fopen("/proc/sys/kernel/random/boot_id", "re");
  if (file == nullptr) return false;
  char text[64] = {};
  const bool got = std::fgets(text, sizeof(text), file) != nullptr;
  std::fclose(file);
  if (!got) return false;
  size_t n = 0;
  for (const char* p = text; *p != '\0' && *p != '\n' && n < 32; ++p) {
    if (*p == '-') continue;
    const int v = hex_value(*p);
    if (v < 0) return false;
    if (n % 2 == 0) {
      out[n / 2] = static_cast<uint8_t>(v << 4);
    } else {
      out[n / 2] |= static_cast<uint8_t>(v);
    }
    ++n;
  }
  return n == 32;
}

uint64_t namespace_inode(const char* path) {
  struct stat st;
  if (::stat(path, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

host_identity read_identity() {
  host_identity id;
  if (!read_boot_id(id.boot_id)) {
    COMM_LOG(warn, "transport", "cannot read /proc/sys/kernel/random/boot_id");
  }
  id.ipc_ns = namespace_inode("/proc/self/ns/ipc");
  id.net_ns = namespace_inode("/proc/self/ns/net");
  id.pid_ns = namespace_inode("/proc/self/ns/pid");
  return id;
}

}  // namespace

const host_identity& local_host_identity() {
  static const host_identity identity = read_identity();
  return identity;
}

}  // namespace comm::tl
