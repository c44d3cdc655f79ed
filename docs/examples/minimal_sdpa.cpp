// The minimal SDPA kernel of minimal_sdpa.c in C++17, for the same ABI
// (native/include/sdpa_probe.h, which is extern "C" under a C++ compiler):
//
//   probe check --kernel docs/examples/minimal_sdpa.cpp
//
// A C++ kernel is compiled with $CXX (else the C++ driver beside the C compiler:
// g++ for gcc) and -std=c++17, linked through that driver, and exports
// sdpa_forward with C linkage. No exception may cross the ABI: a failed
// allocation becomes SDPA_UNSUPPORTED. Query heads are split over std::threads
// (n_threads of them; <= 0 means one per CPU).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "sdpa_probe.h"

namespace {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal
    const float f = std::ldexp(float(man), -24);
    return (h & 0x8000u) ? -f : f;
  }
  const uint32_t u = exp == 31 ? (sign | 0x7f800000u | (man << 13))
                               : (sign | ((exp + 112u) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float af;
    std::memcpy(&af, &a, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(af * 16777216.0f)));
  }
  return uint16_t(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// A tensor of the ABI seen as (batch, seq, head, dim) -> float.
struct View {
  const sdpa_tensor &t;

  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3];
  }

  float operator()(int64_t b, int64_t s, int64_t h, int64_t d) const {
    const int64_t off = offset(b, s, h, d);
    switch (t.dtype) {
      case SDPA_F32: return static_cast<const float *>(t.data)[off];
      case SDPA_F16: return f16_to_f32(static_cast<const uint16_t *>(t.data)[off]);
      case SDPA_BF16: return bf16_to_f32(static_cast<const uint16_t *>(t.data)[off]);
      default: {  // SDPA_I8, per-token asymmetric (zero_point NULL: symmetric)
        const int64_t qo = b * t.qstride[0] + s * t.qstride[1] + h * t.qstride[2];
        const int zp = t.zero_point ? t.zero_point[qo] : 0;
        return float(static_cast<const int8_t *>(t.data)[off] - zp) * t.scale[qo];
      }
    }
  }

  void store(int64_t b, int64_t s, int64_t h, int64_t d, float x) const {
    const int64_t off = offset(b, s, h, d);
    if (t.dtype == SDPA_F32) static_cast<float *>(t.data)[off] = x;
    else if (t.dtype == SDPA_F16) static_cast<uint16_t *>(t.data)[off] = f32_to_f16(x);
    else static_cast<uint16_t *>(t.data)[off] = f32_to_bf16(x);
  }
};

// Query heads [h0, h1) of every (batch, row): one row at a time, as minimal_sdpa.c.
void heads(const sdpa_args &a, int64_t h0, int64_t h1) {
  const View q{a.q}, k{a.k}, v{a.v}, out{a.out};
  const int64_t D = a.head_dim, group = a.n_heads / a.n_kv_heads;
  const float scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(float(D));
  std::vector<float> p(static_cast<size_t>(std::max<int64_t>(a.kv_len, 1)));
  std::vector<float> acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < a.batch; b++)
    for (int64_t i = 0; i < a.q_len; i++)
      for (int64_t h = h0; h < h1; h++) {
        const int64_t hk = h / group;
        int64_t n = a.kv_len;  // keys j < n are not hidden by the causal edge
        if (a.is_causal) n = std::min(n, a.start_pos + i + 1);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          float s = 0.0f;
          for (int64_t d = 0; d < D; d++) s += q(b, i, h, d) * k(b, j, hk, d);
          s *= scale;
          if (a.mask) s += a.mask[i * a.mask_row_stride + j];
          p[size_t(j)] = s;
          if (s > mx || std::isnan(s)) mx = s;  // a NaN sticks: the row is NaN, not unseen
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (mx != -INFINITY) {  // else: no visible key, the row stays zero
          float sum = 0.0f;
          for (int64_t j = 0; j < n; j++) {
            const float w = std::exp(p[size_t(j)] - mx);
            sum += w;
            for (int64_t d = 0; d < D; d++) acc[size_t(d)] += w * v(b, j, hk, d);
          }
          for (float &x : acc) x /= sum;
        }
        for (int64_t d = 0; d < D; d++) out.store(b, i, h, d, acc[size_t(d)]);
      }
}

}  // namespace

extern "C" int sdpa_forward(const sdpa_args *a) {
  const int st = sdpa_validate_args(a);
  if (st != SDPA_OK) return st;
  if (a->batch == 0 || a->q_len == 0) return SDPA_OK;
  try {
    int64_t n = a->n_threads > 0 ? a->n_threads : int64_t(std::thread::hardware_concurrency());
    n = std::clamp<int64_t>(n, 1, a->n_heads);
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < n; t++)
      pool.emplace_back(heads, std::cref(*a), a->n_heads * t / n, a->n_heads * (t + 1) / n);
    heads(*a, 0, a->n_heads / n);
    for (std::thread &th : pool) th.join();
  } catch (...) {  // std::bad_alloc, std::system_error from std::thread
    return SDPA_UNSUPPORTED;
  }
  return SDPA_OK;
}
