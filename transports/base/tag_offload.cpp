#include "base/tag_offload.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::tl {
namespace {

/// What tag_context::priv holds while the context is posted.
struct posted_state {
  const void* owner = nullptr;  ///< the tag_offload it is posted on
  uint32_t index = 0;           ///< its entry
  uint32_t generation = 0;      ///< the entry's generation at the post
};
static_assert(sizeof(posted_state) <= tag_priv_length);

posted_state read_state(const tag_context* ctx) {
  posted_state state;
  std::memcpy(&state, ctx->priv, sizeof(state));
  return state;
}

void write_state(tag_context* ctx, const posted_state& state) {
  std::memcpy(ctx->priv, &state, sizeof(state));
}

}  // namespace

// -- tag_match ------------------------------------------------------------------------------------

size_t tag_match::scatter(size_t offset, const void* data, size_t length) const {
  const auto* from = static_cast<const uint8_t*>(data);
  size_t copied = 0;
  for (size_t i = 0; i < count && copied < length; ++i) {
    const size_t entry_length = entries[i].length;
    if (offset >= entry_length) {
      offset -= entry_length;
      continue;
    }
    const size_t n = std::min(entry_length - offset, length - copied);
    std::memcpy(static_cast<uint8_t*>(const_cast<void*>(entries[i].buffer)) + offset,
                from + copied, n);
    copied += n;
    offset = 0;
  }
  return copied;
}

size_t tag_match::clipped(size_t length, iov* out) const {
  size_t used = 0;
  for (size_t i = 0; i < count && length > 0; ++i) {
    const size_t n = std::min(entries[i].length, length);
    if (n == 0) continue;
    out[used++] = {entries[i].buffer, n};
    length -= n;
  }
  return used;
}

// -- posted receives ------------------------------------------------------------------------------

tag_offload::tag_offload(size_t max_outstanding) : entries_(max_outstanding) {
  for (size_t i = entries_.size(); i-- > 0;) {
    entries_[i].next = free_;
    free_ = static_cast<uint32_t>(i);
  }
}

uint32_t tag_offload::find(const tag_context* ctx) const {
  const posted_state state = read_state(ctx);
  if (state.owner != this || state.index >= entries_.size()) return none;
  const entry& e = entries_[state.index];
  return e.ctx == ctx && e.generation == state.generation ? state.index : none;
}

status tag_offload::post(tag_t tag, tag_t mask, const iov* entries, size_t count,
                         tag_context* ctx) {
  if (ctx == nullptr || count > tag_recv_max_iov || (entries == nullptr && count != 0)) {
    return status::invalid_param;
  }
  if (find(ctx) != none) return status::invalid_param;  // posted twice
  size_t capacity = 0;
  for (size_t i = 0; i < count; ++i) {
    if (entries[i].buffer == nullptr && entries[i].length != 0) return status::invalid_param;
    if (entries[i].length > SIZE_MAX - capacity) return status::invalid_param;
    capacity += entries[i].length;
  }
  if (free_ == none) return status::exceeds_limit;
  const uint32_t index = free_;
  entry& e = entries_[index];
  free_ = e.next;
  e.ctx = ctx;
  e.tag = tag & mask;
  e.mask = mask;
  ++e.generation;
  std::copy(entries, entries + count, e.match.entries);
  e.match.count = count;
  e.match.capacity = capacity;
  e.prev = tail_;
  e.next = none;
  if (tail_ == none) {
    head_ = index;
  } else {
    entries_[tail_].next = index;
  }
  tail_ = index;
  ++posted_;
  write_state(ctx, {this, index, e.generation});
  return status::ok;
}

void tag_offload::unlink(uint32_t index) {
  entry& e = entries_[index];
  if (e.prev == none) {
    head_ = e.next;
  } else {
    entries_[e.prev].next = e.next;
  }
  if (e.next == none) {
    tail_ = e.prev;
  } else {
    entries_[e.next].prev = e.prev;
  }
  write_state(e.ctx, {});
  e.ctx = nullptr;
  e.prev = none;
  e.next = free_;
  free_ = index;
  --posted_;
}

status tag_offload::cancel(tag_context* ctx, bool force) {
  if (ctx == nullptr) return status::invalid_param;
  const uint32_t index = find(ctx);
  if (index == none) return status::no_elem;
  unlink(index);
  ++canceled_;
  if (!force && ctx->completed != nullptr) ctx->completed(ctx, 0, 0, 0, status::canceled);
  return status::ok;
}

bool tag_offload::find_posted(tag_t stag, tag_match* out) const {
  for (uint32_t index = head_; index != none; index = entries_[index].next) {
    const entry& e = entries_[index];
    if ((stag & e.mask) != e.tag) continue;
    *out = e.match;
    out->ctx = e.ctx;
    out->index = index;
    return true;
  }
  return false;
}

void tag_offload::finish(const tag_match& match, tag_t stag, uint64_t imm, size_t length,
                         status result) {
  if (result == status::ok && length > match.capacity) {
    result = status::message_truncated;
    ++truncated_;
  }
  tag_context* ctx = match.ctx;
  if (ctx->tag_consumed != nullptr) ctx->tag_consumed(ctx);
  if (ctx->completed != nullptr) ctx->completed(ctx, stag, imm, length, result);
}

void tag_offload::deliver(const tag_match& match, tag_t stag, uint64_t imm, const void* data,
                          size_t length) {
  match.scatter(0, data, length);
  finish(match, stag, imm, length, status::ok);
}

void tag_offload::deliver_request(const tag_match& match, tag_t stag, const void* header,
                                  size_t length) {
  tag_context* ctx = match.ctx;
  if (ctx->tag_consumed != nullptr) ctx->tag_consumed(ctx);
  if (ctx->rndv != nullptr) {
    ctx->rndv(ctx, stag, header, length, status::ok);
  } else if (ctx->completed != nullptr) {
    // A receive without a rendezvous callback cannot take the request: it ends without data.
    ctx->completed(ctx, stag, 0, 0, status::unsupported);
  }
}

// -- unexpected messages --------------------------------------------------------------------------

void tag_offload::set_handlers(tag_unexp_eager_fn eager, void* eager_arg, tag_unexp_rndv_fn rndv,
                               void* rndv_arg) {
  eager_fn_ = eager;
  eager_arg_ = eager_arg;
  rndv_fn_ = rndv;
  rndv_arg_ = rndv_arg;
}

status tag_offload::unexpected_eager(void* data, size_t length, unsigned flags, tag_t stag,
                                     uint64_t imm, void** context) {
  const bool first = (flags & tag_flag_first) != 0;
  if (eager_fn_ == nullptr) {
    if (first) {
      ++dropped_;
      COMM_LOG(debug, "tag", "unexpected eager message (tag %llx) without a handler, dropped",
               static_cast<unsigned long long>(stag));
    }
    return status::ok;
  }
  if (first) ++unexpected_eager_;
  return eager_fn_(eager_arg_, data, length, flags, stag, imm, context);
}

void tag_offload::unexpected_rndv(tag_t stag, const void* header, size_t header_length,
                                  uint64_t remote_address, size_t length, const void* rkey,
                                  size_t rkey_length) {
  if (rndv_fn_ == nullptr) {
    ++dropped_;
    COMM_LOG(debug, "tag", "unexpected rendezvous (tag %llx) without a handler, dropped",
             static_cast<unsigned long long>(stag));
    return;
  }
  ++unexpected_rndv_;
  rndv_fn_(rndv_arg_, 0, stag, header, header_length, remote_address, length, rkey, rkey_length);
}

std::string tag_offload::info(std::string_view transport) const {
  std::string text(transport);
  text += ": tag: " + std::to_string(posted_) + " of " + std::to_string(entries_.size()) +
          " receives posted; " + std::to_string(matched_) + " matched (" +
          std::to_string(truncated_) + " truncated), " + std::to_string(canceled_) +
          " canceled; unexpected: " + std::to_string(unexpected_eager_) + " eager, " +
          std::to_string(unexpected_rndv_) + " rendezvous, " + std::to_string(dropped_) +
          " dropped without a handler\n";
  return text;
}

}  // namespace comm::tl
