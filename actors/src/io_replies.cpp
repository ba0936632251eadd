// Answering the requests of the io actors once the engine reports their operations' outcomes.
#include "io_replies.hpp"

namespace comm::actors::io::detail {

namespace {

/// Delivers the successful outcome `done` to `rp` in the form `shape` promises.
void deliver(caf::response_promise& rp, reply_shape shape, op_done& done) {
  auto text = [&](size_t i) { return i < done.text.size() ? done.text[i] : std::string{}; };
  switch (shape) {
    case reply_shape::ok:
      return rp.deliver(ok_atom::value);
    case reply_shape::text:
      return rp.deliver(text(0));
    case reply_shape::actor:
      return rp.deliver(std::move(done.actor));
    case reply_shape::actor_and_data:
      return rp.deliver(std::move(done.actor), std::move(done.data));
    case reply_shape::tag_message:
      return rp.deliver(tag_atom::value, done.tag, std::move(done.data));
    case reply_shape::endpoint_info:
      return rp.deliver(text(0), text(1), text(2));
  }
}

}  // namespace

uint64_t pending_replies::add(caf::response_promise rp, reply_shape shape) {
  const uint64_t id = next_id_++;
  entries_.emplace(id, entry{std::move(rp), shape});
  return id;
}

void pending_replies::complete(op_done& done) {
  auto it = entries_.find(done.id);
  if (it == entries_.end()) return;
  entry e = std::move(it->second);
  entries_.erase(it);
  if (is_error(done.st)) {
    e.rp.deliver(make_error(done.st));
  } else {
    deliver(e.rp, e.shape, done);
  }
}

void pending_replies::fail(uint64_t id, const caf::error& err) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  entry e = std::move(it->second);
  entries_.erase(it);
  e.rp.deliver(err);
}

void pending_replies::fail_all(const caf::error& err) {
  auto entries = std::move(entries_);
  entries_.clear();
  for (auto& [id, e] : entries) e.rp.deliver(err);
}

}  // namespace comm::actors::io::detail
