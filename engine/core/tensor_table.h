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

#include <cstddef>
#include <cstdint>
#include <string>
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

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // global shape, row-major
  size_t offset = 0;           // elements from the start of the flat buffer
  size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies (matrices only)
  int layer = -1;      // transformer block index, -1 for embeddings and the final norm
};

class TensorTable {
 public:
  // Appends a tensor after the last one; returns its index.
  size_t add(std::string name, std::vector<int64_t> shape, bool decay, int layer);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  size_t numel() const { return numel_; }  // elements in the whole flat buffer
  const TensorInfo& operator[](size_t i) const { return tensors_[i]; }
  // The tensor named `name`; the table must hold it (names come from the same code that built it).
  const TensorInfo& at(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;

  // Index of the tensor containing flat element `offset`.
  size_t index_of_offset(size_t offset) const;

 private:
  std::vector<TensorInfo> tensors_;
  size_t numel_ = 0;
};

std::string tensor_shape_text(const std::vector<int64_t>& shape);  // "(768, 2304)"

}  // namespace gantry
