#include <comm/transport/options.hpp>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <sstream>

extern char** environ;

namespace comm::tl {
namespace {

/// Parses digits only (no blank, no sign: strtoull would take "-1" as 2^64 - 1), in range.
bool parse_digits(const std::string& text, const char** end, uint64_t* out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  char* stop = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), &stop, 10);
  if (errno == ERANGE) return false;
  *end = stop;
  *out = value;
  return true;
}

std::string range_text(uint64_t min, uint64_t max) {
  return std::to_string(min) + ".." + std::to_string(max);
}

}  // namespace

bool parse_size(const std::string& text, uint64_t* out) {
  const char* end = nullptr;
  uint64_t value = 0;
  if (!parse_digits(text, &end, &value)) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    default: break;
  }
  if (value > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
  if (*end == 'b' || *end == 'B') ++end;
  if (*end != '\0') return false;
  *out = value << shift;
  return true;
}

std::string option_prefix(std::string_view transport_name) {
  std::string prefix = "COMM_";
  for (char c : transport_name) prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return prefix + "_";
}

options environment_options() {
  options all;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t equals = text.find('=');
    if (!text.starts_with("COMM_") || equals == std::string_view::npos) continue;
    all.emplace(std::string(text.substr(0, equals)), std::string(text.substr(equals + 1)));
  }
  return all;
}

option_reader::option_reader(std::string_view transport_name, std::span<const knob> knobs,
                             const options& opts)
    : opts_(opts) {
  const std::string prefix = option_prefix(transport_name);
  for (auto it = opts.lower_bound(prefix); it != opts.end() && it->first.starts_with(prefix); ++it) {
    const bool known = std::any_of(knobs.begin(), knobs.end(),
                                   [&](const knob& k) { return it->first == k.name; });
    if (known || !error_.empty()) continue;
    error_ = it->first + "=" + it->second + " refused: " + std::string(transport_name) +
             " has no such variable (known:";
    for (const knob& k : knobs) error_ += std::string(" ") + k.name;
    error_ += ")";
  }
}

const std::string* option_reader::find(const knob& k) const {
  auto it = opts_.find(std::string_view(k.name));
  return it == opts_.end() ? nullptr : &it->second;
}

void option_reader::refuse(const knob& k, const std::string& value, const std::string& reason) {
  if (!error_.empty()) return;
  error_ = std::string(k.name) + "=" + value + " refused: " + reason + " (" + k.help + ")";
}

size_t option_reader::size(const knob& k, size_t fallback, size_t min, size_t max,
                           size_t multiple) {
  const std::string* text = find(k);
  if (text == nullptr) return fallback;
  uint64_t value = 0;
  if (!parse_size(*text, &value)) {
    refuse(k, *text, "not a size (e.g. 8192, 16k, 1m)");
    return fallback;
  }
  if (value < min || value > max) {
    refuse(k, *text, "expected " + range_text(min, max) + " bytes");
    return fallback;
  }
  if (value % multiple != 0) {
    refuse(k, *text, "expected a multiple of " + std::to_string(multiple));
    return fallback;
  }
  return static_cast<size_t>(value);
}

uint64_t option_reader::power_of_two(const knob& k, uint64_t fallback, uint64_t min,
                                      uint64_t max) {
  const std::string* text = find(k);
  if (text == nullptr) return fallback;
  const char* end = nullptr;
  uint64_t value = 0;
  if (!parse_digits(*text, &end, &value) || *end != '\0' || value < min || value > max ||
      !std::has_single_bit(value)) {
    refuse(k, *text, "expected a power of two in " + range_text(min, max));
    return fallback;
  }
  return value;
}

uint64_t option_reader::number(const knob& k, uint64_t fallback, uint64_t min, uint64_t max) {
  const std::string* text = find(k);
  if (text == nullptr) return fallback;
  const char* end = nullptr;
  uint64_t value = 0;
  if (!parse_digits(*text, &end, &value) || *end != '\0' || value < min || value > max) {
    refuse(k, *text, "expected a whole number in " + range_text(min, max));
    return fallback;
  }
  return value;
}

std::vector<std::string> option_reader::list(const knob& k) {
  std::vector<std::string> items;
  const std::string* text = find(k);
  if (text == nullptr) return items;
  std::stringstream in(*text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

status option_reader::result(std::string* why) const {
  if (error_.empty()) return status::ok;
  if (why != nullptr) *why = error_;
  return status::invalid_param;
}

std::string describe_knobs(std::span<const knob> knobs, const options& opts) {
  std::string text;
  for (const knob& k : knobs) {
    auto it = opts.find(std::string_view(k.name));
    text += std::string(k.name) + "=" + (it != opts.end() ? it->second : "(default)");
    text += "  " + std::string(k.help);
    if (*k.default_value != '\0') text += std::string("; default ") + k.default_value;
    text += "\n";
  }
  return text;
}

}  // namespace comm::tl
