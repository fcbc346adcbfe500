// The frame into the window's framebuffer, and --screenshot: that framebuffer as the operator would see it,
// read back after the frame is drawn.
#include <GL/gl.h>
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>  // stbi_write_png (Debian's libstb)

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
  if (width <= 0 || height <= 0) return Status::error("the window has no pixels to capture");
  std::vector<unsigned char> pixels(static_cast<size_t>(width) * static_cast<size_t>(height) * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  if (glGetError() != GL_NO_ERROR) return Status::error("glReadPixels failed");
  // GL's rows start at the bottom; a PNG's at the top.
  const size_t stride = static_cast<size_t>(width) * 4;
  std::vector<unsigned char> flipped(pixels.size());
  for (int y = 0; y < height; ++y)
    std::copy_n(&pixels[static_cast<size_t>(height - 1 - y) * stride], stride,
                &flipped[static_cast<size_t>(y) * stride]);
  if (!stbi_write_png(path.c_str(), width, height, 4, flipped.data(), static_cast<int>(stride)))
    return Status::error("cannot write " + path);
  return Status();
}

}  // namespace gantry
