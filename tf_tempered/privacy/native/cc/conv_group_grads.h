// Copyright 2026 The tf_tempered Authors.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//      http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.
//
// What the two Conv2D per-microbatch kernel-gradient ops share
// (conv_kernel_grads.cc: norms and kept gradients; conv_clipped_sum.cc: norms and
// the clipped sum in one pass): the kernel gradient of a run of consecutive
// examples,
//
//     G[i, j, ci, co] = Σ_e Σ_{r, c} x_e[r·sh + i·dh - pt, c·sw + j·dw - pl, ci] · g_e[r, c, co]
//
// (zero outside the image), accumulated in registers. Every kernel row i reads
// kw·cin contiguous values per output pixel straight from a zero-padded copy of
// one example's image, so no patch tensor is made, and the products accumulate
// in registers (kRowTile kernel entries × 1–2 vectors of output channels).

#ifndef TF_TEMPERED_CONV_GROUP_GRADS_H_
#define TF_TEMPERED_CONV_GROUP_GRADS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "Eigen/Core"  // aligned_allocator
#include "conv_geometry.h"

namespace tf_tempered {
namespace conv_group {

#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#else
constexpr int kVectorBytes = 32;
#endif

template <typename T>
struct Vec {
  typedef T type __attribute__((vector_size(kVectorBytes)));
  static constexpr int kLanes = kVectorBytes / sizeof(T);
};

template <typename T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

// Kernel-row entries whose accumulators stay in registers (times NV vectors of
// output channels).
constexpr int kRowTile = 8;

// acc[t][v] (output channels c0 + v·L ...) += Σ_p src_p[t] · g_p[c0 + v·L ...]
// over positions p = (r, c): src_p = base + r·row_stride + c·col_stride.
template <typename T, int NV>
inline void Tile(const T* base, int64_t rows, int64_t cols, int64_t row_stride,
                 int64_t col_stride, const T* g, int64_t g_stride, T* acc, int64_t acc_stride) {
  using V = typename Vec<T>::type;
  constexpr int L = Vec<T>::kLanes;
  V a[kRowTile][NV];
#pragma GCC unroll 8
  for (int t = 0; t < kRowTile; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&a[t][v], acc + t * acc_stride + v * L, sizeof(V));
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = base + r * row_stride;
    const T* gp = g + r * cols * g_stride;
    for (int64_t c = 0; c < cols; ++c, src += col_stride, gp += g_stride) {
      V gv[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) std::memcpy(&gv[v], gp + v * L, sizeof(V));
#pragma GCC unroll 8
      for (int t = 0; t < kRowTile; ++t) {
        const T s = src[t];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) a[t][v] += s * gv[v];
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < kRowTile; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(acc + t * acc_stride + v * L, &a[t][v], sizeof(V));
}

// The kernel gradient of runs of examples of one x [B, H, W, cin], g [B, OH, OW, cout]
// pair: sizes fixed at construction, per-thread buffers in a Scratch.
template <typename T>
class GroupKernelGrads {
 public:
  static constexpr int64_t L = Vec<T>::kLanes;

  GroupKernelGrads(const ConvGeometry& geo, int64_t height, int64_t width, int64_t cin,
                   int64_t oh, int64_t ow, int64_t cout)
      : geo_(geo), height_(height), width_(width), cin_(cin), oh_(oh), ow_(ow), cout_(cout),
        span_(int64_t{geo.kw} * cin),  // one kernel row i: kw·cin values
        cout_pad_((cout + L - 1) / L * L),
        span_pad_((span_ + kRowTile - 1) / kRowTile * kRowTile),
        // Rows of each kernel row i's values for all output columns, contiguous:
        // the zero-padded image itself when dw == 1, else a [rows][ow][span] copy.
        src_rows_((oh - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1),
        src_cols_((ow - 1) * geo.sw + (geo.kw - 1) * geo.dw + 1),
        direct_(geo.dw == 1),
        row_stride_(direct_ ? src_cols_ * cin : ow * span_),
        col_stride_(direct_ ? geo.sw * cin : span_) {}

  int64_t span() const { return span_; }
  int64_t cout_pad() const { return cout_pad_; }
  int64_t span_pad() const { return span_pad_; }
  // Multiply-adds of one example's kernel rows [i0, i1) (the Shard cost).
  int64_t Cost(int64_t kernel_rows) const {
    return oh_ * ow_ * kernel_rows * span_pad_ * cout_pad_ * 2;
  }

  struct Scratch {
    AlignedVector<T> src, g_buf, acc;  // acc: [(i - i0)·span_pad + k][cout_pad]
  };

  Scratch NewScratch(int64_t kernel_rows) const {
    Scratch s;
    s.src.assign(src_rows_ * row_stride_ + span_pad_, T(0));  // slack for the last tile
    s.g_buf.assign(cout_ == cout_pad_ ? 0 : oh_ * ow_ * cout_pad_, T(0));
    s.acc.assign(kernel_rows * span_pad_ * cout_pad_, T(0));
    return s;
  }

  // s->acc = the kernel gradient of examples [e0, e1) for kernel rows [i0, i1); and,
  // if bias != nullptr, bias[0, cout) = Σ_e Σ_{r, c} g_e[r, c, :] (g read once for both).
  void Accumulate(const T* xp, const T* gp, int64_t e0, int64_t e1, int64_t i0, int64_t i1,
                  Scratch* s, T* bias) const {
    std::fill(s->acc.begin(), s->acc.end(), T(0));
    if (bias != nullptr) std::fill(bias, bias + cout_, T(0));
    for (int64_t e = e0; e < e1; ++e) {
      FillSource(xp + e * height_ * width_ * cin_, s->src.data());
      const T* ge = gp + e * oh_ * ow_ * cout_;
      int64_t g_stride = cout_;
      if (cout_ != cout_pad_) {
        for (int64_t q = 0; q < oh_ * ow_; ++q)
          std::copy(ge + q * cout_, ge + (q + 1) * cout_, s->g_buf.data() + q * cout_pad_);
        ge = s->g_buf.data();
        g_stride = cout_pad_;
      }
      if (bias != nullptr)
        for (int64_t q = 0; q < oh_ * ow_; ++q)
          for (int64_t o = 0; o < cout_; ++o) bias[o] += ge[q * g_stride + o];
      for (int64_t i = i0; i < i1; ++i) {
        const T* base = s->src.data() + i * geo_.dh * row_stride_;
        T* acc_i = s->acc.data() + (i - i0) * span_pad_ * cout_pad_;
        for (int64_t k0 = 0; k0 < span_pad_; k0 += kRowTile) {
          int64_t c0 = 0;
          for (; c0 + 2 * L <= cout_pad_; c0 += 2 * L)
            Tile<T, 2>(base + k0, oh_, ow_, geo_.sh * row_stride_, col_stride_, ge + c0,
                       g_stride, acc_i + k0 * cout_pad_ + c0, cout_pad_);
          for (; c0 < cout_pad_; c0 += L)
            Tile<T, 1>(base + k0, oh_, ow_, geo_.sh * row_stride_, col_stride_, ge + c0,
                       g_stride, acc_i + k0 * cout_pad_ + c0, cout_pad_);
        }
      }
    }
  }

  // Σ of the squares of s.acc's kernel rows [0, kernel_rows), by lanes (lanes past cout
  // hold zeros): a scalar running sum would be a chain of dependent adds, slower than the
  // products. If out != nullptr, also copies them to out ([kernel_rows·span][cout]).
  double SqNorm(const Scratch& s, int64_t kernel_rows, T* out) const {
    using V = typename Vec<T>::type;
    V lanes = {};
    for (int64_t i = 0; i < kernel_rows; ++i) {
      for (int64_t k = 0; k < span_; ++k) {
        const T* row = s.acc.data() + (i * span_pad_ + k) * cout_pad_;
        for (int64_t o = 0; o < cout_pad_; o += L) {
          V v;
          std::memcpy(&v, row + o, sizeof(V));
          lanes += v * v;
        }
        if (out != nullptr) std::copy(row, row + cout_, out + (i * span_ + k) * cout_);
      }
    }
    double total = 0;
    for (int l = 0; l < L; ++l) total += lanes[l];
    return total;
  }

 private:
  // The example's zero-padded image rows [src_rows_][src_cols_][cin_] (direct_), or
  // for dilated columns each padded row's kernel-row values per output column.
  void FillSource(const T* xe, T* src) const {
    for (int64_t r = 0; r < src_rows_; ++r) {
      const int64_t ih = r - geo_.pt;
      const bool row_in = ih >= 0 && ih < height_;
      if (direct_) {
        // [zeros | the image row | zeros], in at most three runs.
        T* out = src + r * src_cols_ * cin_;
        T* const out_end = out + src_cols_ * cin_;
        if (row_in) {
          const int64_t first = std::min<int64_t>(geo_.pl, src_cols_);
          const int64_t count = std::max<int64_t>(0, std::min<int64_t>(width_, src_cols_ - geo_.pl));
          std::fill(out, out + first * cin_, T(0));
          const T* in = xe + ih * width_ * cin_;
          std::copy(in, in + count * cin_, out + first * cin_);
          out += (first + count) * cin_;
        }
        std::fill(out, out_end, T(0));
      } else {
        T* out = src + r * ow_ * span_;
        for (int64_t c = 0; c < ow_; ++c) {
          for (int64_t j = 0; j < geo_.kw; ++j) {
            const int64_t iw = c * geo_.sw + j * geo_.dw - geo_.pl;
            T* to = out + c * span_ + j * cin_;
            if (row_in && iw >= 0 && iw < width_) {
              std::copy(xe + (ih * width_ + iw) * cin_, xe + (ih * width_ + iw + 1) * cin_, to);
            } else {
              std::fill(to, to + cin_, T(0));
            }
          }
        }
      }
    }
  }

  const ConvGeometry geo_;
  const int64_t height_, width_, cin_, oh_, ow_, cout_, span_, cout_pad_, span_pad_, src_rows_,
      src_cols_;
  const bool direct_;
  const int64_t row_stride_, col_stride_;
};

}  // namespace conv_group
}  // namespace tf_tempered

#endif  // TF_TEMPERED_CONV_GROUP_GRADS_H_
