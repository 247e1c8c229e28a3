// Errors as values across module boundaries (the Perfetto base::Status habit).
//
// A function that can fail on user input returns Status or StatusOr<T>. Messages name the
// file, line and key where one is known, and what was expected. Only main() turns a Status
// into an exit code: kInvalidInput -> 2 (bad plan, schedule or trace), others -> 1; under a
// launcher (mpirun) a kAborted error is not printed: the rank that failed first says why.
#ifndef SHARDSCOPE_BASE_STATUS_H_
#define SHARDSCOPE_BASE_STATUS_H_

#include <string>
#include <utility>
#include <variant>

#include "shardscope/base/check.h"

namespace shardscope {

enum class StatusCode {
  kOk = 0,
  kInvalidInput,  // the user's file or arguments are wrong
  kIoError,       // the file system refused
  kInternal,      // a bug in shardscope
  kAborted,       // stopped because another rank of the job failed (that rank says why)
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidInput(std::string message) {
    return Status(StatusCode::kInvalidInput, std::move(message));
  }
  static Status IoError(std::string message) {
    return Status(StatusCode::kIoError, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }
  static Status Aborted(std::string message) {
    return Status(StatusCode::kAborted, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message is "prefix: message" (adds context while propagating).
  Status WithContext(const std::string& prefix) const {
    if (ok()) return *this;
    return Status(code_, prefix + ": " + message_);
  }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-ok Status. An OK Status carries no value, so constructing a
// StatusOr from one is a programming error, and so is value() on an error: both fail a
// SHARDSCOPE_CHECK (check.h) that names the place and, for value(), the error's message.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    SHARDSCOPE_CHECK(!std::get<Status>(data_).ok(), "StatusOr constructed from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(data_); }
  const T& value() const& {
    CheckHasValue();
    return std::get<T>(data_);
  }
  T& value() & {
    CheckHasValue();
    return std::get<T>(data_);
  }
  T&& value() && {
    CheckHasValue();
    return std::get<T>(std::move(data_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  // Before every std::get<T>, so that never throws bad_variant_access.
  void CheckHasValue() const {
    SHARDSCOPE_CHECK(ok(), "StatusOr::value() on an error: " + std::get<Status>(data_).message());
  }

  std::variant<T, Status> data_;
};

}  // namespace shardscope

#define SHARDSCOPE_CONCAT_INNER_(a, b) a##b
#define SHARDSCOPE_CONCAT_(a, b) SHARDSCOPE_CONCAT_INNER_(a, b)

#define SHARDSCOPE_RETURN_IF_ERROR(expr)              \
  do {                                                \
    ::shardscope::Status shardscope_status_ = (expr); \
    if (!shardscope_status_.ok()) return shardscope_status_; \
  } while (0)

#define SHARDSCOPE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return tmp.status();                     \
  lhs = std::move(tmp).value()

#define SHARDSCOPE_ASSIGN_OR_RETURN(lhs, expr) \
  SHARDSCOPE_ASSIGN_OR_RETURN_IMPL_(SHARDSCOPE_CONCAT_(shardscope_or_, __LINE__), lhs, expr)

#endif  // SHARDSCOPE_BASE_STATUS_H_
