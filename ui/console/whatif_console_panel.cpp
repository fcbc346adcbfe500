// The What-if window: ui/whatif's panel on the followed run, its Apply sent as resume-from.
#include <imgui.h>

#include <string>

#include "ui/console/panels.h"

namespace gantry::console {

void WhatIfPanel::draw(const ConsoleSnapshot& s, PanelContext& ctx) {
  ctx.frame.panels.push_back("What-if");
  if (s.run.id != loaded_run_ && loaded_run_ >= 0) {
    // Another run is followed now: Apply must never resume the one the form was loaded from.
    model_.forget_run();
    loaded_run_ = -1;
    load_error_.clear();
  }
  // The list of runs has no model or batch; the form waits for the run's own route (fetched once per run).
  if (s.run.id >= 0 && loaded_run_ < 0 && s.run.detail.is_object()) {
    Status st = model_.load_run(s.run.detail);
    load_error_ = st.ok() ? "" : st.message();
    loaded_run_ = s.run.id;              // tried: a config that does not parse is not tried again every frame
    evaluated_ = evaluated_ || st.ok();  // load_run evaluates
    // The operator came here from a run: show first the best layout that run can be moved to (the
    // list stays ranked over all layouts), so Apply is one press (or one scripted click) away.
    for (int i = 0; st.ok() && i < static_cast<int>(model_.candidates().size()); ++i) {
      if (model_.apply(i)) {
        model_.select(i);
        break;
      }
    }
  }
  if (!evaluated_) {
    model_.evaluate();
    evaluated_ = true;
  }
  if (loaded_run_ >= 0) model_.set_run_state(s.run.state);
  if (!load_error_.empty())
    ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "run %lld: %s", static_cast<long long>(loaded_run_),
                       load_error_.c_str());

  const std::optional<whatif::WhatIfApply> a = whatif::whatif_panel(
      model_, view_, [&](const char* label, bool enabled) { return ctx.clicks.button(label, enabled); });
  if (a) {
    ctx.source.request_resume_from(
        a->run_id, a->checkpoint,
        ResumeLayout{.dp = a->dp, .zero = a->zero, .tp = a->tp, .pp = a->pp, .vp = a->vp});
  }
}

}  // namespace gantry::console
