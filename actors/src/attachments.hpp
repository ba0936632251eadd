// Attachments: the large byte runs of a message, carried beside its serialised payload instead of
// inside it.
//
// The node's serialiser and deserialiser are CAF's binary ones plus one rule: a raw run of at least
// attach_threshold bytes (a large std::vector<char>, std::string or blob) is not written into the
// payload; it becomes the frame's next attachment, and the reader takes its next attachment where
// the same run is read. Both sides see the same sequence of runs, so the payload only keeps their
// lengths. A blob is attached by reference (no copy on the sender) and read by taking over the
// received buffer (no copy on the receiver); other runs are copied once on each side, into
// host-shareable memory on the sender.
#pragma once

#include <comm/actors/blob.hpp>
#include <comm/worker.hpp>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/detail/ieee_754.hpp>
#include <caf/serializer.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace comm::actors::detail {

/// Raw runs at least this long travel as attachments.
inline constexpr size_t attach_threshold = 32 * 1024;

/// The attachments of one outgoing frame, in the order the reader will take them.
struct attachment_list {
  std::vector<blob> runs;  ///< each run, owning (or sharing) its bytes

  /// Appends `run`.
  void add(blob run) { runs.push_back(std::move(run)); }

  /// Total length of the runs.
  size_t bytes() const noexcept {
    size_t total = 0;
    for (const blob& run : runs) total += run.size();
    return total;
  }

  /// True without attachments.
  bool empty() const noexcept { return runs.empty(); }
};

/// The bits of `x` in CAF's binary format, which caf::detail::unpack754 reads: IEEE 754 except
/// that an exponent of all zeros means 1.m x 2^-bias and one of all ones means an infinity (a NaN
/// arrives as an infinity of its sign). CAF's own writer, caf::detail::pack754 (0.17.6), gives
/// the IEEE bits for normal numbers only: it never returns for an infinity, casts a NaN to an
/// integer, and turns a subnormal into a huge number of the other sign.
template <class Real>
typename caf::detail::ieee_754_trait<Real>::packed_type pack_real(Real x) noexcept {
  using packed = typename caf::detail::ieee_754_trait<Real>::packed_type;
  using limits = std::numeric_limits<Real>;
  static_assert(limits::is_iec559 && sizeof(packed) == sizeof(Real));
  packed bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (!(std::fabs(x) < limits::min())) return bits;  // normal, infinite or NaN
  // Zero or subnormal: 1.m x 2^(min_exponent - 2) has exponent bits 0; below that is zero.
  const Real scaled = std::ldexp(std::fabs(x), 2 - limits::min_exponent);
  if (scaled < 1) return 0;
  const packed sign = bits & (packed{1} << (sizeof(packed) * 8 - 1));
  return sign | static_cast<packed>(std::ldexp(scaled - 1, limits::digits - 1));
}

/// CAF's binary serialiser with two changes: raw runs of attach_threshold bytes or more go to
/// `out` when there is one, and floating-point values are written with pack_real.
class frame_serializer final : public caf::serializer {
public:
  /// Appends to `buf`; attachments go to `out`.
  frame_serializer(caf::execution_unit* ctx, std::vector<char>& buf, attachment_list& out)
      : caf::serializer(ctx), inner_(ctx, buf), out_(&out) {}

  /// Appends to `buf`, large runs included (for frames that cannot have attachments).
  frame_serializer(caf::execution_unit* ctx, std::vector<char>& buf)
      : caf::serializer(ctx), inner_(ctx, buf) {}

  /// True when large runs become attachments.
  bool attaches() const noexcept { return out_ != nullptr; }

  /// Attaches the bytes of `x` by reference (the caller wrote its length); only when attaches().
  void attach(const blob& x) { out_->add(x); }

  caf::error begin_object(uint16_t& nr, std::string& name) override;
  caf::error end_object() override;
  caf::error begin_sequence(size_t& size) override;
  caf::error end_sequence() override;
  caf::error apply_raw(size_t num_bytes, void* data) override;

protected:
  caf::error apply_impl(int8_t& x) override;
  caf::error apply_impl(uint8_t& x) override;
  caf::error apply_impl(int16_t& x) override;
  caf::error apply_impl(uint16_t& x) override;
  caf::error apply_impl(int32_t& x) override;
  caf::error apply_impl(uint32_t& x) override;
  caf::error apply_impl(int64_t& x) override;
  caf::error apply_impl(uint64_t& x) override;
  caf::error apply_impl(float& x) override;
  caf::error apply_impl(double& x) override;
  caf::error apply_impl(long double& x) override;
  caf::error apply_impl(std::string& x) override;
  caf::error apply_impl(std::u16string& x) override;
  caf::error apply_impl(std::u32string& x) override;

private:
  caf::binary_serializer inner_;
  attachment_list* out_ = nullptr;
};

/// Where a received frame's attachments are: a byte range, and who may take it over.
class attachment_source {
public:
  /// No attachments.
  attachment_source() = default;

  /// `length` bytes at `data`, owned by `owner` (may be null: then taken runs are copies).
  attachment_source(const char* data, size_t length, std::shared_ptr<const void> owner)
      : data_(data), length_(length), owner_(std::move(owner)) {}

  /// `length` bytes at `data`, inside `am_data`, persistent AM data of `worker` when `worker` is
  /// set: the first run taken by reference detaches it from the worker (comm::mem_free frees it).
  attachment_source(const char* data, size_t length, comm::worker* worker, void* am_data)
      : data_(data), length_(length), worker_(worker), am_data_(am_data) {}

  /// The runs `runs`, ready as blobs (lent ones, read in place): a run is only taken whole, by
  /// a read of exactly its length.
  explicit attachment_source(std::vector<blob> runs);

  /// Bytes not taken yet.
  size_t remaining() const noexcept { return length_ - used_; }

  /// True when the next run is `size` bytes or more long (and size is a run's length).
  bool has(size_t size) const noexcept {
    return size >= attach_threshold && size <= remaining() &&
           (runs_.empty() || runs_[next_run_].size() == size);
  }

  /// The next `size` bytes as a blob: the received buffer itself when it can be taken over.
  blob take(size_t size);

  /// Copies the next `size` bytes to `dest`.
  void copy(size_t size, void* dest);

  /// The next `size` bytes, in place (valid while this source is).
  const char* next(size_t size) noexcept {
    used_ += size;
    if (!runs_.empty()) return runs_[next_run_++].data();
    return data_ + used_ - size;
  }

  /// Makes the bytes independent of the worker's receive buffer (detached or copied), for a
  /// frame kept past the AM callback.
  void own();

private:
  /// The owner of the bytes, detaching them from the worker first when needed; null when they
  /// cannot be taken over.
  const std::shared_ptr<const void>& owner();

  const char* data_ = nullptr;
  size_t length_ = 0;
  size_t used_ = 0;
  std::shared_ptr<const void> owner_;
  comm::worker* worker_ = nullptr;
  void* am_data_ = nullptr;
  std::vector<blob> runs_;  ///< ready runs (then data_ is unused)
  size_t next_run_ = 0;     ///< the next of them to take
};

/// Stack that reading one payload may take below where its frame_deserializer was made. CAF reads
/// nested values by recursion (a message inside a message, a container inside a container), and a
/// payload of 600 KB can nest 40,000 messages or 300,000 lists deep: far more than any thread's
/// stack holds. Nesting that would go deeper than this is refused before CAF recurses further. It
/// is far below the smallest stack a frame is read on: the progress thread's and CAF's workers'
/// (the process's stack limit, 8 MiB by default) or that of a thread sending to a full connection,
/// which progresses the worker itself (musl's default of 128 KiB is the smallest in common use).
inline constexpr size_t max_read_stack = 64 * 1024;

/// CAF's binary deserialiser for bytes a peer sent, taking raw runs of attach_threshold bytes or
/// more from `from`, refusing sequences longer than the bytes left to read (payload and
/// attachments) and nesting beyond max_read_stack, and failing for good after its first error.
class frame_deserializer final : public caf::deserializer {
public:
  /// Reads the payload `data`/`length`; attachments come from `from`. Nesting is measured from
  /// the caller's stack frame.
  frame_deserializer(caf::execution_unit* ctx, const void* data, size_t length,
                     attachment_source& from)
      : caf::deserializer(ctx),
        inner_(ctx, static_cast<const char*>(data), length),
        from_(from),
        stack_base_(reinterpret_cast<uintptr_t>(__builtin_frame_address(0))) {}

  /// Payload bytes not read yet.
  size_t remaining() const noexcept { return inner_.remaining(); }

  /// The first error any read met, also when CAF dropped it: CAF 0.17 loads a message nested in
  /// a value (an element, an error's context) through a function that ignores the message's
  /// error, and reads on after it. Every read after a failure fails again.
  const caf::error& failure() const noexcept { return failure_; }

  /// Makes `err` the failure when it is the first one; returns it.
  caf::error fail(caf::error err);

  /// The attachments.
  attachment_source& attachments() noexcept { return from_; }

  caf::error begin_object(uint16_t& nr, std::string& name) override;
  caf::error end_object() override;
  caf::error begin_sequence(size_t& size) override;
  caf::error end_sequence() override;
  caf::error apply_raw(size_t num_bytes, void* data) override;

protected:
  caf::error apply_impl(int8_t& x) override;
  caf::error apply_impl(uint8_t& x) override;
  caf::error apply_impl(int16_t& x) override;
  caf::error apply_impl(uint16_t& x) override;
  caf::error apply_impl(int32_t& x) override;
  caf::error apply_impl(uint32_t& x) override;
  caf::error apply_impl(int64_t& x) override;
  caf::error apply_impl(uint64_t& x) override;
  caf::error apply_impl(float& x) override;
  caf::error apply_impl(double& x) override;
  caf::error apply_impl(long double& x) override;
  caf::error apply_impl(std::string& x) override;
  caf::error apply_impl(std::u16string& x) override;
  caf::error apply_impl(std::u32string& x) override;

private:
  /// An error when reading has taken more than max_read_stack of stack.
  caf::error check_nesting() const;

  caf::binary_deserializer inner_;
  attachment_source& from_;
  uintptr_t stack_base_;  ///< the stack frame reading started in
  caf::error failure_;    ///< the first error
};

}  // namespace comm::actors::detail
