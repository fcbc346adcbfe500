#include "ui/whatif/whatif_panel.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "engine/cluster/run_lifecycle.h"  // whether the run takes resume-from, in the coordinator's words

namespace gantry::whatif {

namespace {

constexpr uint32_t kIssueColour = IM_COL32(255, 110, 90, 255);
constexpr uint32_t kDimColour = IM_COL32(170, 170, 170, 255);

bool draw_button(const PanelButton& button, const char* label, bool enabled) {
  if (button) return button(label, enabled);
  ImGui::BeginDisabled(!enabled);
  const bool pressed = ImGui::Button(label);
  ImGui::EndDisabled();
  return pressed && enabled;
}

bool combo_of(const char* label, std::string& value, const std::vector<std::string>& names) {
  bool changed = false;
  if (ImGui::BeginCombo(label, value.c_str())) {
    for (const std::string& n : names) {
      if (ImGui::Selectable(n.c_str(), n == value)) {
        changed = n != value;
        value = n;
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

template <class E>
bool combo_enum(const char* label, E& value, std::initializer_list<std::pair<E, const char*>> items) {
  const char* current = "?";
  for (const auto& [v, name] : items) {
    if (v == value) current = name;
  }
  bool changed = false;
  if (ImGui::BeginCombo(label, current)) {
    for (const auto& [v, name] : items) {
      if (ImGui::Selectable(name, v == value)) {
        changed = v != value;
        value = v;
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

bool int_field(const char* label, int& v) {
  ImGui::SetNextItemWidth(110);
  return ImGui::InputInt(label, &v, 1, 8);
}

// The form; true when anything changed (the caller re-evaluates).
bool draw_form(WhatIfForm& f) {
  bool changed = false;
  if (ImGui::CollapsingHeader("Model", ImGuiTreeNodeFlags_DefaultOpen)) {
    changed |= ImGui::Checkbox("custom dimensions", &f.custom_model);
    if (!f.custom_model) {
      ImGui::SetNextItemWidth(200);
      changed |= combo_of("preset", f.preset, plan_model_preset_names());
    } else {
      PlanModel& m = f.model;
      changed |= int_field("layers", m.layers);
      ImGui::SameLine();
      changed |= int_field("hidden", m.hidden);
      ImGui::SameLine();
      changed |= int_field("heads", m.heads);
      changed |= int_field("kv heads (0 = heads)", m.kv_heads);
      ImGui::SameLine();
      changed |= int_field("ffn (0 = 4 hidden)", m.ffn);
      changed |= int_field("vocab", m.vocab);
      ImGui::SameLine();
      changed |= int_field("seq", m.seq);
      ImGui::SetNextItemWidth(110);
      changed |= combo_enum("ffn kind", m.ffn_kind, {{FfnKind::kGelu, "gelu"}, {FfnKind::kSwiGlu, "swiglu"}});
      ImGui::SameLine();
      changed |= ImGui::Checkbox("tied embeddings", &m.tied_embeddings);
    }
  }
  if (ImGui::CollapsingHeader("Cluster and batch", ImGuiTreeNodeFlags_DefaultOpen)) {
    ImGui::SetNextItemWidth(140);
    changed |= combo_of("GPU", f.gpu, plan_gpu_preset_names());
    ImGui::SameLine();
    changed |= int_field("GPUs", f.gpus);
    ImGui::SameLine();
    changed |= int_field("per node", f.gpus_per_node);
    changed |= int_field("global batch (sequences; 0 = ~1M tokens)", f.global_batch);
    ImGui::SetNextItemWidth(140);
    changed |= combo_enum("engine", f.engine,
                          {{EngineKind::kGeneric, "generic"},
                           {EngineKind::kGantryCpu, "gantry-cpu"},
                           {EngineKind::kGantryCuda, "gantry-cuda"}});
  }
  if (ImGui::CollapsingHeader("Layout", ImGuiTreeNodeFlags_DefaultOpen)) {
    PlanLayout& l = f.layout;
    changed |= int_field("tp", l.tp);
    ImGui::SameLine();
    changed |= int_field("pp", l.pp);
    ImGui::SameLine();
    changed |= int_field("vp", l.vp);
    changed |= int_field("cp", l.cp);
    ImGui::SameLine();
    changed |= int_field("dp (0 = derive)", l.dp);
    changed |= int_field("zero", l.zero);
    ImGui::SameLine();
    changed |= int_field("hsdp (0 = all dp)", l.hsdp);
    changed |= int_field("micro-batch", l.micro_batch);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(110);
    changed |= combo_enum(
        "recompute", l.recompute,
        {{Recompute::kNone, "none"}, {Recompute::kSelective, "selective"}, {Recompute::kFull, "full"}});
    changed |= ImGui::Checkbox("sequence parallel", &l.sequence_parallel);
    ImGui::SameLine();
    changed |= ImGui::Checkbox("flash attention", &l.flash_attention);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(100);
    changed |= combo_enum(
        "schedule", l.schedule,
        {{Schedule::kGpipe, "gpipe"}, {Schedule::k1F1B, "1f1b"}, {Schedule::kZeroBubbleH1, "zbh1"}});
    ImGui::SetNextItemWidth(110);
    changed |= combo_enum("rank by", f.rank,
                          {{SearchRank::kTokensPerSecond, "tokens/s"}, {SearchRank::kGoodput, "goodput"}});
    ImGui::SameLine();
    changed |= int_field("search top", f.top);
  }
  return changed;
}

std::string sources_text(unsigned s) {
  std::string out;
  if (s & kFromForm) out += "form ";
  if (s & kFromSearch) out += "search ";
  if (s & kFromEngine) out += "engine";
  return out;
}

void draw_table(WhatIfModel& m, WhatIfPanelView& view) {
  view.rows_drawn = 0;
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV |
                                ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
  const float height = ImGui::GetTextLineHeightWithSpacing() *
                       static_cast<float>(std::min<size_t>(m.candidates().size(), 10) + 1.5f);
  if (!ImGui::BeginTable("##candidates", 8, flags, ImVec2(0, height))) return;
  ImGui::TableSetupScrollFreeze(0, 1);
  ImGui::TableSetupColumn("#");
  ImGui::TableSetupColumn("layout");
  ImGui::TableSetupColumn("step");
  ImGui::TableSetupColumn("tokens/s");
  ImGui::TableSetupColumn("MFU");
  ImGui::TableSetupColumn("memory");
  ImGui::TableSetupColumn("fit");
  ImGui::TableSetupColumn("from");
  ImGui::TableHeadersRow();
  const std::vector<Candidate>& cs = m.candidates();
  for (int i = 0; i < static_cast<int>(cs.size()); ++i) {
    const Candidate& c = cs[i];
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    char id[32];
    std::snprintf(id, sizeof id, "%d##row%d", i + 1, i);
    if (ImGui::Selectable(id, m.selected() == i, ImGuiSelectableFlags_SpanAllColumns)) m.select(i);
    if (!c.plan.fits) ImGui::PushStyleColor(ImGuiCol_Text, kIssueColour);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(c.label().c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(whatif_format_seconds(c.plan.step_s).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(whatif_format_count(c.plan.tokens_per_s).c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%.1f%%", c.plan.mfu * 100);
    if (ImGui::IsItemHovered()) {
      // DESIGN.md: the formula and the peak beside every MFU figure.
      ImGui::SetTooltip("MFU = tokens/s x %.4g FLOP/token (%s) / (%d GPUs x %.0f TFLOP/s bf16 dense)",
                        c.plan.model_flops_per_token, flop_convention_name(c.plan.convention), c.plan.gpus,
                        c.plan.peak_flops / 1e12);
    }
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(whatif_format_bytes(c.plan.memory.total()).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(c.fit_note.c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(sources_text(c.sources).c_str());
    if (!c.plan.fits) ImGui::PopStyleColor();
    ++view.rows_drawn;
  }
  ImGui::EndTable();
}

void draw_memory(const Plan& p, WhatIfPanelView& view) {
  const std::vector<MemoryBar> bars = whatif_memory_bars(p);
  ImGui::Text("Memory per GPU (pipeline stage %d, the heaviest): %s of %s HBM", p.memory_stage,
              whatif_format_bytes(p.memory.total()).c_str(), whatif_format_bytes(p.hbm_bytes).c_str());
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 at = ImGui::GetCursorScreenPos();
  const float width = std::max(100.0f, ImGui::GetContentRegionAvail().x - 10);
  const float height = ImGui::GetFrameHeight();
  // The full width is whichever is larger, HBM or what the layout needs, so an overflow shows past the line.
  const double full = std::max(p.hbm_bytes, p.memory.total());
  const double px_per_byte = full > 0 ? width / full : 0;
  dl->AddRectFilled(at, ImVec2(at.x + width, at.y + height), IM_COL32(40, 40, 45, 255));
  float x = at.x;
  for (size_t i = 0; i < bars.size(); ++i) {
    const float w = static_cast<float>(bars[i].bytes * px_per_byte);
    if (w > 0)
      dl->AddRectFilled(ImVec2(x, at.y), ImVec2(x + w, at.y + height),
                        whatif_bucket_colour(static_cast<int>(i)));
    x += w;
  }
  view.hbm_x = at.x + static_cast<float>(p.hbm_bytes * px_per_byte);
  dl->AddLine(ImVec2(view.hbm_x, at.y - 3), ImVec2(view.hbm_x, at.y + height + 3), whatif_hbm_colour(), 2);
  view.memory_min = at;
  view.memory_max = ImVec2(at.x + width, at.y + height);
  ImGui::Dummy(ImVec2(width, height));
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    for (const MemoryBar& b : bars)
      ImGui::Text("%-12s %s", b.name.c_str(), whatif_format_bytes(b.bytes).c_str());
    ImGui::Text("%-12s %s", "HBM", whatif_format_bytes(p.hbm_bytes).c_str());
    ImGui::EndTooltip();
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    if (i > 0) ImGui::SameLine();
    ImGui::ColorButton(bars[i].name.c_str(),
                       ImGui::ColorConvertU32ToFloat4(whatif_bucket_colour(static_cast<int>(i))),
                       ImGuiColorEditFlags_NoTooltip, ImVec2(10, 10));
    ImGui::SameLine();
    ImGui::Text("%s %s", bars[i].name.c_str(), whatif_format_bytes(bars[i].bytes).c_str());
  }
}

void draw_time(const Plan& p) {
  std::string line = "Step " + whatif_format_seconds(p.step_s) + ":";
  for (const TimePart& t : whatif_time_parts(p)) {
    line += "  " + t.name + " " + whatif_format_seconds(t.seconds);
    if (t.name == "pipeline bubble" && p.layout.pp > 1) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " (%.1f%% of ideal, %s)", p.bubble_fraction * 100,
                    schedule_name(p.layout.schedule));
      line += buf;
    }
  }
  ImGui::TextUnformatted(line.c_str());
  if (p.comm.empty()) return;
  if (ImGui::BeginTable("##comm", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit)) {
    for (const char* h : {"axis", "what", "group", "bytes", "time", "exposed"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const CommAxis& a : p.comm) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::Text("%s%s", a.axis.c_str(), a.crosses_nodes ? " (nodes)" : "");
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(a.pattern.c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%d", a.group);
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(whatif_format_bytes(a.bytes).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(whatif_format_seconds(a.seconds).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(whatif_format_seconds(a.exposed_s).c_str());
    }
    ImGui::EndTable();
  }
}

}  // namespace

uint32_t whatif_bucket_colour(int i) {
  static constexpr uint32_t kColours[] = {IM_COL32(90, 160, 250, 255), IM_COL32(250, 170, 60, 255),
                                          IM_COL32(170, 110, 240, 255), IM_COL32(80, 200, 120, 255),
                                          IM_COL32(150, 150, 160, 255)};
  return kColours[std::clamp(i, 0, 4)];
}

uint32_t whatif_hbm_colour() {
  return IM_COL32(255, 60, 60, 255);
}

std::optional<WhatIfApply> whatif_panel(WhatIfModel& m, WhatIfPanelView& view, const PanelButton& button) {
  std::optional<WhatIfApply> applied;
  view.apply_min = view.apply_max = ImVec2(0, 0);
  view.apply_enabled = false;
  view.memory_min = view.memory_max = ImVec2(0, 0);
  ImGui::PushID("whatif");
  if (const std::optional<WhatIfRun>& r = m.run()) {
    ImGui::Text("Run %lld %s%s%s: dp=%d tp=%d pp=%d zero=%d, global batch %d, micro-batch %d",
                static_cast<long long>(r->id), r->name.c_str(), r->state.empty() ? "" : ", ",
                r->state.c_str(), r->dp, r->tp, r->pp, r->zero, r->global_batch, r->micro_batch);
  } else {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kDimColour),
                       "No run loaded: Apply needs the run to resume.");
  }
  if (draw_form(m.form)) m.evaluate();
  for (const FormIssue& i : m.issues()) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kIssueColour), "%s: %s", i.field.c_str(),
                       i.message.c_str());
  }
  if (!m.candidates().empty()) {
    ImGui::Separator();
    ImGui::Text("%zu candidate layouts (search: %d valid, %d fit)", m.candidates().size(),
                m.search_evaluated(), m.search_fitting());
    draw_table(m, view);
  }
  if (const Candidate* c = m.selection()) {
    ImGui::Separator();
    ImGui::Text("Selected: %s  (%s)", c->label().c_str(), c->fit_note.c_str());
    draw_memory(c->plan, view);
    draw_time(c->plan);
    const std::optional<WhatIfApply> a = m.apply(m.selected());
    const bool pressed = draw_button(button, "Apply", a.has_value());
    view.apply_min = ImGui::GetItemRectMin();
    view.apply_max = ImGui::GetItemRectMax();
    view.apply_enabled = a.has_value();
    ImGui::SameLine();
    if (a) {
      ImGui::Text("resume run %lld from its latest checkpoint on %s", static_cast<long long>(a->run_id),
                  a->text().c_str());
      const std::string& state = m.run()->state;
      const std::optional<RunState> st = run_state_from_name(state);
      if (Status why = st ? run_action_check(RunAction::kResumeFrom, *st) : Status(); !why.ok()) {
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kDimColour), "cannot resume-from: %s",
                           why.message().c_str());
      }
    } else {
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kDimColour), "%s", c->apply_blocker.c_str());
    }
    if (pressed && a) applied = a;
  }
  ImGui::PopID();
  return applied;
}

}  // namespace gantry::whatif
