// Plot textures: see texture.h.
#include "ui/plot/texture.h"

namespace gantry::plot {
namespace {

TextureBackend* g_backend = nullptr;

}  // namespace

void set_texture_backend(TextureBackend* backend) {
  g_backend = backend;
}
TextureBackend* texture_backend() {
  return g_backend;
}

PlotTexture::State::~State() {
  // Only through the backend that made it, and only while it is still registered (the GL context lives).
  if (id != nullptr && backend != nullptr && backend == g_backend) backend->destroy(id);
}

bool PlotTexture::upload(const std::vector<uint32_t>& rgba, int w, int h) {
  if (g_backend == nullptr || w <= 0 || h <= 0 ||
      rgba.size() < static_cast<size_t>(w) * static_cast<size_t>(h))
    return false;
  if (!state_ || state_->backend != g_backend) {
    state_ = std::make_shared<State>();
    state_->backend = g_backend;
  }
  State& s = *state_;
  if (s.id != nullptr && s.w == w && s.h == h && s.texels == rgba) return true;  // unchanged: no upload
  if (s.id == nullptr || s.w != w || s.h != h) {
    if (s.id != nullptr) s.backend->destroy(s.id);
    s.id = s.backend->create(w, h);
    s.w = w;
    s.h = h;
  }
  s.backend->update(s.id, rgba.data(), w, h);
  s.texels = rgba;
  return s.id != nullptr;
}

}  // namespace gantry::plot
