// The bootstrap's internals: the limits, the key-value store the single and address backends keep
// (the pmix backend leaves it to the PMIx server), and one factory per backend
// (bootstrap_<backend>.cpp).
#pragma once

#include <comm/bootstrap.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace comm::detail {

/// Longest key.
inline constexpr size_t bootstrap_max_key = 255;
/// Largest value.
inline constexpr size_t bootstrap_max_value = size_t{1} << 20;
/// Most bytes (keys and values) one rank may store.
inline constexpr size_t bootstrap_max_rank_bytes = size_t{16} << 20;
/// Most ranks in a job.
inline constexpr int bootstrap_max_size = 1 << 16;

/// ok for a key and value within the limits, else invalid_param (an empty key or one with a
/// NUL) or exceeds_limit (too long), with `*why` saying which.
status check_record(std::string_view key, size_t value_length, std::string* why);

/// What this process has put so far, against bootstrap_max_rank_bytes (a key put again counts
/// once, with its latest value).
class put_budget {
public:
  /// Checks the record and charges it: ok, or the error with `*why`.
  status charge(std::string_view key, size_t length, std::string* why);

private:
  std::map<std::string, size_t, std::less<>> sizes_;
  size_t bytes_ = 0;
};

/// One value a rank put.
struct bootstrap_record {
  uint32_t rank = 0;            ///< who put it
  std::string key;              ///< under which key
  std::vector<uint8_t> value;   ///< the bytes
};

/// The key-value store of one process: its own puts (staged until commit, then committed until
/// the next fence sends them) and every rank's records made visible by fences, each rank's within
/// bootstrap_max_rank_bytes.
class record_store {
public:
  /// A store for a job of `size` ranks in which this process is `rank`.
  record_store(int rank, int size);

  /// Stages `value` under `key`; exceeds_limit when this rank's records would pass the limit.
  status put(std::string_view key, const void* value, size_t length, std::string* why);

  /// Moves the staged records to the committed ones.
  void commit();

  /// Takes the committed records (for the next fence).
  std::vector<bootstrap_record> take_committed();

  /// Makes `record` visible; protocol_error when it breaks the limits (a peer's bad data).
  status publish(bootstrap_record record, std::string* why);

  /// Copies what `rank` stored under `key` into `out`: ok, no_elem, or invalid_param.
  status get(int rank, std::string_view key, std::vector<uint8_t>& out) const;

private:
  using records = std::map<std::string, std::vector<uint8_t>, std::less<>>;

  int rank_;
  put_budget budget_;
  records staged_;
  records committed_;
  std::vector<records> visible_;       ///< per rank
  std::vector<size_t> visible_bytes_;  ///< per rank
};

/// A bootstrap whose records this process keeps in a record_store (the single and address
/// backends): put, commit and get go to the store; each backend's fence moves the records.
class stored_bootstrap : public bootstrap {
public:
  status put(std::string_view key, const void* value, size_t length) override;
  status commit() override;
  status get(int rank, std::string_view key, std::vector<uint8_t>& out) override;

protected:
  /// A store for a job of `size` ranks in which this process is `rank`.
  stored_bootstrap(int rank, int size) : store_(rank, size) {}

  record_store store_;  ///< this process's records and those fences made visible
};

/// The single backend: rank 0 of 1.
std::unique_ptr<bootstrap> make_single_bootstrap();

/// What the address backend needs to know.
struct address_job {
  std::string address;  ///< rank 0's "host:port"
  int rank = 0;
  int size = 1;
  int timeout_ms = 30000;
  std::string auth_key;
};

/// The address backend: listens (rank 0) or connects to rank 0, then waits for every rank.
status make_address_bootstrap(const address_job& job, std::unique_ptr<bootstrap>* out,
                              std::string* why);

/// The pmix backend: joins the launcher's PMIx server.
status make_pmix_bootstrap(int timeout_ms, std::unique_ptr<bootstrap>* out, std::string* why);

}  // namespace comm::detail
