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
// TfTemperedDepthwiseKernelGrads: for NHWC input x [B, H, W, cin] and output
// gradient g [B, OH, OW, cin·dm] of a depthwise convolution (depth multiplier
// dm), each example's kernel gradient, as [kh·kw, B, cin·dm]:
//
//     G[i·kw + j, e, k] = Σ_{r, c} x_e[r·sh + i·dh - pt, c·sw + j·dw - pl, k / dm] · g_e[r, c, k]
//
// (zero outside the image). Each channel k only meets its own input channel, so
// per output pixel and kernel entry the work is one elementwise product of
// cin·dm contiguous values; the image is copied once per example, zero-padded
// and with each channel repeated dm times, and the kh·kw·cin·dm sums stay in
// one small buffer. TF's CPU ops have no per-example depthwise filter gradient:
// folding the batch into channels makes oneDNN's depthwise backprop-filter
// several times slower than the batch's own (docs/benchmarks.md).

#include <algorithm>
#include <vector>

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

// acc[k] += src[k] · g[k] for k < n: the loop the compiler vectorizes.
template <typename T>
inline void MultiplyAdd(const T* __restrict src, const T* __restrict g, T* __restrict acc,
                        int64_t n) {
  for (int64_t k = 0; k < n; ++k) acc[k] += src[k] * g[k];
}

}  // namespace

REGISTER_OP("TfTemperedDepthwiseKernelGrads")
    .Input("input: T")
    .Input("out_grad: T")
    .Output("grads: T")
    .Attr("T: {float, double}")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("pads: list(int)")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      std::vector<int32_t> k;
      TF_RETURN_IF_ERROR(c->GetAttr("kernel_size", &k));
      if (k.size() != 2) return absl::InvalidArgumentError("kernel_size needs 2 values");
      c->set_output(0, c->MakeShape({c->MakeDim(int64_t{k[0]} * k[1]), c->Dim(c->input(1), 0),
                                     c->Dim(c->input(1), 3)}));
      return absl::OkStatus();
    });

template <typename T>
class DepthwiseKernelGradsOp : public OpKernel {
 public:
  explicit DepthwiseKernelGradsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ConvGeometry::Read(ctx, &geo_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckNhwcPair(x, g));
    const int64_t batch = x.dim_size(0), height = x.dim_size(1), width = x.dim_size(2),
                  cin = x.dim_size(3);
    const int64_t oh = g.dim_size(1), ow = g.dim_size(2), channels = g.dim_size(3);
    OP_REQUIRES(ctx, cin > 0 && channels % cin == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "out_grad's ", channels, " channels are not a multiple of the input's ", cin)));
    const int64_t dm = channels / cin, taps = int64_t{geo_.kh} * geo_.kw;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({taps, batch, channels}), &out));
    if (out->NumElements() == 0) return;
    // The zero-padded image the output pixels read: rows and columns up to the last tap.
    const int64_t src_rows = (oh - 1) * geo_.sh + (geo_.kh - 1) * geo_.dh + 1;
    const int64_t src_cols = (ow - 1) * geo_.sw + (geo_.kw - 1) * geo_.dw + 1;
    const T* xp = x.flat<T>().data();
    const T* gp = g.flat<T>().data();
    T* outp = out->flat<T>().data();

    auto work = [&](int64_t begin, int64_t end) {
      std::vector<T> src(src_rows * src_cols * channels);
      std::vector<T> acc(taps * channels);
      for (int64_t e = begin; e < end; ++e) {
        FillSource(xp + e * height * width * cin, height, width, cin, dm, src_rows, src_cols,
                   src.data());
        std::fill(acc.begin(), acc.end(), T(0));
        const T* ge = gp + e * oh * ow * channels;
        for (int64_t r = 0; r < oh; ++r) {
          for (int64_t c = 0; c < ow; ++c) {
            const T* g_rc = ge + (r * ow + c) * channels;
            for (int64_t i = 0; i < geo_.kh; ++i) {
              const T* row =
                  src.data() + ((r * geo_.sh + i * geo_.dh) * src_cols + c * geo_.sw) * channels;
              T* acc_i = acc.data() + i * geo_.kw * channels;
              for (int64_t j = 0; j < geo_.kw; ++j)
                MultiplyAdd(row + j * geo_.dw * channels, g_rc, acc_i + j * channels, channels);
            }
          }
        }
        for (int64_t t = 0; t < taps; ++t)
          std::copy(acc.data() + t * channels, acc.data() + (t + 1) * channels,
                    outp + (t * batch + e) * channels);
      }
    };
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = oh * ow * taps * channels * 2 + src_rows * src_cols * channels;
    ::tensorflow::Shard(threads->num_threads, threads->workers, batch, cost, work);
  }

 private:
  // One example's image, zero-padded to [src_rows][src_cols], each input channel
  // repeated dm times (the out_grad's channel order: k = ci·dm + m).
  void FillSource(const T* xe, int64_t height, int64_t width, int64_t cin, int64_t dm,
                  int64_t src_rows, int64_t src_cols, T* src) const {
    const int64_t channels = cin * dm;
    std::fill(src, src + src_rows * src_cols * channels, T(0));
    for (int64_t r = 0; r < src_rows; ++r) {
      const int64_t ih = r - geo_.pt;
      if (ih < 0 || ih >= height) continue;
      for (int64_t iw = 0; iw < width; ++iw) {
        const int64_t col = iw + geo_.pl;
        if (col >= src_cols) break;
        const T* in = xe + (ih * width + iw) * cin;
        T* to = src + (r * src_cols + col) * channels;
        if (dm == 1) {
          std::copy(in, in + cin, to);
        } else {
          for (int64_t ci = 0; ci < cin; ++ci) std::fill(to + ci * dm, to + (ci + 1) * dm, in[ci]);
        }
      }
    }
  }

  ConvGeometry geo_;
};

#define TF_TEMPERED_REGISTER(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("TfTemperedDepthwiseKernelGrads")                     \
                              .Device(::tensorflow::DEVICE_CPU)                      \
                              .TypeConstraint<T>("T"),                               \
                          DepthwiseKernelGradsOp<T>);
TF_TEMPERED_REGISTER(float);
TF_TEMPERED_REGISTER(double);
#undef TF_TEMPERED_REGISTER

}  // namespace tf_tempered
