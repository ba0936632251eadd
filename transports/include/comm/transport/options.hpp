// Transport options: every transport owns its COMM_<TL>_* variables (its knobs), with their
// defaults, limits and help text. The same knobs are set in code (comm::config::transport_options,
// tl::iface_params::opts) under the same names. A transport refuses a malformed, out-of-range or
// unknown value of its own with a message that names the variable, the value and what it accepts.
#pragma once

#include <comm/status.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace comm::tl {

/// Transport options: variable name ("COMM_SHM_FIFO_SIZE") to its value as text.
using options = std::map<std::string, std::string, std::less<>>;

/// One variable a transport reads, for its parser and for comm_info's help.
struct knob {
  const char* name;           ///< the full variable name, COMM_<TL>_<WHAT>
  const char* help;           ///< what it means and what it accepts
  const char* default_value;  ///< the default, as the user would write it ("" for none)
};

/// Parses a size: digits (no blank, no sign) with an optional k/m/g suffix, then an optional b
/// ("8192", "16k", "1MB"). False for anything else, or a value beyond 64 bits. libcomm's own
/// knobs (comm::config) are read with it too.
bool parse_size(const std::string& text, uint64_t* out);

/// The variable prefix of transport `name`: "COMM_" + upper-case name + "_".
std::string option_prefix(std::string_view transport_name);

/// Every COMM_* variable of the process environment as it is now (a reader looks only at its own
/// transport's prefix). libcomm reads it once, into comm::config; whoever opens an interface
/// directly passes it (or options of its own) in iface_params::opts.
options environment_options();

/// Reads one transport's knobs out of `options`, collecting the first refusal. Construction
/// refuses any COMM_<TL>_* option that is not one of `knobs` (a misspelt variable).
class option_reader {
public:
  /// A reader of `opts` for the transport `transport_name` whose variables are `knobs`.
  option_reader(std::string_view transport_name, std::span<const knob> knobs, const options& opts);

  /// A size (digits with an optional k/m/g suffix and b) in [min, max] and a multiple of
  /// `multiple`; `fallback` when unset.
  size_t size(const knob& k, size_t fallback, size_t min, size_t max, size_t multiple = 1);

  /// A whole number (digits only) that is a power of two in [min, max]; `fallback` when unset.
  uint64_t power_of_two(const knob& k, uint64_t fallback, uint64_t min, uint64_t max);

  /// A whole number (digits only) in [min, max]; `fallback` when unset.
  uint64_t number(const knob& k, uint64_t fallback, uint64_t min, uint64_t max);

  /// A comma-separated list, empty items dropped; empty when unset.
  std::vector<std::string> list(const knob& k);

  /// ok, or invalid_param with the first refusal in `*why` (when not null).
  status result(std::string* why) const;

private:
  /// The text set for `k`, or null.
  const std::string* find(const knob& k) const;
  /// Records the first refusal: "<name>=<value> refused: <reason>".
  void refuse(const knob& k, const std::string& value, const std::string& reason);

  const options& opts_;
  std::string error_;
};

/// One "name=value  help (default ...)" line per knob, the value as `opts` sets it or "(default)".
std::string describe_knobs(std::span<const knob> knobs, const options& opts);

}  // namespace comm::tl
