// The heatmap as a texture (texture.h): with a backend registered, the widget uploads one texel per cell in
// the colour the rectangles would have had, draws it as one image, and uploads again only when a cell
// changes. The backend here keeps its textures in memory (the GL one is app/'s; its pixels are checked under
// Xvfb by console_window_test's screenshot).
#include "ui/plot/texture.h"

#include <gtest/gtest.h>
#include <imgui.h>

#include <cstdint>
#include <map>
#include <vector>

#include "tests/ui/headless_imgui.h"
#include "ui/plot/plot_widget.h"

namespace gantry::plot {
namespace {

class MemoryTextures final : public TextureBackend {
 public:
  ImTextureID create(int w, int h) override {
    const intptr_t id = ++last_;
    textures[id] = {w, h, {}};
    return reinterpret_cast<ImTextureID>(id);
  }
  void update(ImTextureID id, const uint32_t* rgba, int w, int h) override {
    Texture& t = textures.at(reinterpret_cast<intptr_t>(id));
    t.texels.assign(rgba, rgba + static_cast<size_t>(w) * static_cast<size_t>(h));
    ++uploads;
  }
  void destroy(ImTextureID id) override { textures.erase(reinterpret_cast<intptr_t>(id)); }

  struct Texture {
    int w = 0, h = 0;
    std::vector<uint32_t> texels;
  };
  std::map<intptr_t, Texture> textures;
  int uploads = 0;

 private:
  intptr_t last_ = 0;
};

TEST(HeatmapTexture, OneTexelPerCellInTheCellsColourUploadedOnlyWhenACellChanges) {
  HeadlessImGui ui(ImVec2(1280, 800));
  MemoryTextures backend;
  set_texture_backend(&backend);
  HeatmapModel model(4);
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 10; ++s) model.set(r, s, static_cast<float>(r * 10 + s));
  model.set(2, 5, NAN);  // a missing cell keeps its own colour
  HeatmapView view;
  ImDrawList* dl = ui.frame("heat", [&] { heatmap_widget("##heat", view, model, ImVec2(600, 300)); });
  ASSERT_EQ(backend.textures.size(), 1u);
  const MemoryTextures::Texture& t = backend.textures.begin()->second;
  const HeatmapGrid& g = view.grid;
  ASSERT_EQ(t.w, g.cols);
  ASSERT_EQ(t.h, g.rows);
  for (int r = 0; r < g.rows; ++r)
    for (int c = 0; c < g.cols; ++c)
      EXPECT_EQ(t.texels[static_cast<size_t>(r) * g.cols + c],
                colour_scale_map(view.scale.min, view.scale.max, g.at(r, c)))
          << "row " << r << " col " << c;
  // Drawn as an image of that texture, over the map.
  bool drawn = false;
  for (const ImDrawCmd& cmd : dl->CmdBuffer) drawn = drawn || cmd.TextureId == view.texture.id();
  EXPECT_TRUE(drawn) << "no draw command uses the heatmap's texture";
  EXPECT_EQ(backend.uploads, 1);

  ui.frame("heat", [&] { heatmap_widget("##heat", view, model, ImVec2(600, 300)); });
  EXPECT_EQ(backend.uploads, 1) << "nothing changed: no upload";
  model.set(0, 0, 39.0f);
  ui.frame("heat", [&] { heatmap_widget("##heat", view, model, ImVec2(600, 300)); });
  EXPECT_EQ(backend.uploads, 2) << "a cell changed";
  set_texture_backend(nullptr);
}

}  // namespace
}  // namespace gantry::plot
