// The pool of large payload buffers (see outbox.hpp).
#include "outbox.hpp"

namespace comm::actors::detail {

namespace {

/// Buffers kept at most.
constexpr size_t pooled_buffers = 8;

std::mutex pool_mtx;
std::vector<std::vector<char>> pool;

}  // namespace

std::vector<char> buffer_pool::take() {
  std::lock_guard<std::mutex> g(pool_mtx);
  if (pool.empty()) return {};
  std::vector<char> out = std::move(pool.back());
  pool.pop_back();
  return out;
}

void buffer_pool::give(std::vector<char>&& buffer) noexcept {
  if (buffer.capacity() < large || buffer.capacity() > max_kept) return;
  buffer.clear();
  std::lock_guard<std::mutex> g(pool_mtx);
  if (pool.size() < pooled_buffers) pool.push_back(std::move(buffer));
}

std::vector<char> buffer_pool::detach(std::vector<char>& scratch) {
  if (scratch.size() < large) return std::vector<char>(scratch.begin(), scratch.end());
  std::vector<char> out = take();
  out.swap(scratch);
  if (scratch.capacity() > max_kept) std::vector<char>().swap(scratch);
  return out;
}

}  // namespace comm::actors::detail
