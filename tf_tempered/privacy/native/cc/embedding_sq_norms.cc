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
// TfTemperedEmbeddingSqNorms: for the ids [M, N] of M microbatches (N positions each) and the
// output gradient g [M, N, d] of an Embedding layer, the squared norm of each microbatch's
// gradient of the embedding matrix,
//
//     sq_m = Σ_v ‖Σ_{p : ids_mp = v} g_mp‖²,
//
// (two positions that look up the same row add their gradients before the square). The TF-ops
// form (embedding.py: a sort, a scatter and an unsorted segment sum over all B·T positions)
// runs its segment sum on one thread; here each microbatch sorts its N ids and sums its
// groups, microbatches in parallel, with double accumulators.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_tempered {
namespace {

REGISTER_OP("TfTemperedEmbeddingSqNorms")
    .Attr("T: {float, double}")
    .Input("ids: int64")  // [M, N]
    .Input("grads: T")    // [M, N, d]
    .Output("sq_norms: T")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &ids));
      c->set_output(0, c->Vector(c->Dim(ids, 0)));
      return absl::OkStatus();
    });

// Σ_k v_k² in double, 8 independent partial sums (a vectorizable loop without -ffast-math).
template <typename V>
inline double SumOfSquares(const V* v, int64_t d) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= d; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(v[k + j]) * v[k + j];
  for (; k < d; ++k) acc[0] += static_cast<double>(v[k]) * v[k];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <typename T>
class EmbeddingSqNormsOp : public ::tensorflow::OpKernel {
 public:
  explicit EmbeddingSqNormsOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& ids_t = ctx->input(0);
    const ::tensorflow::Tensor& grads_t = ctx->input(1);
    OP_REQUIRES(ctx, ids_t.dims() == 2 && grads_t.dims() == 3 &&
                         grads_t.dim_size(0) == ids_t.dim_size(0) &&
                         grads_t.dim_size(1) == ids_t.dim_size(1),
                ::tensorflow::errors::InvalidArgument(
                    "TfTemperedEmbeddingSqNorms: ids [M, N] and grads [M, N, d] expected, got ",
                    ids_t.shape().DebugString(), " and ", grads_t.shape().DebugString()));
    const int64_t m_count = ids_t.dim_size(0), n = ids_t.dim_size(1), d = grads_t.dim_size(2);
    ::tensorflow::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ::tensorflow::TensorShape({m_count}), &out_t));
    const int64_t* ids = ids_t.flat<int64_t>().data();
    const T* grads = grads_t.flat<T>().data();
    T* out = out_t->flat<T>().data();

    // Sort keys (id, position) packed in one integer when they fit (ids below 2^43 and
    // fewer than 2^20 positions: every vocabulary and sequence in practice), else pairs.
    const bool packed = n < (int64_t{1} << 20) && std::all_of(ids, ids + m_count * n, [](int64_t v) {
      return v >= 0 && v < (int64_t{1} << 43);
    });
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<uint64_t> keys(n);
      std::vector<std::pair<int64_t, int64_t>> pairs(packed ? 0 : n);
      std::vector<int64_t> order(n), sorted_ids(n);
      std::vector<double> group(d);
      for (int64_t m = begin; m < end; ++m) {
        const int64_t* mb_ids = ids + m * n;
        const T* mb_grads = grads + m * n * d;
        if (packed) {
          for (int64_t p = 0; p < n; ++p)
            keys[p] = (static_cast<uint64_t>(mb_ids[p]) << 20) | static_cast<uint64_t>(p);
          std::sort(keys.begin(), keys.end());
          for (int64_t p = 0; p < n; ++p) {
            order[p] = static_cast<int64_t>(keys[p] & ((uint64_t{1} << 20) - 1));
            sorted_ids[p] = static_cast<int64_t>(keys[p] >> 20);
          }
        } else {
          for (int64_t p = 0; p < n; ++p) pairs[p] = {mb_ids[p], p};
          std::sort(pairs.begin(), pairs.end());
          for (int64_t p = 0; p < n; ++p) {
            order[p] = pairs[p].second;
            sorted_ids[p] = pairs[p].first;
          }
        }
        double total = 0;
        for (int64_t i = 0; i < n;) {
          const T* row = mb_grads + order[i] * d;
          int64_t j = i + 1;
          if (j == n || sorted_ids[j] != sorted_ids[i]) {  // a row looked up once: no group sum
            total += SumOfSquares(row, d);
            i = j;
            continue;
          }
          for (int64_t k = 0; k < d; ++k) group[k] = row[k];
          for (; j < n && sorted_ids[j] == sorted_ids[i]; ++j) {
            const T* other = mb_grads + order[j] * d;
            for (int64_t k = 0; k < d; ++k) group[k] += other[k];
          }
          total += SumOfSquares(group.data(), d);
          i = j;
        }
        out[m] = static_cast<T>(total);
      }
    };
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, m_count,
                        n * d * 4 + n * 20, work);
  }
};

#define TF_TEMPERED_REGISTER(T)                                               \
  REGISTER_KERNEL_BUILDER(Name("TfTemperedEmbeddingSqNorms")                  \
                              .Device(::tensorflow::DEVICE_CPU)               \
                              .TypeConstraint<T>("T"),                        \
                          EmbeddingSqNormsOp<T>);
TF_TEMPERED_REGISTER(float);
TF_TEMPERED_REGISTER(double);
#undef TF_TEMPERED_REGISTER

}  // namespace
}  // namespace tf_tempered
