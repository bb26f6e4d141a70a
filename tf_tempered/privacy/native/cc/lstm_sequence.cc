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

#include <algorithm>
#include <cstdint>
#include <functional>

#include "Eigen/Core"
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
using ::tensorflow::errors::InvalidArgument;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
using ConstStrided = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using ConstMap = Eigen::Map<const Matrix>;

constexpr int64_t kBlockRows = 16;  // rows whose recurrence one task runs

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

struct Sizes {
  int64_t batch, steps, units;
};

absl::Status CheckSizes(const Tensor& a, const Tensor& u, const Tensor& state, Sizes* sizes) {
  if (a.dims() != 3 || u.dims() != 2 || state.dims() != 2) {
    return InvalidArgument("TfTemperedLstmSequence: ranks 3, 2, 2 expected, got ",
                           a.shape().DebugString(), ", ", u.shape().DebugString(), ", ",
                           state.shape().DebugString());
  }
  const int64_t units = u.dim_size(0);
  if (u.dim_size(1) != 4 * units || a.dim_size(2) != 4 * units ||
      state.dim_size(0) != a.dim_size(0) || state.dim_size(1) != units) {
    return InvalidArgument("TfTemperedLstmSequence: shapes do not match: a ",
                           a.shape().DebugString(), ", u ", u.shape().DebugString(), ", state ",
                           state.shape().DebugString());
  }
  *sizes = Sizes{a.dim_size(0), a.dim_size(1), units};
  return absl::OkStatus();
}

void ForEachBlock(OpKernelContext* ctx, const Sizes& s,
                  const std::function<void(int64_t, int64_t)>& work) {
  const int64_t blocks = (s.batch + kBlockRows - 1) / kBlockRows;
  const int64_t cost = kBlockRows * s.steps * s.units * s.units * 8;  // ~multiply-adds
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(threads->num_threads, threads->workers, blocks, cost,
                      [&](int64_t begin, int64_t end) {
                        for (int64_t blk = begin; blk < end; ++blk) {
                          const int64_t row = blk * kBlockRows;
                          work(row, std::min(kBlockRows, s.batch - row));
                        }
                      });
}

class LstmSequenceOp : public OpKernel {
 public:
  explicit LstmSequenceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &a_t = ctx->input(0), &u_t = ctx->input(1);
    const Tensor &h0_t = ctx->input(2), &c0_t = ctx->input(3);
    Sizes s;
    OP_REQUIRES_OK(ctx, CheckSizes(a_t, u_t, h0_t, &s));
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
    const int64_t n = s.units, n4 = 4 * n, T = s.steps;
    const float* a = a_t.flat<float>().data();
    ConstMap u(u_t.flat<float>().data(), n, n4);
    const float *h0 = h0_t.flat<float>().data(), *c0 = c0_t.flat<float>().data();
    float *h = h_t->flat<float>().data(), *c = c_t->flat<float>().data();
    float* gates = gates_t->flat<float>().data();
    ForEachBlock(ctx, s, [&](int64_t row, int64_t rows) {
      Matrix z(rows, n4);
      for (int64_t t = 0; t < T; ++t) {
        // Row r of this step's tensors sits at [(row + r)·T + t]: rows T·width apart.
        ConstStrided h_prev = t == 0 ? ConstStrided(h0 + row * n, rows, n, Eigen::OuterStride<>(n))
                                     : ConstStrided(h + (row * T + t - 1) * n, rows, n,
                                                    Eigen::OuterStride<>(T * n));
        ConstStrided c_prev = t == 0 ? ConstStrided(c0 + row * n, rows, n, Eigen::OuterStride<>(n))
                                     : ConstStrided(c + (row * T + t - 1) * n, rows, n,
                                                    Eigen::OuterStride<>(T * n));
        z = ConstStrided(a + (row * T + t) * n4, rows, n4, Eigen::OuterStride<>(T * n4));
        z.noalias() += h_prev * u;
        Strided g_out(gates + (row * T + t) * n4, rows, n4, Eigen::OuterStride<>(T * n4));
        Strided c_out(c + (row * T + t) * n, rows, n, Eigen::OuterStride<>(T * n));
        Strided h_out(h + (row * T + t) * n, rows, n, Eigen::OuterStride<>(T * n));
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
    OP_REQUIRES_OK(ctx, CheckSizes(gates_t, u_t, c0_t, &s));
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
    const int64_t n = s.units, n4 = 4 * n, T = s.steps;
    if (s.batch == 0) return;
    if (T == 0) {
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
    ForEachBlock(ctx, s, [&](int64_t row, int64_t rows) {
      Matrix dh_carry = Matrix::Zero(rows, n), dc_carry = Matrix::Zero(rows, n);
      Matrix tanh_c(rows, n), dc_total(rows, n), dh_total(rows, n), g(rows, n4);
      for (int64_t t = T - 1; t >= 0; --t) {
        const auto stride4 = Eigen::OuterStride<>(T * n4), stride = Eigen::OuterStride<>(T * n);
        g = ConstStrided(gates + (row * T + t) * n4, rows, n4, stride4);
        ConstStrided c_now(c + (row * T + t) * n, rows, n, stride);
        ConstStrided c_prev = t == 0 ? ConstStrided(c0 + row * n, rows, n, Eigen::OuterStride<>(n))
                                     : ConstStrided(c + (row * T + t - 1) * n, rows, n, stride);
        const auto i = g.leftCols(n).array(), f = g.middleCols(n, n).array();
        const auto gg = g.middleCols(2 * n, n).array(), o = g.rightCols(n).array();
        Strided dz(da + (row * T + t) * n4, rows, n4, stride4);
        tanh_c.array() = c_now.array().tanh();
        dh_total.array() =
            ConstStrided(dh + (row * T + t) * n, rows, n, stride).array() + dh_carry.array();
        dc_total.array() = ConstStrided(dc + (row * T + t) * n, rows, n, stride).array() +
                           dc_carry.array() +
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
