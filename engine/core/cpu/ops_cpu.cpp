#include "engine/core/cpu/ops_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

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

// Eight independent partial sums: the compiler vectorises them without reassociating anything, so the
// result is the same on every run.
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                     int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      float* o = out + (static_cast<size_t>(b) * T + t) * C;
      const float* e = wte + static_cast<size_t>(inp[b * T + t]) * C;
      const float* p = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
      axpy(dwte + static_cast<size_t>(inp[b * T + t]) * C, 1.0f, d, C);
      axpy(dwpe + static_cast<size_t>(t) * C, 1.0f, d, C);
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C) {
  constexpr double kEps = 1e-5;
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const float s = static_cast<float>(1.0 / std::sqrt(v + kEps));
    const float mf = static_cast<float>(m);
    float* o = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - mf) * s * w[c] + b[c];
    mean[n] = mf;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const float* d = dout + static_cast<size_t>(n) * C;
    const float* x = inp + static_cast<size_t>(n) * C;
    float* dx = dinp + static_cast<size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = w[c] * d[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    const float a = static_cast<float>(dnorm_mean / C);
    const float bterm = static_cast<float>(dnorm_norm_mean / C);
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * s;
      const float dnorm = w[c] * d[c];
      db[c] += d[c];
      dw[c] += norm * d[c];
      dx[c] += (dnorm - a - norm * bterm) * s;
    }
  }
}

void matmul_forward(ThreadPool* pool, float* out, const float* inp, const float* w, const float* bias, int N,
                    int C, int OC) {
  run(pool, static_cast<size_t>(N), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* x = inp + n * C;
      float* o = out + n * OC;
      for (int oc = 0; oc < OC; ++oc) {
        o[oc] = (bias ? bias[oc] : 0.0f) + dot(x, w + static_cast<size_t>(oc) * C, C);
      }
    }
  });
}

void matmul_backward(ThreadPool* pool, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                     const float* w, int N, int C, int OC) {
  // Either half may be left out (a pipeline's tied classifier splits them over two stages); each output
  // element is computed the same way whichever halves run.
  if (dinp != nullptr) {
    run(pool, static_cast<size_t>(N), [&](size_t begin, size_t end) {
      for (size_t n = begin; n < end; ++n) {
        const float* d = dout + n * OC;
        float* dx = dinp + n * C;
        for (int oc = 0; oc < OC; ++oc) axpy(dx, d[oc], w + static_cast<size_t>(oc) * C, C);
      }
    });
  }
  if (dw == nullptr) return;
  run(pool, static_cast<size_t>(OC), [&](size_t begin, size_t end) {
    for (size_t oc = begin; oc < end; ++oc) {
      float* dwrow = dw + oc * C;
      float dbias = 0;
      for (int n = 0; n < N; ++n) {
        const float g = dout[static_cast<size_t>(n) * OC + oc];
        dbias += g;
        axpy(dwrow, g, inp + static_cast<size_t>(n) * C, C);
      }
      if (db) db[oc] += dbias;
    }
  });
}

void attention_forward(ThreadPool* pool, float* out, float* att, const float* qkv, int B, int T, int C,
                       int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
  run(pool, static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const float* base = qkv + b * T * C3;
      for (int t = 0; t < T; ++t) {
        const float* q = base + t * C3 + h * hs;
        float* a = att + (bh * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = dot(q, base + t2 * C3 + C + h * hs, hs) * scale;
          maxv = std::max(maxv, a[t2]);
        }
        float sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = std::exp(a[t2] - maxv);
          sum += a[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) a[t2] = 0;
        float* o = out + (b * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) axpy(o, a[t2], base + t2 * C3 + 2 * C + h * hs, hs);
      }
    }
  });
}

void attention_backward(ThreadPool* pool, float* dqkv, const float* dout, const float* qkv, const float* att,
                        int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
  run(pool, static_cast<size_t>(B) * NH, [&](size_t begin, size_t end) {
    std::vector<float> datt(T), dpre(T);
    for (size_t bh = begin; bh < end; ++bh) {
      const size_t b = bh / NH, h = bh % NH;
      const float* base = qkv + b * T * C3;
      float* dbase = dqkv + b * T * C3;
      for (int t = 0; t < T; ++t) {
        const float* a = att + (bh * T + t) * T;
        const float* d = dout + (b * T + t) * C + h * hs;
        double weighted = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          datt[t2] = dot(d, base + t2 * C3 + 2 * C + h * hs, hs);
          axpy(dbase + t2 * C3 + 2 * C + h * hs, a[t2], d, hs);  // dv
          weighted += static_cast<double>(a[t2]) * datt[t2];
        }
        const float wsum = static_cast<float>(weighted);
        const float* q = base + t * C3 + h * hs;
        float* dq = dbase + t * C3 + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {
          dpre[t2] = a[t2] * (datt[t2] - wsum) * scale;
          axpy(dq, dpre[t2], base + t2 * C3 + C + h * hs, hs);
          axpy(dbase + t2 * C3 + C + h * hs, dpre[t2], q, hs);  // dk
        }
      }
    }
  });
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + 0.044715f * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = local * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void softmax_crossentropy_forward(ThreadPool* pool, float* probs, float* losses, const float* logits,
                                  const int32_t* targets, int N, int V) {
  run(pool, static_cast<size_t>(N), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* l = logits + n * V;
      float* p = probs + n * V;
      const float target_logit = l[targets[n]];  // read before p overwrites l when they alias
      float maxv = -INFINITY;
      for (int v = 0; v < V; ++v) maxv = std::max(maxv, l[v]);
      double sum = 0;
      for (int v = 0; v < V; ++v) {
        p[v] = std::exp(l[v] - maxv);
        sum += p[v];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int v = 0; v < V; ++v) p[v] *= inv;
      // log-sum-exp form: exact even where the target's probability underflows.
      losses[n] = static_cast<float>(std::log(sum) - (static_cast<double>(target_logit) - maxv));
    }
  });
}

void softmax_crossentropy_backward(ThreadPool* pool, float* dlogits, const float* probs,
                                   const int32_t* targets, float dloss, int N, int V) {
  run(pool, static_cast<size_t>(N), [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* p = probs + n * V;
      float* d = dlogits + n * V;
      for (int v = 0; v < V; ++v) d[v] = p[v] * dloss;
      d[targets[n]] -= dloss;
    }
  });
}

}  // namespace gantry
