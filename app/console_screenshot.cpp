// The frame into the window's framebuffer, and --screenshot: that framebuffer as the operator would see it,
// read back after the frame is drawn.
#include <GL/gl.h>
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>  // stbi_write_png (Debian's libstb)

#include <algorithm>
#include <cmath>
#include <vector>

#include "app/console_parts.h"

namespace gantry {

void console_render(GLFWwindow* window) {
  ImGui::Render();
  int w = 0, h = 0;
  glfwGetFramebufferSize(window, &w, &h);
  glViewport(0, 0, w, h);
  glClearColor(0.08f, 0.08f, 0.10f, 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
}

Status console_screenshot_write(const std::string& path, int width, int height) {
  return console_png_region_write(path, 0, 0, width, height, height);
}

Status console_png_region_write(const std::string& path, int x, int y, int width, int height,
                                int framebuffer_height) {
  if (width <= 0 || height <= 0) return Status::error("the window has no pixels to capture");
  std::vector<unsigned char> pixels(static_cast<size_t>(width) * static_cast<size_t>(height) * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  // GL's rows start at the bottom: the region's top row y (from the top) is GL row fb_h - y - height.
  glReadPixels(x, framebuffer_height - y - height, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  if (glGetError() != GL_NO_ERROR) return Status::error("glReadPixels failed");
  // GL's rows start at the bottom; a PNG's at the top.
  const size_t stride = static_cast<size_t>(width) * 4;
  std::vector<unsigned char> flipped(pixels.size());
  for (int r = 0; r < height; ++r)
    std::copy_n(&pixels[static_cast<size_t>(height - 1 - r) * stride], stride,
                &flipped[static_cast<size_t>(r) * stride]);
  if (!stbi_write_png(path.c_str(), width, height, 4, flipped.data(), static_cast<int>(stride)))
    return Status::error("cannot write " + path);
  return Status();
}

Status console_plot_png_write(const std::string& path, ImVec2 min, ImVec2 max, int fb_width, int fb_height) {
  // ImGui's coordinates are in window points; the framebuffer may have more pixels per point (HiDPI).
  const ImVec2 scale = ImGui::GetIO().DisplayFramebufferScale;
  const int x0 = std::clamp(static_cast<int>(std::floor(min.x * scale.x)), 0, fb_width);
  const int y0 = std::clamp(static_cast<int>(std::floor(min.y * scale.y)), 0, fb_height);
  const int x1 = std::clamp(static_cast<int>(std::ceil(max.x * scale.x)), 0, fb_width);
  const int y1 = std::clamp(static_cast<int>(std::ceil(max.y * scale.y)), 0, fb_height);
  if (x1 <= x0 || y1 <= y0)
    return Status::error("cannot export " + path + ": the plot is outside the window (nothing to capture)");
  return console_png_region_write(path, x0, y0, x1 - x0, y1 - y0, fb_height);
}

}  // namespace gantry
