#include "megazero/core/tensor.h"

#include <cstring>
#include <sstream>

#include "megazero/core/error.h"

namespace megazero {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  std::int64_t s = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    s *= shape[i];
  }
  return st;
}

Tensor Tensor::empty(const std::shared_ptr<Device>& device, const Shape& shape, DType dtype, MemoryCategory category,
                     std::string label) {
  for (auto d : shape) MZ_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  const auto bytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  return view_of(device->allocate(bytes, category, std::move(label)), shape, dtype, 0);
}

Tensor Tensor::zeros(const std::shared_ptr<Device>& device, const Shape& shape, DType dtype, MemoryCategory category,
                     std::string label) {
  Tensor t = empty(device, shape, dtype, category, std::move(label));
  t.zero_();
  return t;
}

Tensor Tensor::view_of(std::shared_ptr<Buffer> buffer, const Shape& shape, DType dtype, std::int64_t offset) {
  MZ_CHECK(buffer, "view_of a null buffer");
  const auto end_bytes = static_cast<std::size_t>(offset + shape_numel(shape)) * dtype_size(dtype);
  MZ_CHECK(offset >= 0 && end_bytes <= buffer->bytes(), "view ", shape_str(shape), " at offset ", offset,
           " overruns buffer '", buffer->label(), "' of ", buffer->bytes(), " bytes");
  Tensor t;
  t.buffer_ = std::move(buffer);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.offset_ = offset;
  t.dtype_ = dtype;
  return t;
}

std::int64_t Tensor::size(int d) const {
  if (d < 0) d += dim();
  MZ_CHECK(d >= 0 && d < dim(), "dim ", d, " out of range for ", to_string());
  return shape_[static_cast<std::size_t>(d)];
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::data() const {
  MZ_CHECK(defined(), "data() of an undefined tensor");
  auto* base = static_cast<char*>(buffer_->data());
  if (!base) return nullptr;
  return base + offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

void* Tensor::host_bytes(std::source_location where) const {
  MZ_CHECK(defined(), "host access to an undefined tensor from ", where.file_name(), ":", where.line());
  if (!device().host_accessible())
    throw InternalError(detail::concat(
        where.file_name(), ":", where.line(), " (", where.function_name(), "): host code accessed the elements of ",
        to_string(), " '", buffer_->label(), "', whose memory is on ", device().name(),
        ", which host code cannot touch; copy it through the device first (Tensor::copy_from into a host tensor, "
        "Device::copy_to_host)"));
  return data();
}

void Tensor::check_dtype(DType expected) const {
  MZ_CHECK(dtype_ == expected, "tensor is ", dtype_name(dtype_), ", accessed as ", dtype_name(expected));
}

Tensor Tensor::view(const Shape& shape) const {
  MZ_CHECK(is_contiguous(), "view() of a non-contiguous tensor ", to_string());
  Shape s = shape;
  std::int64_t known = 1;
  int infer = -1;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MZ_CHECK(infer < 0, "view() with two -1 dimensions");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<std::size_t>(infer)] = known ? numel() / known : 0;
  MZ_CHECK(shape_numel(s) == numel(), "view ", shape_str(s), " of ", to_string(), " changes the element count");
  return view_of(buffer_, s, dtype_, offset_);
}

Tensor Tensor::narrow(int d, std::int64_t start, std::int64_t length) const {
  if (d < 0) d += dim();
  MZ_CHECK(d >= 0 && d < dim(), "narrow: dim ", d, " out of range for ", to_string());
  const auto ud = static_cast<std::size_t>(d);
  MZ_CHECK(start >= 0 && length >= 0 && start + length <= shape_[ud], "narrow(", d, ", ", start, ", ", length,
           ") out of range for ", to_string());
  Tensor t = *this;
  t.shape_[ud] = length;
  t.offset_ += start * strides_[ud];
  return t;
}

Tensor Tensor::select(int d, std::int64_t index) const {
  if (d < 0) d += dim();
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  if (d0 < 0) d0 += dim();
  if (d1 < 0) d1 += dim();
  MZ_CHECK(d0 >= 0 && d0 < dim() && d1 >= 0 && d1 < dim(), "transpose dims out of range for ", to_string());
  Tensor t = *this;
  std::swap(t.shape_[static_cast<std::size_t>(d0)], t.shape_[static_cast<std::size_t>(d1)]);
  std::swap(t.strides_[static_cast<std::size_t>(d0)], t.strides_[static_cast<std::size_t>(d1)]);
  return t;
}

void Tensor::zero_() {
  MZ_CHECK(is_contiguous(), "zero_() of a non-contiguous tensor ", to_string());
  if (device().has_storage()) device().fill_zero(data(), nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  MZ_CHECK(shape_ == src.shape_, "copy_from: shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (!device().has_storage()) return;
  MZ_CHECK(src.device().has_storage(), "copy_from: source on the meta device holds no data");
  const bool same_dtype = dtype_ == src.dtype_;
  MZ_CHECK(same_dtype || (is_floating(dtype_) && is_floating(src.dtype_)), "copy_from: ", dtype_name(src.dtype_),
           " to ", dtype_name(dtype_), " is not supported");
  Device& dst_dev = device();
  Device& src_dev = src.device();
  // Within one memory (one device, or host memory on both sides): the
  // device's strided copy, queued like a kernel on a GPU.
  if (&dst_dev == &src_dev || (dst_dev.host_accessible() && src_dev.host_accessible())) {
    dst_dev.copy_strided(data(), dtype_, strides_.data(), src.data(), src.dtype_, src.strides_.data(), shape_.data(),
                         static_cast<int>(shape_.size()));
    return;
  }
  // Between host and a device (or two devices): contiguous bytes, staged
  // through the host when a cast is needed or neither side is host memory.
  // A view on either side is packed on its own device first (one strided copy
  // there, queued like a kernel), so a GPU tensor's view reads back as a host
  // one does (a test's strided Q/K/V, to_double_vector of a narrow).
  if (!src.is_contiguous() || !is_contiguous()) {
    const auto& where = !src.is_contiguous() ? src.device_ptr() : device_ptr();
    Tensor packed = empty(where, shape_, src.dtype_, MemoryCategory::Workspace, "view packed for a copy");
    packed.copy_from(src);
    copy_from(packed);  // a destination view is packed on its side in turn
    return;
  }
  if (same_dtype && src_dev.host_accessible()) {
    dst_dev.copy_from_host(data(), src.data(), nbytes());
    return;
  }
  if (same_dtype && dst_dev.host_accessible()) {
    src_dev.copy_to_host(data(), src.data(), nbytes());
    return;
  }
  std::vector<char> host_src(src.nbytes()), host_dst(nbytes());
  src_dev.copy_to_host(host_src.data(), src.data(), src.nbytes());
  if (same_dtype)
    host_dst.swap(host_src);
  else
    convert(host_src.data(), src.dtype_, host_dst.data(), dtype_, static_cast<std::size_t>(numel()));
  dst_dev.copy_from_host(data(), host_dst.data(), nbytes());
}

Tensor Tensor::clone(MemoryCategory category) const { return to(dtype_, category); }

Tensor Tensor::to(DType dtype, MemoryCategory category) const {
  Tensor t = empty(device_ptr(), shape_, dtype, category, buffer_->label());
  t.copy_from(*this);
  return t;
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = *this;
  if (!device().host_accessible() || !is_contiguous()) {
    host = empty(make_device(DeviceKind::CPU), shape_, dtype_, MemoryCategory::Workspace);
    host.copy_from(*this);
  }
  const void* base = host.host_bytes();
  std::vector<double> out(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_double(base, dtype_, i);
  return out;
}

void Tensor::copy_from_doubles(const std::vector<double>& values) {
  MZ_CHECK(static_cast<std::int64_t>(values.size()) == numel(), "copy_from_doubles: ", values.size(), " values for ",
           to_string());
  Tensor c = empty(make_device(DeviceKind::CPU), shape_, dtype_, MemoryCategory::Workspace);
  void* base = c.host_bytes();
  for (std::size_t i = 0; i < values.size(); ++i) store_from_double(base, dtype_, i, values[i]);
  copy_from(c);
}

std::string Tensor::to_string() const {
  std::ostringstream os;
  os << "Tensor[" << dtype_name(dtype_) << " " << (defined() ? device().name() : "undefined") << " "
     << shape_str(shape_) << "]";
  return os.str();
}

}  // namespace megazero
