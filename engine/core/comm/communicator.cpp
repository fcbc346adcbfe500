#include "engine/core/comm/communicator.h"

namespace gantry {

std::string comm_error_prefix(const char* backend, const char* op, int rank, int size, size_t count) {
  return std::string(backend) + " " + op + " (rank " + std::to_string(rank) + " of " + std::to_string(size) +
         ", " + std::to_string(count) + " floats): ";
}

std::string comm_unusable_text(bool aborted, const std::string& broken) {
  return aborted ? std::string("aborted") : "communicator unusable after an earlier error: " + broken;
}

namespace {
Status no_streams(const Communicator& c, const char* op, size_t count) {
  return Status::error(
      comm_error_prefix(c.backend(), op, c.rank(), c.size(), count) +
      "not supported: this communicator has no stream-ordered operations (device memory only)");
}
}  // namespace

Status Communicator::all_reduce_enqueue(float*, size_t count, void*) {
  return no_streams(*this, "all_reduce_enqueue", count);
}
Status Communicator::reduce_scatter_enqueue(const float*, float*, size_t count, void*) {
  return no_streams(*this, "reduce_scatter_enqueue", count);
}
Status Communicator::all_gather_enqueue(const void*, void*, size_t count, size_t, void*) {
  return no_streams(*this, "all_gather_enqueue", count);
}
Status Communicator::all_reduce_bf16_enqueue(void*, size_t count, void*) {
  return no_streams(*this, "all_reduce_bf16_enqueue", count);
}
Status Communicator::reduce_scatter_bf16_enqueue(void*, size_t count, void*) {
  return no_streams(*this, "reduce_scatter_bf16_enqueue", count);
}
Status Communicator::send_enqueue(const void*, size_t count, size_t, int, void*) {
  return no_streams(*this, "send_enqueue", count);
}
Status Communicator::recv_enqueue(void*, size_t count, size_t, int, void*) {
  return no_streams(*this, "recv_enqueue", count);
}
Status Communicator::send_recv(const float*, size_t send_count, int, float*, size_t recv_count, int,
                               Timeout) {
  return Status::error(comm_error_prefix(backend(), "send_recv", rank(), size(), send_count + recv_count) +
                       "not supported by this communicator");
}
Status Communicator::sync(void*, Timeout) {
  return no_streams(*this, "sync", 0);
}

}  // namespace gantry
