// Lent blobs: the sink of releases, borrowed blobs and the lend codecs (see lending.hpp).
#include "lending.hpp"

#include <comm/log.hpp>
#include <comm/wire/codec.hpp>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "schema/actor.capnp.h"

#include <unistd.h>

#include <new>

namespace comm::actors::detail {

lend_table::~lend_table() {
  if (borrower >= 0) ::close(borrower);
}

namespace {

/// Appends the flat array of `message` to `out`.
void append_message(capnp::MessageBuilder& message, std::vector<char>& out) {
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asChars();
  out.insert(out.end(), bytes.begin(), bytes.end());
}

}  // namespace

// -- release_sink --------------------------------------------------------------------------------

void release_sink::push(uint64_t id) noexcept {
  // Notified under the lock: once close() returned, the node (which notify_ posts to) is never
  // touched again. The task it posts takes every id pushed until it runs.
  std::lock_guard<std::mutex> g(mtx_);
  if (closed_) return;
  try {
    ids_.push_back(id);
    if (ids_.size() == 1) notify_();
  } catch (const std::bad_alloc&) {
    // Out of memory: the lender keeps this lend until the connection ends.
    COMM_LOG(warn, "actors", "no memory to queue the release of lend %llu",
             static_cast<unsigned long long>(id));
  }
}

std::vector<uint64_t> release_sink::take() {
  std::lock_guard<std::mutex> g(mtx_);
  return std::exchange(ids_, {});
}

void release_sink::close() {
  std::lock_guard<std::mutex> g(mtx_);
  closed_ = true;
  ids_.clear();
  ids_.shrink_to_fit();
}

// -- borrowed blobs ------------------------------------------------------------------------------

blob borrowed_blob(const lent_view& view) {
  return blob::share(std::shared_ptr<const void>(view.data, view), view.data, view.size);
}

bool is_borrowed(const std::shared_ptr<const void>& owner) noexcept {
  return std::get_deleter<lent_view>(owner) != nullptr;
}

std::optional<uint64_t> returned_lend(const blob& run, const release_sink* sink) noexcept {
  const auto* view = std::get_deleter<lent_view>(run.owner());
  if (view == nullptr || view->sink.get() != sink || view->data != run.data() ||
      view->size != run.size()) {
    return std::nullopt;
  }
  return view->id;
}

// -- codecs --------------------------------------------------------------------------------------

void encode_lends(const std::vector<lend_descriptor>& runs, std::vector<char>& out) {
  capnp::MallocMessageBuilder message;
  auto list = message.initRoot<wire::schema::ActorLends>().initRuns(
      static_cast<unsigned>(runs.size()));
  for (size_t i = 0; i < runs.size(); ++i) {
    auto run = list[static_cast<unsigned>(i)];
    const lend_descriptor& d = runs[i];
    run.setId(d.id);
    run.setAddress(d.address);
    run.setLength(d.length);
    run.setReturned(d.returned);
    if (!d.key.empty()) run.setKey(kj::arrayPtr(d.key.data(), d.key.size()));
  }
  append_message(message, out);
}

bool decode_lends(const void* data, size_t length, std::vector<lend_descriptor>& out) {
  bool fits = false;
  const bool valid = wire::read_checked_message<wire::schema::ActorLends>(
      data, length, [&](wire::schema::ActorLends::Reader root) {
        auto runs = root.getRuns();
        if (runs.size() == 0 || runs.size() > max_lends_per_frame) return;
        out.reserve(runs.size());
        for (auto run : runs) {
          lend_descriptor d;
          d.id = run.getId();
          d.address = run.getAddress();
          d.length = run.getLength();
          d.returned = run.getReturned();
          auto key = run.getKey();
          d.key.assign(key.begin(), key.end());
          out.push_back(std::move(d));
        }
        fits = true;
      });
  return valid && fits;
}

void encode_releases(const uint64_t* ids, size_t count, std::vector<char>& out) {
  capnp::MallocMessageBuilder message;
  auto list = message.initRoot<wire::schema::ActorReleases>().initIds(
      static_cast<unsigned>(count));
  for (size_t i = 0; i < count; ++i) list.set(static_cast<unsigned>(i), ids[i]);
  append_message(message, out);
}

bool decode_releases(const void* data, size_t length, std::vector<uint64_t>& out) {
  bool some = false;
  const bool valid = wire::read_checked_message<wire::schema::ActorReleases>(
      data, length, [&](wire::schema::ActorReleases::Reader root) {
        auto ids = root.getIds();
        out.reserve(ids.size());
        for (uint64_t id : ids) out.push_back(id);
        some = !out.empty();
      });
  return valid && some;
}

}  // namespace comm::actors::detail
