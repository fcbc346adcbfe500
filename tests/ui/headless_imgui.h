// A Dear ImGui context with no window and no renderer, for tests that draw widgets or panels and read what
// they drew back from the draw lists (shared by the plot, what-if and history tests).
//
//   HeadlessImGui ui(ImVec2(1280, 800));
//   ImDrawList* dl = ui.frame("plots", [&] { plot_lines("p", view, series, {}, ImVec2(800, 300)); });
//   for (const ImDrawVert& v : dl->VtxBuffer) ...   // valid until the next frame
#pragma once

#include <imgui.h>

#include <functional>

namespace gantry {

class HeadlessImGui {
 public:
  explicit HeadlessImGui(ImVec2 display) : ctx_(ImGui::CreateContext()) {
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = display;
    io.DeltaTime = 1.0f / 60;
    io.IniFilename = nullptr;
    // As the OpenGL 3 backend declares: draw lists may pass 65,536 vertices (the heatmap can).
    io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset;
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
  }
  ~HeadlessImGui() { ImGui::DestroyContext(ctx_); }
  HeadlessImGui(const HeadlessImGui&) = delete;
  HeadlessImGui& operator=(const HeadlessImGui&) = delete;

  // One frame with `body` inside a fixed full-screen window called `name`; returns that window's draw list.
  // The mouse wheel is left to the body's widgets (the window itself never scrolls).
  ImDrawList* frame(const char* name, const std::function<void()>& body) {
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImGui::GetIO().DisplaySize);
    ImGui::Begin(name, nullptr,
                 ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoSavedSettings |
                     ImGuiWindowFlags_NoScrollWithMouse);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    body();
    ImGui::End();
    ImGui::Render();
    return dl;
  }

 private:
  ImGuiContext* ctx_;
};

}  // namespace gantry
