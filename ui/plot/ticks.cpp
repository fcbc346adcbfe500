// Nice axis ticks and compact labels: see ticks.h.
#include "ui/plot/ticks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>  // strtod

namespace gantry::plot {
namespace {

constexpr const char* kSiSuffix[] = {"", "k", "M", "G", "T", "P"};
constexpr int kSiMax = 5;

// Power of ten of a positive value, tolerant of log10's rounding just under an exact power.
int decade(double v) {
  return static_cast<int>(std::floor(std::log10(v) + 1e-9));
}

std::string printf_string(const char* fmt, int precision, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, precision, v);
  return buf;
}

// "1.500" → "1.5", "2.000" → "2"; leaves strings without a decimal point alone.
std::string strip_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

double ticks_step(double span, int target) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  // The smallest nice step at least the raw one, so there are never more than `target` intervals.
  double nice = 10;
  if (norm <= 1 + 1e-9)
    nice = 1;
  else if (norm <= 2 + 1e-9)
    nice = 2;
  else if (norm <= 5 + 1e-9)
    nice = 5;
  return nice * mag;
}

namespace {

std::vector<Tick> ticks_every(double lo, double hi, double step) {
  std::vector<Tick> out;
  // Multiples k·step (not a running sum, which drifts); the slack keeps ends that are exact multiples.
  const double k0 = std::ceil(lo / step - 1e-9);
  const double k1 = std::floor(hi / step + 1e-9);
  for (double k = k0; k <= k1; ++k) {
    double v = k * step;
    if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0" or 1e-17 where the axis crosses zero
    out.push_back({v, tick_label(v, step)});
  }
  return out;
}

}  // namespace

std::vector<Tick> ticks_nice(double lo, double hi, int target) {
  std::vector<Tick> out;
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) return out;
  if (lo == hi) {
    out.push_back({lo, format_value(lo)});
    return out;
  }
  return ticks_every(lo, hi, ticks_step(hi - lo, target));
}

std::vector<Tick> ticks_integer(double lo, double hi, int target) {
  std::vector<Tick> out;
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) return out;
  // A step below 1 would put ticks between two ranks (or steps) and label them "1.5".
  return ticks_every(lo, hi, std::max(1.0, ticks_step(hi - lo, target)));
}

std::string tick_label(double value, double step) {
  if (!std::isfinite(value)) return format_value(value);
  if (!(step > 0) || !std::isfinite(step)) return format_value(value);
  if (std::fabs(value) < step * 1e-9) return "0";
  const double mag = std::fabs(value);
  if (mag >= 1e18 || step < 1e-4) {
    // Enough mantissa digits to tell this tick from its neighbour.
    const int digits = std::max(0, decade(mag) - decade(step));
    return printf_string("%.*e", digits, value);
  }
  if (mag >= 1e3) {
    const int e3 = std::min(decade(mag) / 3, kSiMax);
    const double unit = std::pow(10.0, 3 * e3);
    const int decimals = std::max(0, -decade(step / unit));
    return strip_zeros(printf_string("%.*f", decimals, value / unit)) + kSiSuffix[e3];
  }
  return printf_string("%.*f", std::max(0, -decade(step)), value);
}

std::string format_value(double value, int significant) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return "0";
  significant = std::clamp(significant, 1, 17);
  const double mag = std::fabs(value);
  if (mag < 1e-4 || mag >= 1e18) {
    return printf_string("%.*e", significant - 1, value);
  }
  if (mag >= 1e3) {
    int e3 = std::min(decade(mag) / 3, kSiMax);
    for (;;) {
      const double scaled = value / std::pow(10.0, 3 * e3);
      const int decimals = std::max(0, significant - 1 - decade(std::fabs(scaled)));
      std::string s = printf_string("%.*f", decimals, scaled);
      // Rounding can carry into the next unit (999.96k at 4 digits prints 1000.0k): use it instead.
      if (std::fabs(std::strtod(s.c_str(), nullptr)) >= 1000 && e3 < kSiMax) {
        ++e3;
        continue;
      }
      return strip_zeros(s) + kSiSuffix[e3];
    }
  }
  const int decimals = std::max(0, significant - 1 - decade(mag));
  return strip_zeros(printf_string("%.*f", decimals, value));
}

}  // namespace gantry::plot
