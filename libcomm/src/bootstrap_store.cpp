// The key-value store of the single and address backends, and the bootstrap operations they
// share (bootstrap_impl.hpp).
#include "bootstrap_impl.hpp"

#include <cstring>

namespace comm::detail {

status check_record(std::string_view key, size_t value_length, std::string* why) {
  if (key.empty() || key.find('\0') != std::string_view::npos) {
    *why = "a bootstrap key must be non-empty text without a NUL";
    return status::invalid_param;
  }
  if (key.size() > bootstrap_max_key) {
    *why = "bootstrap key of " + std::to_string(key.size()) + " bytes: the limit is " +
           std::to_string(bootstrap_max_key);
    return status::exceeds_limit;
  }
  if (value_length > bootstrap_max_value) {
    *why = "bootstrap value of " + std::to_string(value_length) + " bytes under \"" +
           std::string(key) + "\": the limit is " + std::to_string(bootstrap_max_value);
    return status::exceeds_limit;
  }
  return status::ok;
}

record_store::record_store(int rank, int size)
    : rank_(rank), visible_(static_cast<size_t>(size)), visible_bytes_(static_cast<size_t>(size)) {}

status put_budget::charge(std::string_view key, size_t length, std::string* why) {
  if (const status st = check_record(key, length, why); st != status::ok) return st;
  auto known = sizes_.find(key);
  const size_t before = known != sizes_.end() ? known->second : 0;
  const size_t after = key.size() + length;
  if (bytes_ - before + after > bootstrap_max_rank_bytes) {
    *why = "a rank may store at most " + std::to_string(bootstrap_max_rank_bytes) +
           " bytes through the bootstrap";
    return status::exceeds_limit;
  }
  bytes_ = bytes_ - before + after;
  sizes_[std::string(key)] = after;
  return status::ok;
}

status record_store::put(std::string_view key, const void* value, size_t length,
                         std::string* why) {
  if (value == nullptr && length != 0) {
    *why = "a null value with a length";
    return status::invalid_param;
  }
  if (const status st = budget_.charge(key, length, why); st != status::ok) return st;
  const auto* bytes = static_cast<const uint8_t*>(value);
  staged_[std::string(key)] = std::vector<uint8_t>(bytes, bytes + length);
  return status::ok;
}

void record_store::commit() {
  for (auto& [key, value] : staged_) committed_[key] = std::move(value);
  staged_.clear();
}

std::vector<bootstrap_record> record_store::take_committed() {
  std::vector<bootstrap_record> out;
  out.reserve(committed_.size());
  for (auto& [key, value] : committed_) {
    out.push_back({static_cast<uint32_t>(rank_), key, std::move(value)});
  }
  committed_.clear();
  return out;
}

status record_store::publish(bootstrap_record record, std::string* why) {
  if (record.rank >= visible_.size()) {
    *why = "a record of rank " + std::to_string(record.rank) + ", which is not in the job";
    return status::protocol_error;
  }
  if (check_record(record.key, record.value.size(), why) != status::ok) {
    return status::protocol_error;
  }
  records& mine = visible_[record.rank];
  size_t& bytes = visible_bytes_[record.rank];
  auto known = mine.find(record.key);
  const size_t before = known != mine.end() ? known->first.size() + known->second.size() : 0;
  const size_t after = record.key.size() + record.value.size();
  if (bytes - before + after > bootstrap_max_rank_bytes) {
    *why = "rank " + std::to_string(record.rank) + " stored more than " +
           std::to_string(bootstrap_max_rank_bytes) + " bytes";
    return status::protocol_error;
  }
  bytes = bytes - before + after;
  mine[std::move(record.key)] = std::move(record.value);
  return status::ok;
}

status record_store::get(int rank, std::string_view key, std::vector<uint8_t>& out) const {
  if (rank < 0 || static_cast<size_t>(rank) >= visible_.size()) return status::invalid_param;
  const records& theirs = visible_[static_cast<size_t>(rank)];
  auto found = theirs.find(key);
  if (found == theirs.end()) return status::no_elem;
  out = found->second;
  return status::ok;
}

status stored_bootstrap::put(std::string_view key, const void* value, size_t length) {
  std::string why;
  const status st = store_.put(key, value, length, &why);
  return st == status::ok ? st : fail(st, why);
}

status stored_bootstrap::commit() {
  store_.commit();
  return status::ok;
}

status stored_bootstrap::get(int rank, std::string_view key, std::vector<uint8_t>& out) {
  return store_.get(rank, key, out);
}

}  // namespace comm::detail
