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
// TfTemperedGruSequence: the time loop of a Keras GRU (sigmoid gates, tanh) from its
// precomputed input part a = x·W + b_in, batch-major [B, T, 3H]. With reset_after=True
// (Keras' default):
//
//     q_t = h_{t-1}·U + b_rec,   z = σ(a_z + q_z),   r = σ(a_r + q_r)
//     ĥ = tanh(a_h + r ⊙ q_h),   h_t = z ⊙ h_{t-1} + (1 − z) ⊙ ĥ
//
// (Keras' block order z, r, h). Outputs h [B, T, H], the gates z, r, ĥ [B, T, 3H] and q_h
// [B, T, H], which TfTemperedGruSequenceGrad reads:
//
//     δh = δh_out_t + δq_{t+1}·Uᵀ + δh_{t+1} ⊙ z_{t+1}
//     δa_z = δh ⊙ (h_{t-1} − ĥ) ⊙ z(1−z),   δa_h = δh ⊙ (1 − z) ⊙ (1 − ĥ²)
//     δa_r = δa_h ⊙ q_h ⊙ r(1−r),   δq = [δa_z, δa_r, r ⊙ δa_h]
//
// With reset_after=False the reset gate acts on the state before its product with U's
// candidate block: q_zr = h_{t-1}·U_zr + b_zr, ĥ = tanh(a_h + (r ⊙ h_{t-1})·U_h + b_h), and
// the third output holds r ⊙ h_{t-1} (U_h's rows); backwards
//
//     δ(r ⊙ h) = δa_h·U_hᵀ,   δa_r = δ(r ⊙ h) ⊙ h_{t-1} ⊙ r(1−r)
//     δh_{t-1} = δh ⊙ z + δ(r ⊙ h) ⊙ r + [δa_z, δa_r]·U_zrᵀ
//
// Blocks of rows run their whole recurrence in parallel, as in lstm_sequence.cc.

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

REGISTER_OP("TfTemperedGruSequence")
    .Input("a: float")               // [B, T, 3H]: x·W + b_in
    .Input("u: float")               // [H, 3H]
    .Input("recurrent_bias: float")  // [3H]
    .Input("h0: float")              // [B, H]
    .Output("h: float")              // [B, T, H]
    .Output("gates: float")          // [B, T, 3H]: z, r, ĥ
    .Output("recurrent_h: float")    // [B, T, H]: q_h (reset_after), else r ⊙ h_{t-1}
    .Attr("reset_after: bool = true")
    .SetShapeFn([](InferenceContext* ctx) {
      ShapeHandle a, h0;
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(0), 3, &a));
      TF_RETURN_IF_ERROR(ctx->WithRank(ctx->input(3), 2, &h0));
      ShapeHandle states = ctx->MakeShape({ctx->Dim(a, 0), ctx->Dim(a, 1), ctx->Dim(h0, 1)});
      ctx->set_output(0, states);
      ctx->set_output(1, a);
      ctx->set_output(2, states);
      return absl::OkStatus();
    });

REGISTER_OP("TfTemperedGruSequenceGrad")
    .Input("gates: float")        // [B, T, 3H]
    .Input("recurrent_h: float")  // [B, T, H]
    .Input("h: float")            // [B, T, H]
    .Input("h0: float")           // [B, H]
    .Input("u: float")            // [H, 3H]
    .Input("dh: float")           // [B, T, H]: the loss' gradient of the outputs h
    .Output("da: float")          // [B, T, 3H]
    .Output("dh0: float")         // [B, H]
    .Attr("reset_after: bool = true")
    .SetShapeFn([](InferenceContext* ctx) {
      ctx->set_output(0, ctx->input(0));
      ctx->set_output(1, ctx->input(3));
      return absl::OkStatus();
    });

class GruSequenceOp : public OpKernel {
 public:
  explicit GruSequenceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reset_after", &reset_after_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &a_t = ctx->input(0), &u_t = ctx->input(1), &bias_t = ctx->input(2);
    const Tensor& h0_t = ctx->input(3);
    Sizes s;
    OP_REQUIRES_OK(ctx, CheckSizes("TfTemperedGruSequence", 3, a_t, u_t, h0_t, &s));
    const int64_t n = s.units, n3 = 3 * n;
    OP_REQUIRES(ctx, bias_t.dims() == 1 && bias_t.dim_size(0) == n3,
                InvalidArgument("TfTemperedGruSequence: recurrent_bias must be [", n3,
                                "], got ", bias_t.shape().DebugString()));
    Tensor *h_t, *gates_t, *rh_t;
    const TensorShape states({s.batch, s.steps, n});
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, states, &h_t));
    // The gates take a's buffer when nothing else holds a (each step copies its block first).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 1, a_t.shape(), &gates_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, states, &rh_t));
    if (s.batch == 0 || s.steps == 0) return;
    const float *a = a_t.flat<float>().data(), *h0 = h0_t.flat<float>().data();
    ConstMap u(u_t.flat<float>().data(), n, n3);
    const Eigen::Map<const Eigen::RowVectorXf> bias(bias_t.flat<float>().data(), n3);
    float *h = h_t->flat<float>().data(), *gates = gates_t->flat<float>().data();
    float* rh = rh_t->flat<float>().data();
    ForEachBlock(ctx, s, 3, [&](int64_t row, int64_t rows) {
      Matrix x(rows, n3), q(rows, n3);
      for (int64_t t = 0; t < s.steps; ++t) {
        ConstStrided h_prev = StateBefore(h, h0, row, rows, t, s, n);  // the previous output
        x = StepOf(a, row, rows, t, s, n3);
        Strided g = StepOf(gates, row, rows, t, s, n3);
        if (reset_after_) {
          q.noalias() = h_prev * u;
          q.rowwise() += bias;
          g.leftCols(2 * n).array() = (x.leftCols(2 * n) + q.leftCols(2 * n)).array().logistic();
          g.rightCols(n).array() =
              (x.rightCols(n).array() + g.middleCols(n, n).array() * q.rightCols(n).array()).tanh();
          StepOf(rh, row, rows, t, s, n) = q.rightCols(n);
        } else {
          q.leftCols(2 * n).noalias() = h_prev * u.leftCols(2 * n);
          q.leftCols(2 * n).rowwise() += bias.leftCols(2 * n);
          g.leftCols(2 * n).array() = (x.leftCols(2 * n) + q.leftCols(2 * n)).array().logistic();
          Strided reset_h = StepOf(rh, row, rows, t, s, n);
          reset_h.array() = g.middleCols(n, n).array() * h_prev.array();
          q.rightCols(n).noalias() = reset_h * u.rightCols(n);
          q.rightCols(n).rowwise() += bias.rightCols(n);
          g.rightCols(n).array() = (x.rightCols(n) + q.rightCols(n)).array().tanh();
        }
        const auto z = g.leftCols(n).array();
        StepOf(h, row, rows, t, s, n).array() =
            z * h_prev.array() + (1.0f - z) * g.rightCols(n).array();
      }
    });
  }

 private:
  bool reset_after_;
};

class GruSequenceGradOp : public OpKernel {
 public:
  explicit GruSequenceGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("reset_after", &reset_after_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor &gates_t = ctx->input(0), &rh_t = ctx->input(1), &h_t = ctx->input(2);
    const Tensor &h0_t = ctx->input(3), &u_t = ctx->input(4), &dh_t = ctx->input(5);
    Sizes s;
    OP_REQUIRES_OK(ctx, CheckSizes("TfTemperedGruSequenceGrad", 3, gates_t, u_t, h0_t, &s));
    const TensorShape states({s.batch, s.steps, s.units});
    OP_REQUIRES(ctx, rh_t.shape() == states && h_t.shape() == states && dh_t.shape() == states,
                InvalidArgument("TfTemperedGruSequenceGrad: recurrent_h, h and dh must be ",
                                states.DebugString()));
    Tensor *da_t, *dh0_t;
    // δa takes the gates' buffer when only this op holds them (each step copies them first).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, gates_t.shape(), &da_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, h0_t.shape(), &dh0_t));
    if (s.batch == 0) return;
    if (s.steps == 0) {
      dh0_t->flat<float>().setZero();
      return;
    }
    const int64_t n = s.units, n3 = 3 * n;
    const float *gates = gates_t.flat<float>().data(), *rh = rh_t.flat<float>().data();
    const float *h = h_t.flat<float>().data(), *h0 = h0_t.flat<float>().data();
    const float* dh = dh_t.flat<float>().data();
    const Matrix u_transposed = ConstMap(u_t.flat<float>().data(), n, n3).transpose();
    float *da = da_t->flat<float>().data(), *dh0 = dh0_t->flat<float>().data();
    ForEachBlock(ctx, s, 3, [&](int64_t row, int64_t rows) {
      Matrix carry = Matrix::Zero(rows, n), dh_total(rows, n), g(rows, n3), dq(rows, n3);
      Matrix d_reset_h(reset_after_ ? 0 : rows, n);
      for (int64_t t = s.steps - 1; t >= 0; --t) {
        g = StepOf(gates, row, rows, t, s, n3);  // a copy: δa overwrites them below
        ConstStrided h_prev = StateBefore(h, h0, row, rows, t, s, n);
        const auto z = g.leftCols(n).array(), r = g.middleCols(n, n).array();
        const auto hh = g.rightCols(n).array();
        dh_total.array() = StepOf(dh, row, rows, t, s, n).array() + carry.array();
        Strided d = StepOf(da, row, rows, t, s, n3);
        d.leftCols(n).array() = dh_total.array() * (h_prev.array() - hh) * z * (1.0f - z);
        d.rightCols(n).array() = dh_total.array() * (1.0f - z) * (1.0f - hh.square());
        if (reset_after_) {
          d.middleCols(n, n).array() =
              d.rightCols(n).array() * StepOf(rh, row, rows, t, s, n).array() * r * (1.0f - r);
          dq.leftCols(2 * n) = d.leftCols(2 * n);
          dq.rightCols(n).array() = r * d.rightCols(n).array();
          carry.array() = dh_total.array() * z;
          carry.noalias() += dq * u_transposed;
        } else {
          d_reset_h.noalias() = d.rightCols(n) * u_transposed.bottomRows(n);
          d.middleCols(n, n).array() = d_reset_h.array() * h_prev.array() * r * (1.0f - r);
          carry.array() = dh_total.array() * z + d_reset_h.array() * r;
          carry.noalias() += d.leftCols(2 * n) * u_transposed.topRows(2 * n);
        }
      }
      Eigen::Map<Matrix>(dh0 + row * n, rows, n) = carry;
    });
  }

 private:
  bool reset_after_;
};

REGISTER_KERNEL_BUILDER(Name("TfTemperedGruSequence").Device(::tensorflow::DEVICE_CPU),
                        GruSequenceOp);
REGISTER_KERNEL_BUILDER(Name("TfTemperedGruSequenceGrad").Device(::tensorflow::DEVICE_CPU),
                        GruSequenceGradOp);

}  // namespace
}  // namespace tf_tempered
