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
// TfTemperedConv2DGroupKernelGrads: for NHWC input x [B, H, W, cin] and output
// gradient g [B, OH, OW, cout] of a Conv2D, the kernel gradient of each group m
// of B / num_groups consecutive examples,
//
//     G_m[i, j, ci, co] = Σ_{e ∈ m} Σ_{r, c} x_e[r·sh + i·dh - pt, c·sw + j·dw - pl, ci] · g_e[r, c, co]
//
// (zero outside the image), its squared L2 norm ‖G_m‖², G_m itself when
// output_grads is set (else an empty [0, kh·kw·cin·cout] tensor), and the bias's
// gradient Σ_{e ∈ m} Σ_{r, c} g_e[r, c, co] when bias_grads is set (else [0, cout]):
// g is read once for both (a separate reduction over g's pixels took 0.1-0.3 ms of
// kernel time in the MNIST CNN's profiled step, though the whole step gained < 1%).
//
// TF's CPU ops have no per-example filter gradient; emulating one (a depthwise
// backprop with the batch folded into channels, or input patches and a batched
// matmul) costs several times the batch's ordinary filter gradient. Here every
// kernel row i reads kw·cin contiguous values per output pixel straight from a
// zero-padded copy of one example's image, so no patch tensor is made, and the
// products accumulate in registers (kRowTile kernel entries × 1–2 vectors of
// output channels).

#include <algorithm>
#include <cstring>
#include <vector>

#include "Eigen/Core"  // aligned_allocator
#include "conv_geometry.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_tempered {
namespace {
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

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

}  // namespace

REGISTER_OP("TfTemperedConv2DGroupKernelGrads")
    .Input("input: T")
    .Input("out_grad: T")
    .Input("num_groups: int32")
    .Output("sq_norms: T")
    .Output("grads: T")
    .Output("bias_sums: T")
    .Attr("T: {float, double}")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("pads: list(int)")
    .Attr("output_grads: bool")
    .Attr("bias_grads: bool = false")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      c->set_output(2, c->Matrix(c->UnknownDim(), c->UnknownDim()));
      return absl::OkStatus();
    });

template <typename T>
class Conv2DGroupKernelGradsOp : public OpKernel {
 public:
  explicit Conv2DGroupKernelGradsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ConvGeometry::Read(ctx, &geo_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_grads", &output_grads_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bias_grads", &bias_grads_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckNhwcPair(x, g));
    const int64_t batch = x.dim_size(0), height = x.dim_size(1), width = x.dim_size(2),
                  cin = x.dim_size(3);
    const int64_t oh = g.dim_size(1), ow = g.dim_size(2), cout = g.dim_size(3);
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ctx->input(2).shape()),
                absl::InvalidArgumentError("num_groups must be a scalar"));
    const int32_t num_groups = ctx->input(2).scalar<int32_t>()();
    OP_REQUIRES(ctx, num_groups > 0 && batch % num_groups == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "batch size ", batch, " is not a multiple of num_groups ", num_groups)));
    const int64_t per_group = batch / num_groups;
    const int64_t span = int64_t{geo_.kw} * cin;  // one kernel row i: kw·cin values
    Tensor* sq = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_groups}), &sq));
    Tensor* grads = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        1, TensorShape({output_grads_ ? num_groups : 0, geo_.kh * span * cout}), &grads));
    Tensor* bias = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
        2, TensorShape({bias_grads_ ? num_groups : 0, cout}), &bias));
    if (batch == 0 || oh == 0 || ow == 0) {
      sq->flat<T>().setZero();
      grads->flat<T>().setZero();
      bias->flat<T>().setZero();
      return;
    }

    constexpr int64_t L = Vec<T>::kLanes;
    const int64_t cout_pad = (cout + L - 1) / L * L;
    const int64_t span_pad = (span + kRowTile - 1) / kRowTile * kRowTile;
    // Rows of each kernel row i's values for all output columns, contiguous:
    // the zero-padded image itself when dw == 1, else a [rows][ow][span] copy.
    const int64_t src_rows = (oh - 1) * geo_.sh + (geo_.kh - 1) * geo_.dh + 1;
    const int64_t src_cols = (ow - 1) * geo_.sw + (geo_.kw - 1) * geo_.dw + 1;
    const bool direct = geo_.dw == 1;
    const int64_t row_stride = direct ? src_cols * cin : ow * span;
    const int64_t col_stride = direct ? geo_.sw * cin : span;
    const int64_t src_size = src_rows * row_stride + span_pad;  // slack for the last tile
    // Units of work: (group, block of kernel rows i), for parallelism with few groups.
    const int64_t row_blocks = std::min<int64_t>(geo_.kh, std::max<int64_t>(
        1, 2 * ctx->device()->tensorflow_cpu_worker_threads()->num_threads / num_groups));
    const int64_t rows_per_block = (geo_.kh + row_blocks - 1) / row_blocks;
    const int64_t num_blocks = (geo_.kh + rows_per_block - 1) / rows_per_block;
    std::vector<double> partial(num_groups * num_blocks, 0.0);
    const T* xp = x.flat<T>().data();
    const T* gp = g.flat<T>().data();
    T* grads_p = output_grads_ ? grads->flat<T>().data() : nullptr;
    T* bias_p = bias_grads_ ? bias->flat<T>().data() : nullptr;

    auto work = [&](int64_t begin, int64_t end) {
      AlignedVector<T> src(src_size, T(0));
      AlignedVector<T> g_buf(cout == cout_pad ? 0 : oh * ow * cout_pad, T(0));
      AlignedVector<T> acc(rows_per_block * span_pad * cout_pad);
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t group = unit / num_blocks, blk = unit % num_blocks;
        const int64_t i0 = blk * rows_per_block, i1 = std::min<int64_t>(geo_.kh, i0 + rows_per_block);
        std::fill(acc.begin(), acc.end(), T(0));
        // The group's bias gradient, by the unit of its first kernel rows only.
        T* bias_m = bias_p != nullptr && blk == 0 ? bias_p + group * cout : nullptr;
        if (bias_m != nullptr) std::fill(bias_m, bias_m + cout, T(0));
        for (int64_t e = group * per_group; e < (group + 1) * per_group; ++e) {
          FillSource(xp + e * height * width * cin, height, width, cin, src_rows, src_cols,
                     direct, ow, span, src.data());
          const T* ge = gp + e * oh * ow * cout;
          int64_t g_stride = cout;
          if (cout != cout_pad) {
            for (int64_t q = 0; q < oh * ow; ++q)
              std::copy(ge + q * cout, ge + (q + 1) * cout, g_buf.data() + q * cout_pad);
            ge = g_buf.data();
            g_stride = cout_pad;
          }
          if (bias_m != nullptr)
            for (int64_t q = 0; q < oh * ow; ++q)
              for (int64_t o = 0; o < cout; ++o) bias_m[o] += ge[q * g_stride + o];
          for (int64_t i = i0; i < i1; ++i) {
            const T* base = src.data() + i * geo_.dh * row_stride;
            T* acc_i = acc.data() + (i - i0) * span_pad * cout_pad;
            for (int64_t k0 = 0; k0 < span_pad; k0 += kRowTile) {
              int64_t c0 = 0;
              for (; c0 + 2 * L <= cout_pad; c0 += 2 * L)
                Tile<T, 2>(base + k0, oh, ow, geo_.sh * row_stride, col_stride, ge + c0, g_stride,
                           acc_i + k0 * cout_pad + c0, cout_pad);
              for (; c0 < cout_pad; c0 += L)
                Tile<T, 1>(base + k0, oh, ow, geo_.sh * row_stride, col_stride, ge + c0, g_stride,
                           acc_i + k0 * cout_pad + c0, cout_pad);
            }
          }
        }
        // Lane-wise sums (lanes past cout hold zeros): a scalar running sum
        // would be a chain of dependent adds, slower than the products above.
        using V = typename Vec<T>::type;
        V lanes = {};
        for (int64_t i = i0; i < i1; ++i) {
          for (int64_t k = 0; k < span; ++k) {
            const T* row = acc.data() + ((i - i0) * span_pad + k) * cout_pad;
            for (int64_t o = 0; o < cout_pad; o += L) {
              V v;
              std::memcpy(&v, row + o, sizeof(V));
              lanes += v * v;
            }
            if (grads_p != nullptr)
              std::copy(row, row + cout, grads_p + ((group * geo_.kh + i) * span + k) * cout);
          }
        }
        double total = 0;
        for (int l = 0; l < L; ++l) total += lanes[l];
        partial[unit] = total;
      }
    };
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = per_group * oh * ow * rows_per_block * span_pad * cout_pad * 2;
    ::tensorflow::Shard(threads->num_threads, threads->workers, num_groups * num_blocks, cost, work);
    auto sq_flat = sq->flat<T>();
    for (int64_t m = 0; m < num_groups; ++m) {
      double s = 0;
      for (int64_t b = 0; b < num_blocks; ++b) s += partial[m * num_blocks + b];
      sq_flat(m) = static_cast<T>(s);
    }
  }

 private:
  // The example's zero-padded image rows [src_rows][src_cols][cin] (direct), or
  // for dilated columns each padded row's kernel-row values per output column.
  void FillSource(const T* xe, int64_t height, int64_t width, int64_t cin, int64_t src_rows,
                  int64_t src_cols, bool direct, int64_t ow, int64_t span, T* src) const {
    for (int64_t r = 0; r < src_rows; ++r) {
      const int64_t ih = r - geo_.pt;
      const bool row_in = ih >= 0 && ih < height;
      if (direct) {
        // [zeros | the image row | zeros], in at most three runs.
        T* out = src + r * src_cols * cin;
        T* const out_end = out + src_cols * cin;
        if (row_in) {
          const int64_t first = std::min<int64_t>(geo_.pl, src_cols);
          const int64_t count = std::max<int64_t>(0, std::min<int64_t>(width, src_cols - geo_.pl));
          std::fill(out, out + first * cin, T(0));
          const T* in = xe + ih * width * cin;
          std::copy(in, in + count * cin, out + first * cin);
          out += (first + count) * cin;
        }
        std::fill(out, out_end, T(0));
      } else {
        T* out = src + r * ow * span;
        for (int64_t c = 0; c < ow; ++c) {
          for (int64_t j = 0; j < geo_.kw; ++j) {
            const int64_t iw = c * geo_.sw + j * geo_.dw - geo_.pl;
            T* to = out + c * span + j * cin;
            if (row_in && iw >= 0 && iw < width) {
              std::copy(xe + (ih * width + iw) * cin, xe + (ih * width + iw + 1) * cin, to);
            } else {
              std::fill(to, to + cin, T(0));
            }
          }
        }
      }
    }
  }

  ConvGeometry geo_;
  bool output_grads_;
  bool bias_grads_;
};

#define TF_TEMPERED_REGISTER(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("TfTemperedConv2DGroupKernelGrads")                   \
                              .Device(::tensorflow::DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                                \
                              .HostMemory("num_groups"),                             \
                          Conv2DGroupKernelGradsOp<T>);
TF_TEMPERED_REGISTER(float);
TF_TEMPERED_REGISTER(double);
#undef TF_TEMPERED_REGISTER

}  // namespace tf_tempered
