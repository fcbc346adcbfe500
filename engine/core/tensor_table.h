// One flat buffer per category (parameters, gradients, AdamW m and v) carved into named tensors by a
// table. Every tensor has a global shape and an offset into the flat buffer; ZeRO shards, tensor- and
// pipeline-parallel splits and checkpoint slices are all ranges of this table's global coordinates, so
// the optimizer, the gradient norm, the all-reduce and the checkpoint each work on one array.
//
//   TensorTable t;
//   t.add("wte", {V, C}, /*decay=*/true, /*layer=*/-1);
//   const TensorInfo& w = t.at("wte");      // w.offset, w.numel
//   float* wte = params.data() + w.offset;  // (V, C)
#pragma once

#include <algorithm>  // std::min
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gantry {

// A range of a flat buffer in global element coordinates.
struct FlatRange {
  size_t offset = 0;
  size_t count = 0;
  size_t end() const { return offset + count; }
};
// Written out: CUDA translation units include this header as C++17.
inline bool operator==(const FlatRange& a, const FlatRange& b) {
  return a.offset == b.offset && a.count == b.count;
}

// Where a rank's tensor lies in the whole model's tensor of the same name when the rank holds a share of
// it (tensor parallelism, engine/core/parallel/tensor_parallel.h): element i of the share is element
//   offset + (i / width) * stride + i % width
// of the whole tensor in its row-major order (rows of a matrix: one run; columns: one run per row).
// whole_shape empty: the rank holds the tensor whole. `replicas` ranks hold the same elements (a tensor
// kept whole on every tp rank); `replica` is this rank's index among them, so that a checkpoint can take
// 1/replicas of it from each and every element once.
struct TensorShare {
  std::vector<int64_t> whole_shape;
  size_t offset = 0, width = 0, stride = 0;
  int replicas = 1;
  int replica = 0;
  bool split() const { return !whole_shape.empty(); }
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // shape of what this rank holds, row-major: global unless share.split()
  size_t offset = 0;           // elements from the start of the flat buffer
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (matrices only)
  int layer = -1;      // transformer block index, -1 for embeddings and the final norm
  TensorShare share;   // default: held whole (or replicated, see replicas)
  // The whole model's shape of this tensor.
  const std::vector<int64_t>& whole_shape() const { return share.split() ? share.whole_shape : shape; }
};

class TensorTable {
 public:
  // Appends a tensor after the last one; returns its index.
  size_t add(std::string name, std::vector<int64_t> shape, bool decay, int layer);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  size_t numel() const { return numel_; }  // elements in the whole flat buffer
  const TensorInfo& operator[](size_t i) const { return tensors_[i]; }
  // Records that tensor i is a share of the whole model's (TensorShare).
  void set_share(size_t i, TensorShare share) { tensors_[i].share = std::move(share); }
  // The tensor named `name`; the table must hold it (names come from the same code that built it).
  const TensorInfo& at(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;

  // Index of the tensor containing flat element `offset`.
  size_t index_of_offset(size_t offset) const;

 private:
  std::vector<TensorInfo> tensors_;
  size_t numel_ = 0;
};

// Calls fn(whole element, share element, count) for each run of elements [first, first + count) of t's
// share that is contiguous in the whole tensor, in order (one call when t is held whole).
template <typename Fn>
void tensor_share_runs(const TensorInfo& t, size_t first, size_t count, Fn&& fn) {
  if (!t.share.split()) {
    if (count > 0) fn(first, first, count);
    return;
  }
  const size_t w = t.share.width, end = first + count;
  for (size_t i = first; i < end;) {
    const size_t row = i / w, col = i % w, n = std::min(w - col, end - i);
    fn(t.share.offset + row * t.share.stride + col, i, n);
    i += n;
  }
}

// Elements of a tensor of this shape.
size_t tensor_numel(const std::vector<int64_t>& shape);

std::string tensor_shape_text(const std::vector<int64_t>& shape);  // "(768, 2304)"

}  // namespace gantry
