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
// TfTemperedConv2DClippedKernelSum: a Conv2D's per-microbatch norms and its part of
// the clipped sum in one pass, for the layer whose clip factors are the last to be
// known. Given the squared norms S_m of every OTHER layer's gradients of microbatch m
// (other_sq_norms, float32, summed as the engine sums them), for each group m of
// B / num_groups consecutive examples:
//
//     n_m = ‖G_m‖² + ‖b_m‖²                      (sq_norms; b_m the bias's gradient)
//     c_m = C / max(√(S_m + n_m), C), 0 if not finite   (scale, float32 as the engine)
//     Σ_m c_m·G_m, Σ_m c_m·b_m                    (kernel_sum, bias_sum)
//
// with G_m as in conv_group_grads.h, held only while its group is summed. Without it
// the step runs this layer's norms (the same products) and then, once the clip factors
// are known, TF's backprop-filter op over c·g: a second pass of the same size. The
// engine uses `scale` as every layer's clip factors, so all layers are clipped by the
// same c_m. Groups are summed in a fixed number of consecutive partitions, each in
// order, and the partitions in order: the same result at every run on one machine.

#include <algorithm>
#include <cmath>
#include <vector>

#include "conv_geometry.h"
#include "conv_group_grads.h"
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
}  // namespace

REGISTER_OP("TfTemperedConv2DClippedKernelSum")
    .Input("input: T")
    .Input("out_grad: T")
    .Input("num_groups: int32")
    .Input("other_sq_norms: float")
    .Input("l2_norm_clip: float")
    .Output("sq_norms: T")
    .Output("scale: float")
    .Output("kernel_sum: T")
    .Output("bias_sum: T")
    .Attr("T: {float, double}")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("pads: list(int)")
    .Attr("bias_grads: bool = false")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      c->set_output(2, c->Vector(c->UnknownDim()));
      c->set_output(3, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

template <typename T>
class Conv2DClippedKernelSumOp : public OpKernel {
 public:
  explicit Conv2DClippedKernelSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ConvGeometry::Read(ctx, &geo_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bias_grads", &bias_grads_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& g = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckNhwcPair(x, g));
    const int64_t batch = x.dim_size(0), cout = g.dim_size(3);
    int32_t num_groups = 0;
    OP_REQUIRES_OK(ctx, ReadNumGroups(ctx, batch, /*allow_empty=*/true, &num_groups));
    const Tensor& other = ctx->input(3);
    OP_REQUIRES(ctx, other.dims() == 1 && other.dim_size(0) == num_groups,
                absl::InvalidArgumentError(absl::StrCat(
                    "other_sq_norms must be [num_groups] = [", num_groups, "]")));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(ctx->input(4).shape()),
                absl::InvalidArgumentError("l2_norm_clip must be a scalar"));
    const float clip = ctx->input(4).scalar<float>()();
    const int64_t per_group = num_groups == 0 ? 0 : batch / num_groups;
    const conv_group::GroupKernelGrads<T> grads_of(geo_, x.dim_size(1), x.dim_size(2),
                                                   x.dim_size(3), g.dim_size(1), g.dim_size(2),
                                                   cout);
    const int64_t span = grads_of.span(), kernel_size = geo_.kh * span * cout;
    Tensor *sq = nullptr, *scale = nullptr, *kernel_sum = nullptr, *bias_sum = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_groups}), &sq));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_groups}), &scale));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({kernel_size}), &kernel_sum));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({bias_grads_ ? cout : 0}), &bias_sum));
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t parts = std::min<int64_t>(num_groups, 2 * threads->num_threads);
    const int64_t bias_size = bias_grads_ ? cout : 0;
    // Partition p's sums: [kernel_size] then [bias_size].
    std::vector<T> part_sums(std::max<int64_t>(parts, 1) * (kernel_size + bias_size), T(0));
    const T* xp = x.flat<T>().data();
    const T* gp = g.flat<T>().data();
    const float* other_p = other.flat<float>().data();
    T* sq_p = sq->flat<T>().data();
    float* scale_p = scale->flat<float>().data();
    const bool empty = g.dim_size(1) == 0 || g.dim_size(2) == 0;

    auto work = [&](int64_t begin, int64_t end) {
      auto scratch = grads_of.NewScratch(geo_.kh);
      std::vector<T> bias(cout, T(0));
      for (int64_t p = begin; p < end; ++p) {
        T* sums = part_sums.data() + p * (kernel_size + bias_size);
        for (int64_t m = p * num_groups / parts; m < (p + 1) * num_groups / parts; ++m) {
          double own = 0;
          if (!empty) {
            grads_of.Accumulate(xp, gp, m * per_group, (m + 1) * per_group, 0, geo_.kh,
                                &scratch, bias_grads_ ? bias.data() : nullptr);
            own = grads_of.SqNorm(scratch, geo_.kh, nullptr);
            for (int64_t o = 0; o < bias_size; ++o) own += double(bias[o]) * double(bias[o]);
          }
          sq_p[m] = static_cast<T>(own);
          // As the engine's clip_factors: the float32 sum, root and quotient.
          const float norm = std::sqrt(other_p[m] + static_cast<float>(sq_p[m]));
          const float c = std::isfinite(norm) ? clip / std::max(norm, clip) : 0.0f;
          scale_p[m] = c;
          if (c == 0.0f || empty) continue;  // 0·inf would be NaN: skipped, not added
          const T ct = static_cast<T>(c);
          for (int64_t i = 0; i < geo_.kh; ++i) {
            for (int64_t k = 0; k < span; ++k) {
              const T* row = scratch.acc.data() + (i * grads_of.span_pad() + k) * grads_of.cout_pad();
              T* to = sums + (i * span + k) * cout;
              for (int64_t o = 0; o < cout; ++o) to[o] += ct * row[o];
            }
          }
          for (int64_t o = 0; o < bias_size; ++o) sums[kernel_size + o] += ct * bias[o];
        }
      }
    };
    if (parts > 0) {
      ::tensorflow::Shard(threads->num_threads, threads->workers, parts,
                          num_groups / parts * per_group * grads_of.Cost(geo_.kh), work);
    }
    T* kernel_out = kernel_sum->flat<T>().data();
    T* bias_out = bias_sum->flat<T>().data();
    std::fill(kernel_out, kernel_out + kernel_size, T(0));
    std::fill(bias_out, bias_out + bias_size, T(0));
    for (int64_t p = 0; p < parts; ++p) {
      const T* sums = part_sums.data() + p * (kernel_size + bias_size);
      for (int64_t k = 0; k < kernel_size; ++k) kernel_out[k] += sums[k];
      for (int64_t o = 0; o < bias_size; ++o) bias_out[o] += sums[kernel_size + o];
    }
  }

 private:
  ConvGeometry geo_;
  bool bias_grads_;
};

#define TF_TEMPERED_REGISTER(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("TfTemperedConv2DClippedKernelSum")                   \
                              .Device(::tensorflow::DEVICE_CPU)                      \
                              .TypeConstraint<T>("T")                                \
                              .HostMemory("num_groups")                              \
                              .HostMemory("l2_norm_clip"),                           \
                          Conv2DClippedKernelSumOp<T>);
TF_TEMPERED_REGISTER(float);
TF_TEMPERED_REGISTER(double);
#undef TF_TEMPERED_REGISTER

}  // namespace tf_tempered
