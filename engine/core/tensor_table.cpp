#include "engine/core/tensor_table.h"

#include <algorithm>
#include <stdexcept>

namespace gantry {

size_t TensorTable::add(std::string name, std::vector<int64_t> shape, bool decay, int layer) {
  TensorInfo t;
  t.name = std::move(name);
  t.numel = 1;
  for (int64_t d : shape) t.numel *= static_cast<size_t>(d);
  t.shape = std::move(shape);
  t.offset = numel_;
  t.decay = decay;
  t.layer = layer;
  numel_ += t.numel;
  tensors_.push_back(std::move(t));
  return tensors_.size() - 1;
}

const TensorInfo* TensorTable::find(const std::string& name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TensorInfo& TensorTable::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  // A missing name is a programming error inside the engine (names and table come from one place).
  if (t == nullptr) throw std::logic_error("tensor table has no tensor named '" + name + "'");
  return *t;
}

size_t TensorTable::index_of_offset(size_t offset) const {
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), offset,
                             [](size_t off, const TensorInfo& t) { return off < t.offset; });
  return static_cast<size_t>(it - tensors_.begin()) - 1;
}

size_t tensor_numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string tensor_shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + ")";
}

}  // namespace gantry
