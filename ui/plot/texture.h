// Images drawn as one textured quad instead of thousands of rectangles (issue 21's frame time): a heatmap of
// 128 devices × 260 columns is ~33,000 rectangles, and on a software renderer (Mesa llvmpipe) every vertex
// costs the UI thread; as a texture it is 4 vertices, uploaded only when its cells change.
//
// gantry_plot owns no GL context (app/ does), so the owner registers a backend; without one (headless tests)
// the widgets draw rectangles as before.
//
//   plot::set_texture_backend(&gl_textures);          // app/, after the GL context exists
//   plot::PlotTexture tex;                            // in a view struct: lives across frames
//   if (tex.upload(rgba, w, h)) dl->AddImage(tex.id(), min, max);
//   plot::set_texture_backend(nullptr);               // before the context goes
#pragma once

#include <imgui.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace gantry::plot {

class TextureBackend {
 public:
  virtual ~TextureBackend() = default;
  // A texture of w × h RGBA texels (IM_COL32 order: R in the low byte), sampled nearest (cells stay sharp).
  virtual ImTextureID create(int w, int h) = 0;
  virtual void update(ImTextureID id, const uint32_t* rgba, int w, int h) = 0;
  virtual void destroy(ImTextureID id) = 0;
};

void set_texture_backend(TextureBackend* backend);
TextureBackend* texture_backend();

// One texture and the texels last uploaded to it. Copies share the texture.
class PlotTexture {
 public:
  // Uploads `rgba` (w × h) unless it equals what the texture holds; false when there is no backend.
  bool upload(const std::vector<uint32_t>& rgba, int w, int h);
  ImTextureID id() const { return state_ ? state_->id : nullptr; }

 private:
  struct State {
    TextureBackend* backend = nullptr;
    ImTextureID id = nullptr;
    int w = 0, h = 0;
    std::vector<uint32_t> texels;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace gantry::plot
