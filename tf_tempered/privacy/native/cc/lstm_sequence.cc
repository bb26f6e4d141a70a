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
// TfTemperedLstmSequence: the time loop of a Keras LSTM (sigmoid gates, tanh activation)
// from its precomputed input part a = x·W + b, batch-major [B, T, 4H]:
//
//     z_t = a_t + h_{t-1}·U,   i, f, o = σ(z_i), σ(z_f), σ(z_o),   g = tanh(z_g)
//     c_t = f ⊙ c_{t-1} + i ⊙ g,   h_t = o ⊙ tanh(c_t)
//
// (Keras' gate order i, f, g, o in the 4H columns). Outputs h [B, T, H], c [B, T, H] and
// the activated gates [B, T, 4H] that TfTemperedLstmSequenceGrad reads:
//
//     δh = δh_out_t + δz_{t+1}·Uᵀ,   δc = δc_out_t + δc_{t+1}·f_{t+1} + δh ⊙ o ⊙ (1 − tanh²c_t)
//     δz_i = δc ⊙ g ⊙ i(1−i),  δz_f = δc ⊙ c_{t-1} ⊙ f(1−f),  δz_g = δc ⊙ i ⊙ (1−g²),
//     δz_o = δh ⊙ tanh(c_t) ⊙ o(1−o);   δa_t = δz_t
//
// Each example's recurrence is independent of the others', so blocks of rows run the whole
// time loop in parallel: no per-step op dispatch or thread hand-off (TF's while loop pays
// both ~15 ops a step, serially), and no per-step tensors kept for the backward pass.

#include <cstdint>

#include "recurrent_blocks.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_tempered {
namespace {
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
using namespace ::tf_tempered::recurrent;  // NOLINT: Matrix, StepOf, ... (recurrent_blocks.h)

REGISTER_OP("TfTemperedLstmSequence")
    .Input("a: float")   // [B, T, 4H]: x·W + b
    .Input("u: float")   // [H, 4H]
    .Input("h0: float")  // [B, H]
    .Input("c0: float")  // [B, H]
    .Output("h: float")      // [B, T, H]
    .Output("c: float")      // [B, T, H]
    .Output("gates: float")  // [B, T, 4H]: i, f, g, o activated
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle a, h0;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 3, &a));
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(2), 2, &h0));
      ShapeHandle states = ctx->MakeShape({ctx->Dim(a, 0), ctx->Dim(a, 1), ctx->Dim(h0, 1)});
      ctx->set_output(0, states);
      ctx->set_output(1, states);
      ctx->set_output(2, a);
      return absl::OkStatus();
    });

REGISTER_OP("TfTemperedLstmSequenceGrad")
    .Input("gates: float")  // [B, T, 4H]
    .Input("c: float")      // [B, T, H]
    .Input("c0: float")     // [B, H]
    .Input("u: float")      // [H, 4H]
    .Input("dh: float")     // [B, T, H]: the loss' gradient of the outputs h
    .Input("dc: float")     // [B, T, H]: ... and of the cell states c
    .Output("da: float")    // [B, T, 4H]
    .Output("dh0: float")   // [B, H]
    .Output("dc0: float")   // [B, H]
    .SetShapeFn([](InferenceContext* ctx) {
      ctx->set_output(0, ctx->input(0));
      ctx->set_output(1, ctx->input(2));
      ctx->set_output(2, ctx->input(2));
      return absl::OkStatus();
    });

class LstmSequenceOp : public OpKernel {
 public:
  explicit LstmSequenceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &a_t = ctx->input(0), &u_t = ctx->input(1);
    const Tensor &h0_t = ctx->input(2), &c0_t = ctx->input(3);
    Sizes s;
    OP_REQUIRES_OK(ctx, CheckSizes("TfTemperedLstmSequence", 4, a_t, u_t, h0_t, &s));
    OP_REQUIRES(ctx, c0_t.shape() == h0_t.shape(),
                InvalidArgument("TfTemperedLstmSequence: c0 ", c0_t.shape().DebugString(),
                                " differs from h0 ", h0_t.shape().DebugString()));
    Tensor *h_t, *c_t, *gates_t;
    const TensorShape states({s.batch, s.steps, s.units});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, states, &h_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, states, &c_t));
    // The gates take a's buffer when nothing else holds a (each step copies its block of a
    // before writing the gates there): 4·B·T·H floats less at the step's peak.
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 2, a_t.shape(), &gates_t));
    if (s.batch == 0 || s.steps == 0) return;
    const int64_t n = s.units, n4 = 4 * n;
    const float* a = a_t.flat<float>().data();
    ConstMap u(u_t.flat<float>().data(), n, n4);
    const float *h0 = h0_t.flat<float>().data(), *c0 = c0_t.flat<float>().data();
    float *h = h_t->flat<float>().data(), *c = c_t->flat<float>().data();
    float* gates = gates_t->flat<float>().data();
    ForEachBlock(ctx, s, 4, [&](int64_t row, int64_t rows) {
      Matrix z(rows, n4);
      for (int64_t t = 0; t < s.steps; ++t) {
        // This step reads the previous step's outputs.
        ConstStrided h_prev = StateBefore(h, h0, row, rows, t, s, n);
        ConstStrided c_prev = StateBefore(c, c0, row, rows, t, s, n);
        z = StepOf(a, row, rows, t, s, n4);
        z.noalias() += h_prev * u;
        Strided g_out = StepOf(gates, row, rows, t, s, n4);
        Strided c_out = StepOf(c, row, rows, t, s, n), h_out = StepOf(h, row, rows, t, s, n);
        g_out.leftCols(2 * n).array() = z.leftCols(2 * n).array().logistic();
        g_out.middleCols(2 * n, n).array() = z.middleCols(2 * n, n).array().tanh();
        g_out.rightCols(n).array() = z.rightCols(n).array().logistic();
        c_out.array() = g_out.middleCols(n, n).array() * c_prev.array() +
                        g_out.leftCols(n).array() * g_out.middleCols(2 * n, n).array();
        h_out.array() = g_out.rightCols(n).array() * c_out.array().tanh();
      }
    });
  }
};

class LstmSequenceGradOp : public OpKernel {
 public:
  explicit LstmSequenceGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &gates_t = ctx->input(0), &c_t = ctx->input(1), &c0_t = ctx->input(2);
    const Tensor &u_t = ctx->input(3), &dh_t = ctx->input(4), &dc_t = ctx->input(5);
    Sizes s;
    OP_REQUIRES_OK(ctx, CheckSizes("TfTemperedLstmSequenceGrad", 4, gates_t, u_t, c0_t, &s));
    const TensorShape states({s.batch, s.steps, s.units});
    OP_REQUIRES(ctx, c_t.shape() == states && dh_t.shape() == states && dc_t.shape() == states,
                InvalidArgument("TfTemperedLstmSequenceGrad: c, dh and dc must be ",
                                states.DebugString()));
    Tensor *da_t, *dh0_t, *dc0_t;
    // δa takes the gates' buffer when only this op holds them (each step copies its gates
    // before writing δa there).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, gates_t.shape(), &da_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, c0_t.shape(), &dh0_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, c0_t.shape(), &dc0_t));
    const int64_t n = s.units, n4 = 4 * n;
    if (s.batch == 0) return;
    if (s.steps == 0) {
      dh0_t->flat<float>().setZero();
      dc0_t->flat<float>().setZero();
      return;
    }
    const float *gates = gates_t.flat<float>().data(), *c = c_t.flat<float>().data();
    const float *c0 = c0_t.flat<float>().data(), *dh = dh_t.flat<float>().data();
    const float* dc = dc_t.flat<float>().data();
    const Matrix u_transposed = ConstMap(u_t.flat<float>().data(), n, n4).transpose();
    float *da = da_t->flat<float>().data(), *dh0 = dh0_t->flat<float>().data();
    float* dc0 = dc0_t->flat<float>().data();
    ForEachBlock(ctx, s, 4, [&](int64_t row, int64_t rows) {
      Matrix dh_carry = Matrix::Zero(rows, n), dc_carry = Matrix::Zero(rows, n);
      Matrix tanh_c(rows, n), dc_total(rows, n), dh_total(rows, n), g(rows, n4);
      for (int64_t t = s.steps - 1; t >= 0; --t) {
        g = StepOf(gates, row, rows, t, s, n4);  // a copy: δa overwrites them below
        ConstStrided c_prev = StateBefore(c, c0, row, rows, t, s, n);
        const auto i = g.leftCols(n).array(), f = g.middleCols(n, n).array();
        const auto gg = g.middleCols(2 * n, n).array(), o = g.rightCols(n).array();
        Strided dz = StepOf(da, row, rows, t, s, n4);
        tanh_c.array() = StepOf(c, row, rows, t, s, n).array().tanh();
        dh_total.array() = StepOf(dh, row, rows, t, s, n).array() + dh_carry.array();
        dc_total.array() = StepOf(dc, row, rows, t, s, n).array() + dc_carry.array() +
                           dh_total.array() * o * (1.0f - tanh_c.array().square());
        dz.leftCols(n).array() = dc_total.array() * gg * i * (1.0f - i);
        dz.middleCols(n, n).array() = dc_total.array() * c_prev.array() * f * (1.0f - f);
        dz.middleCols(2 * n, n).array() = dc_total.array() * i * (1.0f - gg.square());
        dz.rightCols(n).array() = dh_total.array() * tanh_c.array() * o * (1.0f - o);
        dc_carry.array() = dc_total.array() * f;
        dh_carry.noalias() = dz * u_transposed;
      }
      Eigen::Map<Matrix>(dh0 + row * n, rows, n) = dh_carry;
      Eigen::Map<Matrix>(dc0 + row * n, rows, n) = dc_carry;
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TfTemperedLstmSequence").Device(::tensorflow::DEVICE_CPU),
                        LstmSequenceOp);
REGISTER_KERNEL_BUILDER(Name("TfTemperedLstmSequenceGrad").Device(::tensorflow::DEVICE_CPU),
                        LstmSequenceGradOp);

}  // namespace
}  // namespace tf_tempered
