// Shared helpers of the nanobind binding: DLPack arrays -> openmla::TensorRef, Status -> exception.
// The binding holds no logic of its own: validation lives in the C++ API.
#pragma once

#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>

#include "openmla/status.h"
#include "openmla/types.h"

namespace nb = nanobind;

namespace openmla::py {

// Any DLPack-exporting array (torch, numpy, cupy, jax...), any dtype, device and strides.
using Array = nb::ndarray<>;
using OptArray = std::optional<Array>;

// The DType of a DLPack dtype; false when OpenMLA has none for it.
bool to_dtype(const nb::dlpack::dtype& dt, DType* out);
// Converts a DLPack array into a TensorRef. `name` is used in the error if the dtype is unknown.
TensorRef to_tensor_ref(const Array& a, const char* name);
// An absent optional argument becomes an undefined TensorRef.
TensorRef to_tensor_ref(const OptArray& a, const char* name);

// Raises the Python exception that matches the status: ValueError (invalid argument),
// NotImplementedError (unsupported), RuntimeError (CUDA or internal error). Same message.
void throw_if_error(const Status& status);

inline cudaStream_t to_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

}  // namespace openmla::py
