// Lent blobs on a node (lending.hpp): lending a message's attachments, reading lends in place,
// releasing them and forgetting them with their connection. Runs on the thread holding the turn
// lock, except release_sink::push (any thread).
#include "node_state.hpp"

#include "lend_keeper.hpp"

#include <comm/log.hpp>

#include <algorithm>
#include <cstring>

namespace comm::actors::detail {

namespace {

/// True when `p`'s transport lets this process's memory be mapped by the peer.
bool can_lend(const peer& p) { return p.ep != nullptr && p.ep->transport() == "shm"; }

/// Holds the buffer of a copy that libcomm did not finish at once, until its callback.
void free_copy(comm::request*, comm::status, void* user_data) {
  delete static_cast<blob*>(user_data);
}

/// Replaces the runs of `item` borrowed from other connections (and, with `returnable`, from `p`
/// too) by copies of this node's, when `p` is reached over shm.
void copy_borrowed_runs(peer& p, outgoing& item, bool returnable) {
  // The bytes of a blob borrowed from another node (or from `p` over another connection) lie in
  // a mapping of that node's memory, which `p` can reach only by cross-memory attach (refused
  // under Yama's ptrace restrictions) over shm: they travel as a copy of this node's. Those
  // borrowed from `p` itself go back by id when the frame is lent (`returnable` false).
  if (!can_lend(p)) return;  // tcp and verbs read them here, as any of this node's bytes
  for (blob& run : item.attached.runs) {
    if (is_borrowed(run.owner()) && (returnable || !returned_lend(run, p.releases.get()))) {
      run = run.copy();
    }
  }
}

}  // namespace

// -- lending -------------------------------------------------------------------------------------

bool node_state::lend_attached(peer& p, outgoing& item) {
  copy_borrowed_runs(p, item, false);
  const attachment_list& a = item.attached;
  if (!params_.lend_blobs || !can_lend(p) || a.runs.size() > max_lends_per_frame ||
      envelope_writer::size() + item.payload.size() > worker_->max_am_header()) {
    copy_borrowed_runs(p, item, true);
    return false;
  }
  if (!p.lends.watched) watch_borrower(p);
  std::vector<lend_descriptor> runs(a.runs.size());
  size_t fresh = 0;
  for (size_t i = 0; i < a.runs.size(); ++i) {
    runs[i].length = a.runs[i].size();
    if (auto id = returned_lend(a.runs[i], p.releases.get())) {
      runs[i].id = *id;
      runs[i].returned = true;
    } else {
      fresh += a.runs[i].size();
    }
  }
  const size_t used = p.lends.bytes + p.lends.kept_before;
  if (fresh > params_.max_lent_bytes - std::min(used, params_.max_lent_bytes)) {
    copy_borrowed_runs(p, item, true);
    return false;  // beyond the limit: copied
  }
  for (size_t i = 0; i < a.runs.size(); ++i) {
    if (runs[i].returned || lend_one(p, a.runs[i], runs[i])) continue;
    for (size_t j = 0; j < i; ++j) {
      if (!runs[j].returned) take_back(p, runs[j].id);
    }
    copy_borrowed_runs(p, item, true);
    return false;
  }
  item.lends.clear();
  encode_lends(runs, item.lends);
  item.header.flags |= flag_lent;
  return true;
}

void node_state::watch_borrower(peer& p) {
  p.lends.watched = true;
  auto pidfd = p.ep->peer_process_fd();
  if (!pidfd) {
    COMM_LOG(debug, "actors", "no process to watch for lends to connection %llu: %s",
             static_cast<unsigned long long>(p.serial), comm::to_string(pidfd.error()));
    return;
  }
  p.lends.borrower = *pidfd;
  p.lends.borrower_pid = pid_of_pidfd(*pidfd);
  p.lends.kept_before = lend_keeper::instance().bytes_for(p.lends.borrower_pid);
}

bool node_state::lend_one(peer& p, const blob& run, lend_descriptor& d) {
  // Peers may read the bytes, never write them: the borrower's mapping is read-only.
  auto registration =
      worker_->mem_map(comm::mutable_bytes(const_cast<char*>(run.data()), run.size()),
                       comm::mem_access_all & ~comm::mem_remote_write);
  if (!registration) return false;
  auto key = worker_->rkey_pack(**registration);
  if (!key) return false;
  d.id = ++p.lends.next_id;
  d.address = reinterpret_cast<uintptr_t>(run.data());
  d.key = std::move(*key);
  p.lends.lent.emplace(d.id, lend{run, std::move(*registration)});
  p.lends.bytes += run.size();
  blobs_lent_.add(1);
  lent_now_.add(1);
  lent_bytes_now_.add(run.size());
  return true;
}

bool node_state::take_back(peer& p, uint64_t id) {
  auto it = p.lends.lent.find(id);
  if (it == p.lends.lent.end()) return false;
  p.lends.bytes -= it->second.bytes.size();
  lent_now_.sub(1);
  lent_bytes_now_.sub(it->second.bytes.size());
  p.lends.lent.erase(it);  // unmaps the registration; frees the blob unless still used here
  return true;
}

void node_state::lay_out_lent(outgoing& item, const void*& head, size_t& head_length,
                              const void*& data, size_t& length) {
  const auto* envelope = static_cast<const char*>(head);
  joined_.assign(envelope, envelope + head_length);
  joined_.insert(joined_.end(), item.payload.begin(), item.payload.end());
  head = joined_.data();
  head_length = joined_.size();
  data = item.lends.data();
  length = item.lends.size();
}

void node_state::drop_lends(peer& p) {
  if (p.releases) p.releases->close();
  lent_now_.sub(p.lends.lent.size());
  lent_bytes_now_.sub(p.lends.bytes);
  lend_table& t = p.lends;
  if (!t.lent.empty() && t.borrower >= 0 && !process_gone(t.borrower)) {
    // The borrower lives and may still read the bytes: they stay allocated until it exits.
    std::vector<blob> blobs;
    blobs.reserve(t.lent.size());
    for (auto& [id, l] : t.lent) blobs.push_back(std::move(l.bytes));
    COMM_LOG(debug, "actors", "connection %llu closed with %zu blobs lent to pid %d: kept until "
             "it exits", static_cast<unsigned long long>(p.serial), blobs.size(),
             static_cast<int>(t.borrower_pid));
    lend_keeper::instance().keep(t.borrower, t.borrower_pid, std::move(blobs), t.bytes, kept_);
    t.borrower = -1;  // the keeper's now
  }
  t.lent.clear();  // unmaps the registrations: nobody can use the keys without the connection
  t.bytes = 0;
}

// -- borrowing -----------------------------------------------------------------------------------

void node_state::receive_lent(const std::shared_ptr<peer>& p, const frame_header& h,
                              const void* header, size_t header_length, const void* data,
                              size_t length) {
  std::vector<lend_descriptor> lends;
  if (h.kind != frame_kind::message || h.attached == 0 ||
      header_length < envelope_writer::size() || !decode_lends(data, length, lends)) {
    violation(p, "malformed lends");
    return;
  }
  std::vector<blob> runs;
  runs.reserve(lends.size());
  uint64_t total = 0;
  for (const lend_descriptor& d : lends) {
    if (const char* wrong = borrow(p, d, runs)) {
      violation(p, wrong);
      return;  // the runs taken so far are released into the closed sink: nothing is sent
    }
    total += d.length;  // each at most a mapped segment's size: no overflow
  }
  if (total != h.attached) {
    violation(p, "lent bytes differ from the envelope's");
    return;
  }
  frame_parts parts;
  parts.payload = static_cast<const char*>(header) + envelope_writer::size();
  parts.length = header_length - envelope_writer::size();
  parts.attached = attachment_source(std::move(runs));
  receive(p, h, parts);
}

const char* node_state::borrow(const std::shared_ptr<peer>& p, const lend_descriptor& d,
                               std::vector<blob>& runs) {
  if (d.returned) {
    auto it = p->lends.lent.find(d.id);
    if (it == p->lends.lent.end() || it->second.bytes.size() != d.length) {
      return "a blob returned that this node did not lend";
    }
    runs.push_back(it->second.bytes);
    return nullptr;
  }
  if (d.length < attach_threshold) return "a lent blob shorter than an attachment";
  auto key = p->ep->rkey_unpack(comm::const_bytes(d.key.data(), d.key.size()));
  if (!key) return "a lent blob with an invalid key";
  if (!p->releases) p->releases = make_release_sink(p);
  auto here = p->ep->rkey_local_address(**key, d.address, d.length);
  if (here) {
    borrowed_.add(1);
    runs.push_back(borrowed_blob(lent_view{p->releases, std::move(here->mapping), d.id,
                                           static_cast<const char*>(here->data), d.length}));
    return nullptr;
  }
  if (here.error() != comm::status::unsupported) {
    return "a lent blob outside the memory its sender registered";
  }
  return copy_lent(p, d, **key, runs);
}

const char* node_state::copy_lent(const std::shared_ptr<peer>& p, const lend_descriptor& d,
                                  comm::rkey& key, std::vector<blob>& runs) {
  auto* copy = new blob(d.length);
  const comm::iov_entry into{copy->mutable_data(), copy->size()};
  comm::request_params rp;
  rp.send_cb = &free_copy;
  rp.user_data = copy;
  const comm::op o = p->ep->get(&into, 1, d.address, &key, rp);
  if (o.pending()) {
    // Not finished at once (shm's gets always finish at once, and only shm peers lend: a lend
    // over another transport is a peer's fault). The callback frees the buffer.
    worker_->release(o.req);
    return "a lent blob that cannot be read at once";
  }
  blob kept = std::move(*copy);
  delete copy;
  if (o.failed()) return "a lent blob that cannot be read";
  borrowed_copied_.add(1);
  p->releases->push(d.id);  // copied: the sender may have it back
  runs.push_back(std::move(kept));
  return nullptr;
}

std::shared_ptr<release_sink> node_state::make_release_sink(const std::shared_ptr<peer>& p) {
  std::weak_ptr<peer> to = p;
  // The sink is closed (drop_lends) before the node goes: `this` is valid when it notifies.
  return std::make_shared<release_sink>([this, to] {
    post_task([this, to] {
      if (auto p = to.lock()) send_releases(p);
    });
  });
}

void node_state::send_releases(const std::shared_ptr<peer>& p) {
  if (!p->alive.load(std::memory_order_relaxed) || !p->releases) return;
  const std::vector<uint64_t> ids = p->releases->take();
  for (size_t at = 0; at < ids.size(); at += max_releases_per_frame) {
    outgoing* item = new_frame(p, frame_kind::release);
    encode_releases(ids.data() + at, std::min(max_releases_per_frame, ids.size() - at),
                    item->payload);
    submit(item);
  }
}

void node_state::on_release(const std::shared_ptr<peer>& p, const void* data, size_t length) {
  std::vector<uint64_t> ids;
  if (!decode_releases(data, length, ids)) {
    violation(p, "malformed release");
    return;
  }
  for (uint64_t id : ids) {
    if (!take_back(*p, id)) {
      violation(p, "release of a blob that is not lent");
      return;
    }
  }
}

}  // namespace comm::actors::detail
