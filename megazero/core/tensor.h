// Tensor: a strided view (shape, strides, dtype, element offset) over a Buffer
// the framework owns. Copying a Tensor copies the view, never the data; views of
// one flat buffer (ZeRO partitions, parameter shards) share its storage and its
// single memory-tracker entry.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "megazero/core/device.h"
#include "megazero/core/dtype.h"

namespace megazero {

using Shape = std::vector<std::int64_t>;
std::string shape_str(const Shape& s);
std::int64_t shape_numel(const Shape& s);

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::F16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct DTypeOf<std::int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct DTypeOf<std::int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct DTypeOf<std::uint8_t> {
  static constexpr DType value = DType::U8;
};

class Tensor {
 public:
  Tensor() = default;

  // New contiguous tensor with its own buffer (uninitialised / zero-filled).
  static Tensor empty(const std::shared_ptr<Device>& device, const Shape& shape, DType dtype, MemoryCategory category,
                      std::string label = {});
  static Tensor zeros(const std::shared_ptr<Device>& device, const Shape& shape, DType dtype, MemoryCategory category,
                      std::string label = {});
  // Contiguous view of `shape` starting `offset` elements into `buffer`.
  static Tensor view_of(std::shared_ptr<Buffer> buffer, const Shape& shape, DType dtype, std::int64_t offset = 0);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int dim() const { return static_cast<int>(shape_.size()); }
  std::int64_t size(int d) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  std::int64_t storage_offset() const { return offset_; }
  Device& device() const { return buffer_->device(); }
  const std::shared_ptr<Device>& device_ptr() const { return buffer_->device_ptr(); }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  bool is_contiguous() const;

  // The device address of the first element (nullptr on the meta device): an
  // operand for the device's copies, kernels and collectives, never for host
  // code to dereference unless device().host_accessible().
  void* data() const;
  // The first element as host code may read and write it. InternalError, naming
  // the tensor and the caller, where the memory is not host memory (a GPU's,
  // the isolated device's, the meta device's): copy such a tensor to a host
  // one first (copy_from, to_double_vector). Never a segfault.
  template <typename T>
  T* host_data(std::source_location where = std::source_location::current()) const {
    check_dtype(DTypeOf<T>::value);
    return static_cast<T*>(host_bytes(where));
  }
  void* host_bytes(std::source_location where = std::source_location::current()) const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;  // contiguous only; one -1 allowed
  Tensor narrow(int dim, std::int64_t start, std::int64_t length) const;
  Tensor select(int dim, std::int64_t index) const;  // drops `dim`
  Tensor transpose(int d0, int d1) const;
  Tensor flatten() const { return view({numel()}); }

  // ---- data movement ----
  void zero_();
  // Copies src into this (same shape; any dtypes among floats; any devices;
  // any strides). 16-bit results are rounded once, to nearest even.
  void copy_from(const Tensor& src);
  Tensor clone(MemoryCategory category) const;            // contiguous, same device and dtype
  Tensor to(DType dtype, MemoryCategory category) const;  // contiguous copy in another dtype

  // Values through double, from any device (staged through host memory).
  std::vector<double> to_double_vector() const;
  void copy_from_doubles(const std::vector<double>& values);

  std::string to_string() const;  // "Tensor[fp32 cpu (2, 3)]"

 private:
  void check_dtype(DType expected) const;

  std::shared_ptr<Buffer> buffer_;
  Shape shape_;
  Shape strides_;  // in elements
  std::int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace megazero
