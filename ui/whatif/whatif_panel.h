// The what-if panel, drawn with Dear ImGui: the planner form (model, cluster, batch, layout), its
// validation messages, the ranked candidate layouts, and for the selected one memory by bucket against
// HBM, the step's time split (compute, bubble, exposed communication, optimizer) and communication per
// axis. "Apply" never acts itself: it returns the layout to resume the loaded run on, and the caller
// sends it (resume-from of WhatIfApply::run_id with WhatIfApply::body()).
//
//   // once:  whatif::WhatIfModel model; whatif::WhatIfPanelView view; model.evaluate();
//   // on a run's details (GET /v1/runs/{id}): model.load_run(run_json);
//   if (ImGui::Begin("What-if")) {
//     if (std::optional<whatif::WhatIfApply> a = whatif::whatif_panel(model, view))
//       source.request_resume_from(a->run_id, a->checkpoint, {.dp = a->dp, .zero = a->zero});
//   }
//   ImGui::End();
//
// Call inside an ImGui window, once per frame. Editing the form re-evaluates at once: the search takes
// 2-11 ms (llama3-70b on 1,024 GPUs: 7,528 layouts in 10 ms), under a frame; docs/WHATIF_PANEL.md.
#pragma once

#include <imgui.h>

#include <functional>
#include <optional>

#include "ui/whatif/whatif_model.h"

namespace gantry::whatif {

// How the panel draws its buttons: a caller that records clickable buttons (the console's script runner)
// passes its own; empty = ImGui::Button, greyed out and inert when !enabled. Returns whether it was pressed.
using PanelButton = std::function<bool(const char* label, bool enabled)>;

// What the panel keeps between frames, and what its last frame drew (for tests and scripted input).
struct WhatIfPanelView {
  // Outputs of the last call.
  ImVec2 apply_min{0, 0}, apply_max{0, 0};  // the Apply button, screen pixels (zero when not drawn)
  bool apply_enabled = false;
  ImVec2 memory_min{0, 0}, memory_max{0, 0};  // the stacked memory bar; its full width is max(HBM, total)
  float hbm_x = 0;                            // where the HBM limit line stands (screen x)
  int rows_drawn = 0;                         // candidate rows in the table
};

// The colour of memory bucket `i` (whatif_memory_bars' order) and of the HBM limit line.
uint32_t whatif_bucket_colour(int i);
uint32_t whatif_hbm_colour();

// Draws the panel; returns the layout to apply when Apply was pressed this frame.
std::optional<WhatIfApply> whatif_panel(WhatIfModel& m, WhatIfPanelView& view,
                                        const PanelButton& button = {});

}  // namespace gantry::whatif
