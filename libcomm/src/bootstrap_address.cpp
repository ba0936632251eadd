// The address backend: processes started by hand. Rank 0 listens at the job's address through
// libcomm's connection manager (so the tcp handshake, its validation and the COMM_AUTH_KEY
// challenge are the same as every client-server connection's); every other rank connects to it
// with a BootstrapHello (serialization/schema/bootstrap.capnp) as private data, retrying while
// nobody listens yet. After that the bootstrap's own worker carries fences as active messages:
//
//   rank r -> rank 0   contribute(epoch, r's committed records)
//   rank 0 -> rank r   release(epoch, every rank's records of that epoch)   once all contributed
//   rank 0 -> rank r   abort(status, culprit)                                when the fence failed
//
// Fence 0 is the join inside create(): it returns once every rank is there. A rank that leaves
// (its endpoint fails) fails the fence in progress and every later one, on every rank: rank 0
// tells the others with an abort, and rank 0's own departure reaches them through their
// endpoints. Every wait is bounded by the fence's timeout.
#include "bootstrap_impl.hpp"

#include <comm/context.hpp>
#include <comm/log.hpp>
#include <comm/wire/codec.hpp>
#include <comm/worker.hpp>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "schema/bootstrap.capnp.h"

namespace comm::detail {

namespace {

using clock_type = std::chrono::steady_clock;
using wire::schema::BootstrapFence;
using wire::schema::BootstrapHello;
using wire::schema::BootstrapRecords;

/// Active message id of fence messages on the bootstrap's own worker.
constexpr uint16_t fence_am_id = 0xB007;
/// "COMMBOT" followed by the protocol version.
constexpr uint64_t hello_magic = 0x434f4d4d424f5401ull;
/// Pause between connection attempts while rank 0 does not listen yet.
constexpr std::chrono::milliseconds retry_pause{100};
/// Longest sleep between progress calls while waiting (failures are noticed at least this often).
constexpr int max_sleep_ms = 100;
/// Most progress calls in a row before the waiting loop looks at its condition again.
constexpr int max_progress_calls = 64;
/// How much longer than rank 0 the other ranks wait in a fence, so that rank 0's verdict (which
/// knows who is missing) reaches them before their own limit does.
constexpr std::chrono::milliseconds verdict_grace{1000};
/// How long teardown and a failed fence wait for their last messages to leave.
constexpr std::chrono::milliseconds drain_time{500};
/// Largest header read (a newer peer's may be longer than ours).
constexpr size_t max_header = 64;

enum class fence_kind : uint8_t { contribute = 1, release = 2, abort = 3 };

/// A decoded BootstrapHello.
struct hello {
  uint32_t rank = 0;
  uint32_t size = 0;
};

std::vector<uint8_t> encode_hello(int rank, int size) {
  wire::header_writer<BootstrapHello> writer;
  writer.fields().setMagic(hello_magic);
  writer.fields().setRank(static_cast<uint32_t>(rank));
  writer.fields().setSize(static_cast<uint32_t>(size));
  const auto* bytes = static_cast<const uint8_t*>(writer.bytes());
  return std::vector<uint8_t>(bytes, bytes + writer.size());
}

/// Copies up to max_header bytes to an aligned buffer and reads a data-only header from them.
template <class Struct>
std::optional<typename Struct::Reader> read_copied(const void* data, size_t length,
                                                   uint64_t (&buffer)[max_header / 8]) {
  if (data == nullptr || length > max_header) return std::nullopt;
  std::memcpy(buffer, data, length);
  return wire::read_header<Struct>(buffer, length);
}

std::optional<hello> decode_hello(const void* data, size_t length) {
  uint64_t buffer[max_header / 8];
  auto root = read_copied<BootstrapHello>(data, length, buffer);
  if (!root || root->getMagic() != hello_magic) return std::nullopt;
  return hello{root->getRank(), root->getSize()};
}

/// A decoded BootstrapFence.
struct fence_header {
  fence_kind kind = fence_kind::abort;
  status st = status::ok;
  uint32_t rank = 0;
  uint32_t epoch = 0;
};

std::optional<fence_header> decode_fence(const void* data, size_t length) {
  uint64_t buffer[max_header / 8];
  auto root = read_copied<BootstrapFence>(data, length, buffer);
  if (!root) return std::nullopt;
  const uint8_t kind = root->getKind();
  if (kind < 1 || kind > 3) return std::nullopt;
  // An abort carries one of the failures a fence has; anything else reads as a lost rank.
  status st = static_cast<status>(root->getStatus());
  if (st != status::endpoint_timeout && st != status::protocol_error) st = status::connection_reset;
  return fence_header{static_cast<fence_kind>(kind), st, root->getRank(), root->getEpoch()};
}

kj::Array<capnp::word> encode_records(const std::vector<bootstrap_record>& records) {
  capnp::MallocMessageBuilder message;
  auto list = message.initRoot<BootstrapRecords>().initRecords(
      static_cast<unsigned>(records.size()));
  for (unsigned i = 0; i < records.size(); ++i) {
    const bootstrap_record& r = records[i];
    list[i].setRank(r.rank);
    list[i].setKey(kj::arrayPtr(reinterpret_cast<const kj::byte*>(r.key.data()), r.key.size()));
    list[i].setValue(kj::arrayPtr(r.value.data(), r.value.size()));
  }
  return capnp::messageToFlatArray(message);
}

/// Reads the records of a fence message (8-byte aligned: the worker's am_alignment). False for
/// bytes that are not a BootstrapRecords message.
bool decode_records(const void* data, size_t length, std::vector<bootstrap_record>& out) {
  if (length == 0 || length % sizeof(capnp::word) != 0 ||
      reinterpret_cast<uintptr_t>(data) % sizeof(capnp::word) != 0) {
    return false;
  }
  const size_t words = length / sizeof(capnp::word);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = words + 16;  // no part of the message read twice
  options.nestingLimit = 4;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    capnp::FlatArrayMessageReader reader(
        kj::arrayPtr(static_cast<const capnp::word*>(data), words), options);
    for (auto record : reader.getRoot<BootstrapRecords>().getRecords()) {
      auto key = record.getKey();
      auto value = record.getValue();
      out.push_back({record.getRank(), std::string(key.begin(), key.end()),
                     std::vector<uint8_t>(value.begin(), value.end())});
    }
  });
  return failure == nullptr;
}

/// "ranks 1, 2 and 5" (at most eight named).
std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    if (i != 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) text += " and " + std::to_string(ranks.size() - 8) + " more";
  return text;
}

int remaining_ms(clock_type::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          clock_type::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

/// The configuration of the bootstrap's context: the environment's, with the job's key, and tcp
/// among the transports (rank 0 may be on another host whatever COMM_TLS says).
config bootstrap_config(const std::string& auth_key) {
  config cfg = config::from_environment();
  cfg.auth_key = auth_key;
  if (!cfg.transports.empty() && !cfg.transport_enabled("tcp")) cfg.transports.push_back("tcp");
  return cfg;
}

/// A process of a job started by hand (see the file comment).
class address_bootstrap final : public stored_bootstrap {
public:
  explicit address_bootstrap(const address_job& job)
      : stored_bootstrap(job.rank, job.size), job_(job), peers_(static_cast<size_t>(job.size)) {
    for (size_t r = 0; r < peers_.size(); ++r) peers_[r].rank = static_cast<int>(r);
  }

  ~address_bootstrap() override {
    if (worker_) close_endpoints();
    listener_.reset();
    worker_.reset();
  }

  /// Listens (rank 0) or connects to rank 0, then waits for every rank (fence 0).
  status start(std::string* why) {
    const auto deadline = clock_type::now() + std::chrono::milliseconds(job_.timeout_ms);
    status st = open_worker(why);
    if (st == status::ok) st = is_root() ? listen(why) : connect_to_root(deadline, why);
    if (st == status::ok) st = run_fence(deadline);
    if (st != status::ok && why->empty()) *why = last_error();
    reject_refused();
    listener_.reset();  // everyone is here (or the job failed): nobody else may join
    return st;
  }

  int rank() const noexcept override { return job_.rank; }
  int size() const noexcept override { return job_.size; }
  std::string_view backend_name() const noexcept override { return "address"; }

  status fence(int timeout_ms) override {
    const int limit = timeout_ms < 0 ? job_.timeout_ms : timeout_ms;
    return run_fence(clock_type::now() + std::chrono::milliseconds(limit));
  }

private:
  /// What this process knows of one rank: rank 0 of every other, the others of rank 0.
  struct peer {
    int rank = 0;
    endpoint_ptr ep;
    bool gone = false;     ///< its endpoint failed
    bool arrived = false;  ///< rank 0: its contribution to the current fence is here
    bool told = false;     ///< rank 0: it was sent the abort
  };

  bool is_root() const noexcept { return job_.rank == 0; }

  // -- setting up --------------------------------------------------------------------------------

  status open_worker(std::string* why) {
    ctx_ = std::make_unique<context>(bootstrap_config(job_.auth_key));
    worker_params wp;
    wp.name = "bootstrap-rank-" + std::to_string(job_.rank);
    wp.am_alignment = sizeof(capnp::word);
    auto made = worker::create(*ctx_, wp);
    if (!made) {
      *why = std::string("cannot create the bootstrap's worker: ") + to_string(made.error());
      return made.error();
    }
    worker_ = std::move(*made);
    const status st = worker_->set_am_handler(fence_am_id, &address_bootstrap::on_message, this,
                                              am_flag_whole_msg | am_flag_fetch_rndv);
    if (st != status::ok) *why = std::string("cannot install the fence handler: ") + to_string(st);
    return st;
  }

  status listen(std::string* why) {
    listener_params lp;
    lp.address = job_.address;
    lp.on_request = &address_bootstrap::on_request;
    lp.arg = this;
    auto made = worker_->listen(lp);
    const status st = made.error();
    if (made) listener_ = std::move(*made);
    if (st == status::busy) {
      *why = "rank 0 cannot listen at " + job_.address + ": the port is in use (another job?)";
    } else if (st != status::ok) {
      *why = "rank 0 cannot listen at " + job_.address + ": " + to_string(st);
    }
    return st == status::ok ? st : status::unreachable;
  }

  /// Connects to rank 0, retrying while nobody listens there, until `deadline`.
  status connect_to_root(clock_type::time_point deadline, std::string* why) {
    for (;;) {
      const status st = try_connect(deadline);
      if (st == status::ok) return st;
      if (st == status::unreachable && clock_type::now() + retry_pause < deadline) {
        std::this_thread::sleep_for(retry_pause);
        continue;
      }
      *why = connect_failure_text(st);
      return st;
    }
  }

  status try_connect(clock_type::time_point deadline) {
    endpoint_params p;
    p.private_data = encode_hello(job_.rank, job_.size);
    p.on_error = &address_bootstrap::on_error;
    p.error_arg = this;
    p.on_connect = &address_bootstrap::on_connect;
    p.connect_arg = this;
    p.timeout_ms = std::max(remaining_ms(deadline), 1);
    connect_result_ = status::in_progress;
    auto made = worker_->connect(job_.address, p);
    if (!made) return made.error();
    peers_[0].ep = std::move(*made);
    progress_until([this] { return connect_result_ != status::in_progress; }, deadline);
    if (connect_result_ == status::in_progress) connect_result_ = status::endpoint_timeout;
    if (connect_result_ != status::ok) discard(peers_[0]);
    return connect_result_;
  }

  std::string connect_failure_text(status st) const {
    const std::string who = "rank " + std::to_string(job_.rank) + " of " +
                            std::to_string(job_.size);
    switch (st) {
      case status::unreachable:
        return who + ": nobody listened at " + job_.address + " within " +
               std::to_string(job_.timeout_ms) + " ms (rank 0 not started, or a wrong address)";
      case status::rejected:
        return who + ": rank 0 at " + job_.address + " refused it: another process has this " +
               "rank, the job sizes differ, or the auth keys (COMM_AUTH_KEY) differ";
      case status::protocol_error:
        return who + ": the process at " + job_.address + " is not rank 0 of a job of " +
               std::to_string(job_.size);
      case status::endpoint_timeout:
        return who + ": rank 0 at " + job_.address + " did not answer within " +
               std::to_string(job_.timeout_ms) + " ms";
      default:
        return who + ": cannot connect to rank 0 at " + job_.address + ": " + to_string(st);
    }
  }

  // -- connection callbacks ----------------------------------------------------------------------

  static void on_request(void* arg, conn_request* request) {
    static_cast<address_bootstrap*>(arg)->admit(request);
  }

  /// Rank 0: accepts a rank that is not here yet and belongs to this job, rejects anyone else.
  void admit(conn_request* request) {
    conn_request_attr attr;
    listener_->query(request, &attr);
    const auto h = decode_hello(attr.private_data.data(), attr.private_data.size());
    const bool fits = h && h->size == static_cast<uint32_t>(job_.size) && h->rank != 0 &&
                      h->rank < h->size && !peers_[h->rank].ep && failure_ == status::ok;
    if (!fits) {
      COMM_LOG(warn, "bootstrap", "rank 0 refuses %s: %s", attr.client_address.c_str(),
               !h ? "not a bootstrap hello"
                  : h->size != static_cast<uint32_t>(job_.size) ? "another job size"
                                                                : "its rank is taken or invalid");
      refused_.push_back(request);
      return;
    }
    endpoint_params p;
    p.private_data = encode_hello(0, job_.size);
    p.on_error = &address_bootstrap::on_error;
    p.error_arg = this;
    if (auto ep = worker_->accept(request, p)) peers_[h->rank].ep = std::move(*ep);
  }

  static void on_connect(void* arg, endpoint*, const uint8_t* data, size_t length) {
    auto* self = static_cast<address_bootstrap*>(arg);
    const auto h = decode_hello(data, length);
    const bool root = h && h->rank == 0 && h->size == static_cast<uint32_t>(self->job_.size);
    self->connect_result_ = root ? status::ok : status::protocol_error;
  }

  static void on_error(void* arg, endpoint* ep, status reason) {
    auto* self = static_cast<address_bootstrap*>(arg);
    if (!self->is_root() && self->connect_result_ == status::in_progress) {
      self->connect_result_ = reason;
      return;
    }
    for (peer& p : self->peers_) {
      if (p.ep.get() != ep || p.gone) continue;
      p.gone = true;
      self->lose(p.rank, status::connection_reset,
                 "rank " + std::to_string(p.rank) + " (" + ep->peer_name() +
                     ") is gone: " + to_string(reason));
    }
  }

  // -- fence messages ----------------------------------------------------------------------------

  static status on_message(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const am_recv_params& params) {
    auto* self = static_cast<address_bootstrap*>(arg);
    peer* from = self->sender(params);
    const auto h = decode_fence(header, header_length);
    if (from == nullptr) {
      COMM_LOG(warn, "bootstrap", "a fence message from an unknown endpoint: dropped");
    } else if (!h) {
      self->violation(*from, "a malformed fence header");
    } else if (self->is_root()) {
      self->take_contribution(*from, *h, data, length);
    } else {
      self->take_answer(*h, data, length);
    }
    return status::ok;
  }

  peer* sender(const am_recv_params& params) {
    if ((params.attr & am_recv_reply_ep) == 0) return nullptr;
    for (peer& p : peers_) {
      if (p.ep && p.ep.get() == params.reply_ep) return &p;
    }
    return nullptr;
  }

  void violation(peer& from, const std::string& what) {
    lose(from.rank, status::protocol_error,
         "rank " + std::to_string(from.rank) + " broke the bootstrap protocol: " + what);
  }

  /// Rank 0: the records of one rank for the current fence.
  void take_contribution(peer& from, const fence_header& h, const void* data, size_t length) {
    std::vector<bootstrap_record> records;
    if (h.kind != fence_kind::contribute || h.rank != static_cast<uint32_t>(from.rank) ||
        h.epoch != epoch_ || from.arrived) {
      violation(from, "an unexpected fence message");
    } else if (length > 2 * bootstrap_max_rank_bytes || !decode_records(data, length, records)) {
      violation(from, "malformed or oversized records");
    } else if (std::any_of(records.begin(), records.end(), [&](const bootstrap_record& r) {
                 return r.rank != h.rank;
               })) {
      violation(from, "records in another rank's name");
    } else {
      from.arrived = true;
      ++arrived_;
      std::move(records.begin(), records.end(), std::back_inserter(gathered_));
    }
  }

  /// Every rank but 0: rank 0's release or abort.
  void take_answer(const fence_header& h, const void* data, size_t length) {
    if (h.kind == fence_kind::abort) {
      lose(static_cast<int>(h.rank), h.st,
           "rank 0 ended fence " + std::to_string(h.epoch) + ": " + culprit_text(h));
      return;
    }
    std::vector<bootstrap_record> records;
    const size_t limit = static_cast<size_t>(job_.size) * 2 * bootstrap_max_rank_bytes;
    if (h.kind != fence_kind::release || h.epoch != epoch_ || !contributed_ || released_ ||
        length > limit || !decode_records(data, length, records)) {
      violation(peers_[0], "an unexpected or malformed release");
      return;
    }
    released_ = true;
    publish(std::move(records));
  }

  /// What an abort says happened.
  static std::string culprit_text(const fence_header& h) {
    const std::string who = "rank " + std::to_string(h.rank);
    if (h.st == status::endpoint_timeout) return who + " (at least) did not enter it in time";
    if (h.st == status::protocol_error) return who + " broke the protocol";
    return who + " failed (" + std::string(to_string(h.st)) + ")";
  }

  /// Makes a fence's records readable; a record that breaks the limits fails the job.
  void publish(std::vector<bootstrap_record> records) {
    std::string why;
    for (bootstrap_record& r : records) {
      const int who = static_cast<int>(r.rank);
      if (store_.publish(std::move(r), &why) != status::ok) {
        lose(who, status::protocol_error, why);
        return;
      }
    }
  }

  // -- fences ------------------------------------------------------------------------------------

  /// One fence: ok, or the job's failure (which every later fence returns too).
  status run_fence(clock_type::time_point deadline) {
    send_failed_ = false;
    const status st = failure_ != status::ok ? failure_
                      : is_root()            ? gather(deadline)
                                             : contribute(deadline);
    if (st == status::ok) return st;
    if (failure_ == status::ok) lose(first_missing(), st, timeout_text());
    if (is_root()) {
      send_aborts();
      progress_until([this] { return sends_in_flight_ == 0; },
                     clock_type::now() + drain_time);
    }
    return fail(failure_, failure_text_);
  }

  /// Rank 0: waits for every contribution, then releases the fence.
  status gather(clock_type::time_point deadline) {
    for (bootstrap_record& r : store_.take_committed()) gathered_.push_back(std::move(r));
    peers_[0].arrived = true;
    ++arrived_;
    const bool all = progress_until(
        [this] { return arrived_ == job_.size || failure_ != status::ok; }, deadline);
    if (failure_ != status::ok) return failure_;
    if (!all) return status::endpoint_timeout;
    std::vector<bootstrap_record> records = std::move(gathered_);
    auto encoded = std::make_shared<kj::Array<capnp::word>>(encode_records(records));
    const fence_header release{fence_kind::release, status::ok, 0, epoch_};
    next_epoch();
    publish(std::move(records));
    if (failure_ != status::ok) return failure_;
    for (size_t r = 1; r < peers_.size(); ++r) send(peers_[r], release, encoded);
    // Ranks that got their release may leave at once: only a send that fails fails this fence.
    if (!progress_until([this] { return sends_in_flight_ == 0 || send_failed_; }, deadline)) {
      lose(0, status::endpoint_timeout,
           "fence " + std::to_string(release.epoch) + ": rank 0's release did not reach every "
           "rank in time");
    }
    return send_failed_ || sends_in_flight_ != 0 ? failure_ : status::ok;
  }

  /// Every rank but 0: sends its records and waits for rank 0's release.
  status contribute(clock_type::time_point deadline) {
    auto encoded =
        std::make_shared<kj::Array<capnp::word>>(encode_records(store_.take_committed()));
    contributed_ = true;
    send(peers_[0], {fence_kind::contribute, status::ok, static_cast<uint32_t>(job_.rank), epoch_},
         encoded);
    const auto finished = [this] { return released_ && sends_in_flight_ == 0; };
    progress_until([&] { return finished() || failure_ != status::ok; }, deadline + verdict_grace);
    if (finished()) {
      next_epoch();
      return status::ok;
    }
    return failure_ != status::ok ? failure_ : status::endpoint_timeout;
  }

  void next_epoch() {
    ++epoch_;
    arrived_ = 0;
    contributed_ = false;
    released_ = false;
    for (peer& p : peers_) p.arrived = false;
  }

  /// The first rank the current fence waits for.
  int first_missing() const {
    for (const peer& p : peers_) {
      if (p.rank != 0 && !p.arrived) return p.rank;
    }
    return 0;
  }

  /// Why the current fence timed out.
  std::string timeout_text() const {
    const std::string fence = "fence " + std::to_string(epoch_);
    if (!is_root()) {
      return fence + ": rank 0 at " + job_.address + " did not release it in time";
    }
    std::vector<int> absent, late;
    for (const peer& p : peers_) {
      if (!p.ep && p.rank != 0) absent.push_back(p.rank);
      if (p.ep && !p.arrived) late.push_back(p.rank);
    }
    std::string text = fence + " timed out at rank 0:";
    if (!absent.empty()) text += " " + rank_list(absent) + " never connected to " + job_.address;
    if (!absent.empty() && !late.empty()) text += ";";
    if (!late.empty()) text += " " + rank_list(late) + " did not enter it";
    return text;
  }

  /// Records the job's first failure. Rank 0 tells the others at its next progress.
  void lose(int culprit, status reason, std::string text) {
    if (failure_ != status::ok) return;
    failure_ = reason;
    failure_text_ = std::move(text);
    culprit_ = culprit;
    COMM_LOG(info, "bootstrap", "rank %d: %s", job_.rank, failure_text_.c_str());
  }

  /// Rank 0: sends the abort to every rank still connected that has not had it.
  void send_aborts() {
    for (peer& p : peers_) {
      if (p.rank == 0 || !p.ep || p.gone || p.told) continue;
      p.told = true;
      send(p, {fence_kind::abort, failure_, static_cast<uint32_t>(culprit_), epoch_}, nullptr);
    }
  }

  // -- sending and progress ----------------------------------------------------------------------

  /// Sends one fence message; `data` (may be null) stays alive until every send of it completed.
  void send(peer& to, const fence_header& h, const std::shared_ptr<kj::Array<capnp::word>>& data) {
    wire::header_writer<BootstrapFence> header;
    auto& f = header.fields();
    f.setKind(static_cast<uint8_t>(h.kind));
    f.setStatus(static_cast<int16_t>(h.st));
    f.setRank(h.rank);
    f.setEpoch(h.epoch);
    const void* bytes = data ? data->begin() : nullptr;
    const size_t length = data ? data->size() * sizeof(capnp::word) : 0;
    ++sends_in_flight_;
    if (data) in_flight_data_.push_back(data);
    to.ep->am_send(fence_am_id, const_bytes(header.bytes(), header.size()),
                   const_bytes(bytes, length), [this, &to](status st) { on_sent(to, st); },
                   am_send_flags::reply_endpoint)
        .detach();  // on_sent runs once it completed, at once or later
  }

  void on_sent(peer& to, status st) {
    --sends_in_flight_;
    if (sends_in_flight_ == 0) in_flight_data_.clear();
    sent(to, st);
  }

  void sent(peer& to, status st) {
    if (st == status::ok) return;
    send_failed_ = true;
    lose(to.rank, status::connection_reset,
         "a fence message to rank " + std::to_string(to.rank) + " failed: " + to_string(st));
  }

  /// Progresses until `done` holds (true) or `deadline` passes (false). Rank 0 sends the aborts a
  /// failure calls for as soon as it knows of it.
  bool progress_until(const std::function<bool()>& done, clock_type::time_point deadline) {
    for (;;) {
      for (int i = 0; i < max_progress_calls && worker_->progress() != 0; ++i) {
      }
      reject_refused();
      if (is_root() && failure_ != status::ok) send_aborts();
      if (done()) return true;
      const int left = remaining_ms(deadline);
      if (left == 0) return false;
      worker_->wait(std::min(left, max_sleep_ms));
    }
  }

  /// Rejects the requests admit refused. Not inside the request's callback: the connection
  /// manager may still be reading the request's connection when it hands it over, and a reject
  /// there frees it under its feet (AddressSanitizer caught a use after free).
  void reject_refused() {
    for (conn_request* r : refused_) {
      if (listener_) listener_->reject(r);
    }
    refused_.clear();
  }

  /// Closes one endpoint without waiting (the worker finishes the close).
  void discard(peer& p) { p.ep.reset(); }

  /// Closes every endpoint, giving the notices a moment to leave.
  void close_endpoints() {
    std::vector<operation> closing;
    for (peer& p : peers_) {
      if (!p.ep) continue;
      p.gone = true;  // its error callback is not a failure any more
      operation o = p.ep.close();
      if (!o.done()) closing.push_back(std::move(o));
    }
    progress_until(
        [&closing] {
          return std::all_of(closing.begin(), closing.end(),
                             [](const operation& o) { return o.done(); });
        },
        clock_type::now() + drain_time);
  }

  const address_job job_;
  std::vector<peer> peers_;
  std::unique_ptr<context> ctx_;
  std::unique_ptr<worker> worker_;
  std::unique_ptr<listener> listener_;

  uint32_t epoch_ = 0;                          ///< the fence in progress or next
  int arrived_ = 0;                             ///< rank 0: contributions to it (its own too)
  std::vector<bootstrap_record> gathered_;      ///< rank 0: their records
  bool contributed_ = false;                    ///< other ranks: sent their contribution
  bool released_ = false;                       ///< other ranks: rank 0 released it
  status connect_result_ = status::in_progress; ///< other ranks: outcome of connecting
  int sends_in_flight_ = 0;
  bool send_failed_ = false;
  std::vector<std::shared_ptr<kj::Array<capnp::word>>> in_flight_data_;
  std::vector<conn_request*> refused_;          ///< rank 0: requests to reject after progress
  status failure_ = status::ok;  ///< the job's first failure: every fence fails with it since
  std::string failure_text_;
  int culprit_ = 0;              ///< the rank that failed it (the first one, if several)
};

}  // namespace

status make_address_bootstrap(const address_job& job, std::unique_ptr<bootstrap>* out,
                              std::string* why) {
  auto made = std::make_unique<address_bootstrap>(job);
  const status st = made->start(why);
  if (st == status::ok) *out = std::move(made);
  return st;
}

}  // namespace comm::detail
