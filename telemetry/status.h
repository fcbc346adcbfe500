// Recoverable errors as values. engine/ never exits: it returns a Status (or a Result<T>) whose message
// names what is wrong and what would be right, and the caller decides.
//
//   Result<Config> cfg = config_load(path);
//   if (!cfg.ok()) { std::fprintf(stderr, "%s\n", cfg.error().c_str()); return 2; }
//   use(cfg.value());
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace gantry {

class Status {
 public:
  Status() = default;  // ok
  static Status error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

template <class T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design, `return value;`
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: `return Status::error(...);`

  bool ok() const { return value_.has_value(); }
  const std::string& error() const { return status_.message(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace gantry
