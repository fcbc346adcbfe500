#include "engine/core/cpu/vocab_parallel_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "engine/core/comm/communicator.h"
#include "engine/core/cpu/thread_pool.h"

namespace gantry {
namespace {

void run(ThreadPool* pool, size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (pool) {
    pool->parallel_for(n, fn);
  } else if (n > 0) {
    fn(0, n);
  }
}

bool owned(int32_t token, int v0, int Vl) {
  return token >= v0 && token < v0 + Vl;
}

}  // namespace

void vocab_parallel_encoder_forward(float* out, const int32_t* inp, const float* wte, int v0, int Vl, int N,
                                    int C) {
  for (int n = 0; n < N; ++n) {
    float* o = out + static_cast<size_t>(n) * C;
    if (owned(inp[n], v0, Vl)) {
      std::memcpy(o, wte + static_cast<size_t>(inp[n] - v0) * C, sizeof(float) * C);
    } else {
      std::memset(o, 0, sizeof(float) * C);
    }
  }
}

void vocab_parallel_add_positions(float* out, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

void vocab_parallel_encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int v0,
                                     int Vl, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int32_t token = inp[b * T + t];
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      if (owned(token, v0, Vl)) {
        float* w = dwte + static_cast<size_t>(token - v0) * C;
        for (int c = 0; c < C; ++c) w[c] += d[c];
      }
      float* p = dwpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) p[c] += d[c];
    }
  }
}

Status vocab_parallel_crossentropy_forward(Communicator* tp, std::chrono::milliseconds timeout,
                                           ThreadPool* pool, float* probs, float* losses,
                                           const int32_t* targets, int v0, int N, int Vl, double* comm_s) {
  auto gather = [&](const float* in, float* out, size_t count) {
    const auto t0 = std::chrono::steady_clock::now();
    Status st = tp->all_gather(in, out, count, timeout);
    *comm_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  };
  const int ranks = tp->size();
  const size_t rows = static_cast<size_t>(N);
  // 1. The row maxima: this rank's, then every rank's (all_gather's `in` is this rank's block of the whole).
  std::vector<float> mine(rows * 3), all(rows * 3 * ranks);
  run(pool, rows, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* l = probs + n * Vl;
      float m = -INFINITY;
      for (int v = 0; v < Vl; ++v) m = std::max(m, l[v]);
      mine[n] = m;
    }
  });
  if (Status st = gather(mine.data(), all.data(), rows * ranks); !st.ok()) return st;
  std::vector<float> maxv(rows, -INFINITY);
  for (int r = 0; r < ranks; ++r) {
    for (size_t n = 0; n < rows; ++n) maxv[n] = std::max(maxv[n], all[r * rows + n]);
  }
  // 2. Each rank's sum of exp(l − max) in double, sent as a (hi, lo) float pair, and the target's logit
  // from its owner (0 from the others).
  run(pool, rows, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* l = probs + n * Vl;
      float* p = probs + n * Vl;
      const float target_logit = owned(targets[n], v0, Vl) ? l[targets[n] - v0] : 0.0f;
      double sum = 0;
      for (int v = 0; v < Vl; ++v) {
        p[v] = std::exp(l[v] - maxv[n]);
        sum += p[v];
      }
      const float hi = static_cast<float>(sum);
      mine[3 * n] = hi;
      mine[3 * n + 1] = static_cast<float>(sum - static_cast<double>(hi));
      mine[3 * n + 2] = target_logit;
    }
  });
  if (Status st = gather(mine.data(), all.data(), rows * 3 * ranks); !st.ok()) return st;
  run(pool, rows, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      double sum = 0, target_logit = 0;
      for (int r = 0; r < ranks; ++r) {
        const float* v = all.data() + (static_cast<size_t>(r) * rows + n) * 3;
        sum += static_cast<double>(v[0]) + static_cast<double>(v[1]);
        target_logit += v[2];
      }
      const float inv = static_cast<float>(1.0 / sum);
      float* p = probs + n * Vl;
      for (int v = 0; v < Vl; ++v) p[v] *= inv;
      // log-sum-exp form, as softmax_crossentropy_forward: exact even where the target's probability
      // underflows.
      losses[n] = static_cast<float>(std::log(sum) - (target_logit - maxv[n]));
    }
  });
  return {};
}

void vocab_parallel_crossentropy_backward(ThreadPool* pool, float* dlogits, const float* probs,
                                          const int32_t* targets, float dloss, int v0, int N, int Vl) {
  run(pool, static_cast<size_t>(N), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* p = probs + n * Vl;
      float* d = dlogits + n * Vl;
      for (int v = 0; v < Vl; ++v) d[v] = p[v] * dloss;
      if (owned(targets[n], v0, Vl)) d[targets[n] - v0] -= dloss;
    }
  });
}

}  // namespace gantry
