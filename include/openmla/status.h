// OpenMLA: status codes returned by every public entry point.
//
// No public function calls exit(), throws across the API, synchronises the device or allocates device
// memory behind the caller's back. A failure is a Status whose message names the offending argument.
#pragma once

#include <string>
#include <utility>

namespace openmla {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // bad shape, dtype, stride, device or value; the message names the argument
  kUnsupported = 2,      // well-formed but not supported by this build / device
  kCudaError = 3,        // a CUDA runtime call failed; the message carries cudaGetErrorString
  kInternal = 4,         // a bug in OpenMLA
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status unsupported(std::string msg) { return {StatusCode::kUnsupported, std::move(msg)}; }
  static Status cuda_error(std::string msg) { return {StatusCode::kCudaError, std::move(msg)}; }
  static Status internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* status_code_name(StatusCode code);

}  // namespace openmla

// Propagate a non-OK Status to the caller.
#define OPENMLA_RETURN_IF_ERROR(expr)              \
  do {                                             \
    ::openmla::Status openmla_status_ = (expr);    \
    if (!openmla_status_.is_ok()) return openmla_status_; \
  } while (0)
