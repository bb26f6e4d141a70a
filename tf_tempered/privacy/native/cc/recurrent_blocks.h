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
// What the native recurrent loops (lstm_sequence.cc, gru_sequence.cc) share: batch-major
// [B, T, width] tensors read and written one time step of a block of rows at a time, and the
// blocks of rows run in parallel, each over all its time steps (an example's recurrence
// needs no other example's).

#ifndef TF_TEMPERED_RECURRENT_BLOCKS_H_
#define TF_TEMPERED_RECURRENT_BLOCKS_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "Eigen/Core"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_tempered {
namespace recurrent {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Strided = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
using ConstStrided = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using ConstMap = Eigen::Map<const Matrix>;

constexpr int64_t kBlockRows = 16;  // rows whose recurrence one task runs

struct Sizes {
  int64_t batch, steps, units;
};

// Rows row..row+rows-1 of time step t of a batch-major [B, T, width] tensor.
inline ConstStrided StepOf(const float* data, int64_t row, int64_t rows, int64_t t,
                           const Sizes& s, int64_t width) {
  return ConstStrided(data + (row * s.steps + t) * width, rows, width,
                      Eigen::OuterStride<>(s.steps * width));
}

inline Strided StepOf(float* data, int64_t row, int64_t rows, int64_t t, const Sizes& s,
                      int64_t width) {
  return Strided(data + (row * s.steps + t) * width, rows, width,
                 Eigen::OuterStride<>(s.steps * width));
}

// Rows of a [B, width] tensor (the initial states).
inline ConstStrided RowsOf(const float* data, int64_t row, int64_t rows, int64_t width) {
  return ConstStrided(data + row * width, rows, width, Eigen::OuterStride<>(width));
}

// The state entering step t: rows of the initial state [B, width] at t = 0, else step t − 1 of
// the sequence [B, T, width].
inline ConstStrided StateBefore(const float* sequence, const float* initial, int64_t row,
                                int64_t rows, int64_t t, const Sizes& s, int64_t width) {
  return t == 0 ? RowsOf(initial, row, rows, width)
                : StepOf(sequence, row, rows, t - 1, s, width);
}

// a [B, T, gates·H], u [H, gates·H], state [B, H]: the sizes, or an error naming op.
inline absl::Status CheckSizes(const char* op, int gates, const ::tensorflow::Tensor& a,
                               const ::tensorflow::Tensor& u, const ::tensorflow::Tensor& state,
                               Sizes* sizes) {
  if (a.dims() != 3 || u.dims() != 2 || state.dims() != 2) {
    return ::tensorflow::errors::InvalidArgument(
        op, ": ranks 3, 2, 2 expected, got ", a.shape().DebugString(), ", ",
        u.shape().DebugString(), ", ", state.shape().DebugString());
  }
  const int64_t units = u.dim_size(0);
  if (u.dim_size(1) != gates * units || a.dim_size(2) != gates * units ||
      state.dim_size(0) != a.dim_size(0) || state.dim_size(1) != units) {
    return ::tensorflow::errors::InvalidArgument(
        op, ": shapes do not match: a ", a.shape().DebugString(), ", u ",
        u.shape().DebugString(), ", state ", state.shape().DebugString());
  }
  *sizes = Sizes{a.dim_size(0), a.dim_size(1), units};
  return absl::OkStatus();
}

// work(first row, rows) for every block of kBlockRows rows, blocks in parallel.
inline void ForEachBlock(::tensorflow::OpKernelContext* ctx, const Sizes& s, int gates,
                         const std::function<void(int64_t, int64_t)>& work) {
  const int64_t blocks = (s.batch + kBlockRows - 1) / kBlockRows;
  const int64_t cost = kBlockRows * s.steps * s.units * s.units * gates * 2;  // multiply-adds
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(threads->num_threads, threads->workers, blocks, cost,
                      [&](int64_t begin, int64_t end) {
                        for (int64_t blk = begin; blk < end; ++blk) {
                          const int64_t row = blk * kBlockRows;
                          work(row, std::min(kBlockRows, s.batch - row));
                        }
                      });
}

}  // namespace recurrent
}  // namespace tf_tempered

#endif  // TF_TEMPERED_RECURRENT_BLOCKS_H_
