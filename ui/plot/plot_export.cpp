// Plot export: see plot_export.h.
#include "ui/plot/plot_export.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>

namespace gantry::plot {
namespace {

PlotExports* g_current = nullptr;

// A CSV field: quoted when it holds a comma, a quote or a line break (RFC 4180).
std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// 17 significant digits read back to the same double; NaN is unknown, an empty cell.
void append_number(std::string& out, double v) {
  if (std::isnan(v)) return;
  if (std::isinf(v)) {
    out += v > 0 ? "inf" : "-inf";
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  out += buf;
}

std::string titled(std::string_view name, std::string_view unit) {
  return unit.empty() ? std::string(name) : std::string(name) + " (" + std::string(unit) + ")";
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return "cannot write " + path + ": " + std::strerror(errno);
  out << text;
  out.close();
  if (!out) return "cannot write " + path + ": " + std::strerror(errno);
  return "";
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

PlotExports* plot_exports_current() {
  return g_current;
}
void plot_exports_set_current(PlotExports* exports) {
  g_current = exports;
}

std::string plot_name(std::string_view id) {
  if (id.starts_with("##")) id.remove_prefix(2);
  return std::string(id);
}

bool export_format_of(std::string_view path, ExportFormat* format) {
  const std::string p = ascii_lower(path);
  if (p.ends_with(".csv")) {
    *format = ExportFormat::kCsv;
    return true;
  }
  if (p.ends_with(".png")) {
    *format = ExportFormat::kPng;
    return true;
  }
  return false;
}

void PlotExports::request(std::string plot, std::string path) {
  ExportFormat f = ExportFormat::kCsv;
  if (!export_format_of(path, &f)) {
    outcomes_.push_back({plot, path, "cannot export " + path + ": the name must end in .csv or .png"});
    return;
  }
  pending_.push_back({std::move(plot), std::move(path), f});
}

void PlotExports::on_plot(std::string_view id, ImVec2 min, ImVec2 max,
                          const std::function<std::string()>& csv) {
  if (pending_.empty()) return;
  const std::string name = plot_name(id);
  std::string text;
  bool made = false;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->plot != name) {
      ++it;
      continue;
    }
    if (it->format == ExportFormat::kCsv) {
      if (!made) text = csv();
      made = true;
      outcomes_.push_back({name, it->path, write_file(it->path, text)});
    } else {
      captures_.push_back({name, it->path, min, max});
    }
    it = pending_.erase(it);
  }
}

void PlotExports::context_menu(std::string_view id) {
  const std::string name = plot_name(id);
  if (!ImGui::BeginPopupContextItem((std::string(id) + "##export").c_str())) return;
  const char* ext = nullptr;
  if (ImGui::MenuItem("Export CSV")) ext = ".csv";
  if (ImGui::MenuItem("Export PNG")) ext = ".png";
  if (!outcomes_.empty()) {
    const ExportOutcome& last = outcomes_.back();
    ImGui::Separator();
    ImGui::TextDisabled("%s", last.error.empty() ? ("wrote " + last.path).c_str() : last.error.c_str());
  }
  ImGui::EndPopup();
  if (ext == nullptr) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    outcomes_.push_back({name, dir_, "cannot create " + dir_ + ": " + ec.message()});
    return;
  }
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string file = name;
  for (char& c : file)
    if (c == ' ' || c == '/') c = '_';
  request(name, (std::filesystem::path(dir_) / (file + "-" + stamp + ext)).string());
}

std::vector<PngCapture> PlotExports::take_captures() {
  std::vector<PngCapture> out;
  out.swap(captures_);
  return out;
}

void PlotExports::finished(std::string plot, std::string path, std::string error) {
  outcomes_.push_back({std::move(plot), std::move(path), std::move(error)});
}

std::string plot_csv(std::span<const PlotSeries> series, const PlotView& view) {
  std::vector<const PlotSeries*> shown;
  for (const PlotSeries& s : series)
    if (!view.is_hidden(s.name)) shown.push_back(&s);
  std::string out = csv_field(view.x_label.empty() ? "x" : view.x_label);
  for (const PlotSeries* s : shown) out += "," + csv_field(titled(s->name, view.y_unit));
  out += "\n";
  // A k-way merge over the series' x (each ascending), from the first point at or past x_min.
  std::vector<size_t> at(shown.size()), end(shown.size());
  for (size_t i = 0; i < shown.size(); ++i) {
    const PlotSeries& s = *shown[i];
    const size_t n = s.x == nullptr || s.y == nullptr ? 0 : s.n;
    at[i] = static_cast<size_t>(std::lower_bound(s.x, s.x + n, view.x_min) - s.x);
    end[i] = static_cast<size_t>(std::upper_bound(s.x, s.x + n, view.x_max) - s.x);
  }
  for (;;) {
    double x = std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < shown.size(); ++i)
      if (at[i] < end[i]) x = std::min(x, shown[i]->x[at[i]]);
    if (!std::isfinite(x)) break;
    append_number(out, x);
    for (size_t i = 0; i < shown.size(); ++i) {
      out += ",";
      // A repeated x in one series (two points at one step) gives one row each: the first here, the
      // next on the following row.
      if (at[i] < end[i] && shown[i]->x[at[i]] == x) append_number(out, shown[i]->y[at[i]++]);
    }
    out += "\n";
  }
  return out;
}

std::string heatmap_csv(const HeatmapView& view, int ranks) {
  const HeatmapGrid& g = view.grid;
  std::string out =
      "rank_lo,rank_hi,step_lo,step_hi," + csv_field(titled(view.value_label, view.unit)) + "\n";
  for (int r = 0; r < g.rows; ++r) {
    const int r0 = g.row_rank_begin(r), r1 = std::min(ranks, r0 + g.ranks_per_row);
    for (int c = 0; c < g.cols; ++c) {
      out += std::to_string(r0) + "," + std::to_string(r1) + "," + std::to_string(g.col_step_begin(c)) + "," +
             std::to_string(g.col_step_begin(c + 1)) + ",";
      append_number(out, static_cast<double>(g.at(r, c)));
      out += "\n";
    }
  }
  return out;
}

}  // namespace gantry::plot
