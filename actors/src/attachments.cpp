// Blobs, and the node's serialiser and deserialiser that carry large runs as attachments (see
// attachments.hpp).
#include "attachments.hpp"
#include "lending.hpp"

#include <comm/memory.hpp>

#include <caf/sec.hpp>

#include <cstring>
#include <new>

namespace comm::actors {

namespace {

/// The longest blob a deserialiser reads inline (attachments are bounded by the frame).
constexpr size_t max_inline_blob = size_t{1} << 30;

/// The owner of `block`, which comm::mem_free releases: a comm::mem_alloc block, or data
/// detached from a libcomm worker.
std::shared_ptr<const void> heap_owner(void* block) {
  return std::shared_ptr<const void>(block, [](const void* p) {
    comm::mem_free(const_cast<void*>(p));
  });
}

/// An owner of `size` fresh bytes: host-shareable memory for large ones.
std::shared_ptr<const void> allocate(size_t size) {
  if (size >= detail::attach_threshold) {
    void* block = comm::mem_alloc(size);
    if (block == nullptr) throw std::bad_alloc{};
    return heap_owner(block);
  }
  return std::shared_ptr<const void>(new char[size], [](const void* p) {
    delete[] static_cast<const char*>(p);
  });
}

}  // namespace

// -- blob ----------------------------------------------------------------------------------------

blob::blob(size_t size) {
  if (size == 0) return;
  owner_ = allocate(size);
  data_ = static_cast<const char*>(owner_.get());
  size_ = size;
}

blob::blob(const void* data, size_t size) : blob(size) {
  if (size != 0) std::memcpy(const_cast<char*>(data_), data, size);
}

blob blob::adopt(void* block, size_t size) {
  return share(heap_owner(block), static_cast<const char*>(block), size);
}

blob blob::share(std::shared_ptr<const void> owner, const char* data, size_t size) noexcept {
  blob x;
  if (size == 0) return x;
  x.owner_ = std::move(owner);
  x.data_ = data;
  x.size_ = size;
  return x;
}

char* blob::mutable_data() noexcept {
  // Bytes lent by another node are its own, even when this is their only copy here.
  if (owner_.use_count() != 1 || detail::is_borrowed(owner_)) return nullptr;
  return const_cast<char*>(data_);
}

namespace detail {

caf::error save_blob(caf::serializer& sink, const blob& x) {
  size_t size = x.size();
  if (auto err = sink.begin_sequence(size)) return err;
  auto* frame = dynamic_cast<frame_serializer*>(&sink);
  if (frame != nullptr && frame->attaches() && size >= attach_threshold) {
    frame->attach(x);
  } else if (size != 0) {
    if (auto err = sink.apply_raw(size, const_cast<char*>(x.data()))) return err;
  }
  return sink.end_sequence();
}

caf::error load_blob(caf::deserializer& source, blob& x) {
  size_t size = 0;
  if (auto err = source.begin_sequence(size)) return err;
  auto* frame = dynamic_cast<frame_deserializer*>(&source);
  if (frame != nullptr && frame->attachments().has(size)) {
    x = frame->attachments().take(size);
    return source.end_sequence();
  }
  // A length from the wire must fit what is left to read before anything is allocated for it.
  if (frame != nullptr && size > frame->remaining()) return frame->fail(caf::sec::end_of_stream);
  if (auto* bytes = dynamic_cast<caf::binary_deserializer*>(&source);
      bytes != nullptr && size > bytes->remaining()) {
    return caf::sec::end_of_stream;
  }
  if (size > max_inline_blob) return caf::sec::invalid_argument;
  blob read(size);
  if (size != 0) {
    if (auto err = source.apply_raw(size, read.mutable_data())) return err;
  }
  x = std::move(read);
  return source.end_sequence();
}

// -- frame_serializer ----------------------------------------------------------------------------

caf::error frame_serializer::begin_object(uint16_t& nr, std::string& name) {
  return inner_.begin_object(nr, name);
}

caf::error frame_serializer::end_object() { return inner_.end_object(); }

caf::error frame_serializer::begin_sequence(size_t& size) { return inner_.begin_sequence(size); }

caf::error frame_serializer::end_sequence() { return inner_.end_sequence(); }

caf::error frame_serializer::apply_raw(size_t num_bytes, void* data) {
  if (out_ == nullptr || num_bytes < attach_threshold) return inner_.apply_raw(num_bytes, data);
  out_->add(blob(data, num_bytes));
  return caf::error{};
}

caf::error frame_serializer::apply_impl(int8_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(uint8_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(int16_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(uint16_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(int32_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(uint32_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(int64_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(uint64_t& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(float& x) {
  auto bits = pack_real(x);
  return inner_(bits);
}

caf::error frame_serializer::apply_impl(double& x) {
  auto bits = pack_real(x);
  return inner_(bits);
}

caf::error frame_serializer::apply_impl(long double& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(std::u16string& x) { return inner_(x); }
caf::error frame_serializer::apply_impl(std::u32string& x) { return inner_(x); }

caf::error frame_serializer::apply_impl(std::string& x) {
  // As CAF's binary serialiser writes a string, through this serialiser's apply_raw.
  size_t size = x.size();
  if (auto err = begin_sequence(size)) return err;
  if (size != 0) {
    if (auto err = apply_raw(size, x.data())) return err;
  }
  return end_sequence();
}

// -- attachment_source ---------------------------------------------------------------------------

const std::shared_ptr<const void>& attachment_source::owner() {
  if (!owner_ && worker_ != nullptr) {
    if (worker_->am_data_detach(am_data_)) owner_ = heap_owner(am_data_);
    worker_ = nullptr;
  }
  return owner_;
}

attachment_source::attachment_source(std::vector<blob> runs) : runs_(std::move(runs)) {
  for (const blob& run : runs_) length_ += run.size();
}

blob attachment_source::take(size_t size) {
  used_ += size;
  if (!runs_.empty()) return runs_[next_run_++];
  const char* at = data_ + used_ - size;
  if (const auto& o = owner()) return blob::share(o, at, size);
  return blob(at, size);
}

void attachment_source::copy(size_t size, void* dest) {
  std::memcpy(dest, next(size), size);
}

void attachment_source::own() {
  if (!runs_.empty() || owner() || length_ == 0) return;
  blob copy(data_, length_);
  owner_ = copy.owner();
  data_ = copy.data();
}

// -- frame_deserializer --------------------------------------------------------------------------

caf::error frame_deserializer::check_nesting() const {
  // Stacks grow down on every Linux target but one (HPPA): compare either way.
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  const uintptr_t used = here < stack_base_ ? stack_base_ - here : here - stack_base_;
  if (used <= max_read_stack) return caf::error{};
  return caf::make_error(caf::sec::invalid_argument, "nested deeper than the reader allows");
}

caf::error frame_deserializer::fail(caf::error err) {
  if (err && !failure_) failure_ = err;
  return err;
}

caf::error frame_deserializer::begin_object(uint16_t& nr, std::string& name) {
  if (failure_) return failure_;
  // Every level of a nested message starts here, before CAF reads (and recurses into) it.
  if (auto err = check_nesting()) return fail(std::move(err));
  return fail(inner_.begin_object(nr, name));
}

caf::error frame_deserializer::end_object() { return fail(inner_.end_object()); }

caf::error frame_deserializer::begin_sequence(size_t& size) {
  if (failure_) return failure_;
  // Every level of nested containers starts here.
  if (auto err = check_nesting()) return fail(std::move(err));
  if (auto err = inner_.begin_sequence(size)) return fail(std::move(err));
  // Every element takes at least a byte of the frame: a longer sequence is forged, and CAF would
  // size a byte sequence (resize) before reading it.
  if (size > inner_.remaining() + from_.remaining()) {
    return fail(caf::make_error(caf::sec::end_of_stream, "sequence longer than its frame"));
  }
  return caf::error{};
}

caf::error frame_deserializer::end_sequence() { return fail(inner_.end_sequence()); }

caf::error frame_deserializer::apply_raw(size_t num_bytes, void* data) {
  if (failure_) return failure_;
  if (!from_.has(num_bytes)) return fail(inner_.apply_raw(num_bytes, data));
  from_.copy(num_bytes, data);
  return caf::error{};
}

caf::error frame_deserializer::apply_impl(int8_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(uint8_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(int16_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(uint16_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(int32_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(uint32_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(int64_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(uint64_t& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(float& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(double& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(long double& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(std::u16string& x) { return fail(inner_(x)); }
caf::error frame_deserializer::apply_impl(std::u32string& x) { return fail(inner_(x)); }

caf::error frame_deserializer::apply_impl(std::string& x) {
  size_t size = 0;
  if (auto err = begin_sequence(size)) return err;
  if (from_.has(size)) {
    x.resize(size);
    from_.copy(size, x.data());
  } else {
    if (size > inner_.remaining()) return fail(caf::sec::end_of_stream);
    x.resize(size);
    if (size != 0) {
      if (auto err = inner_.apply_raw(size, x.data())) return fail(std::move(err));
    }
  }
  return end_sequence();
}

}  // namespace detail

}  // namespace comm::actors
