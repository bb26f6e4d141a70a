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
// TfTemperedScatterRows: the dense [num_rows, d] sum of the rows values[p] at rows indices[p],
//
//     out[v] = Σ_{p : indices_p = v} values[p]    (in increasing p: TF's scatter_nd's order),
//
// what tf.scatter_nd(indices[:, None], values, [num_rows, d]) computes: an Embedding's
// clipped gradient sum made dense for the noise. TF's CPU kernel zeroes the output and adds
// the rows on one thread; here each thread owns a range of rows (zeroes it, then adds the
// values that fall in it, scanning all indices), so the result is the same, bit for bit.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tf_tempered {
namespace {

REGISTER_OP("TfTemperedScatterRows")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .Input("indices: Tindices")  // [P]
    .Input("values: T")          // [P, d]
    .Input("num_rows: int64")    // scalar
    .Output("dense: T")          // [num_rows, d]
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &values));
      ::tensorflow::shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &rows));
      c->set_output(0, c->Matrix(rows, c->Dim(values, 1)));
      return absl::OkStatus();
    });

template <typename T, typename Index>
class ScatterRowsOp : public ::tensorflow::OpKernel {
 public:
  explicit ScatterRowsOp(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const ::tensorflow::Tensor& indices_t = ctx->input(0);
    const ::tensorflow::Tensor& values_t = ctx->input(1);
    const int64_t num_rows = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES(ctx, indices_t.dims() == 1 && values_t.dims() == 2 &&
                         values_t.dim_size(0) == indices_t.dim_size(0) && num_rows >= 0,
                ::tensorflow::errors::InvalidArgument(
                    "TfTemperedScatterRows: indices [P], values [P, d] and num_rows >= 0 "
                    "expected, got ", indices_t.shape().DebugString(), ", ",
                    values_t.shape().DebugString(), " and ", num_rows));
    const int64_t count = indices_t.dim_size(0), d = values_t.dim_size(1);
    const Index* indices = indices_t.flat<Index>().data();
    for (int64_t p = 0; p < count; ++p) {
      OP_REQUIRES(ctx, indices[p] >= 0 && indices[p] < num_rows,
                  ::tensorflow::errors::InvalidArgument(
                      "TfTemperedScatterRows: indices[", p, "] = ", indices[p],
                      " is not in [0, ", num_rows, ")"));
    }
    ::tensorflow::Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ::tensorflow::TensorShape({num_rows, d}), &out_t));
    const T* values = values_t.flat<T>().data();
    T* out = out_t->flat<T>().data();
    auto work = [&](int64_t begin, int64_t end) {
      std::memset(out + begin * d, 0, sizeof(T) * (end - begin) * d);
      for (int64_t p = 0; p < count; ++p) {
        const int64_t row = static_cast<int64_t>(indices[p]);
        if (row < begin || row >= end) continue;
        T* target = out + row * d;
        const T* source = values + p * d;
        for (int64_t k = 0; k < d; ++k) target[k] += source[k];
      }
    };
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    // A row costs its zeroing (d values) and its share of the scan and the adds.
    const int64_t cost = d * sizeof(T) + (num_rows > 0 ? 2 * (count * (d + 4)) / num_rows : 0) + 1;
    ::tensorflow::Shard(threads->num_threads, threads->workers, num_rows, cost, work);
  }
};

#define TF_TEMPERED_REGISTER(T, Index)                                        \
  REGISTER_KERNEL_BUILDER(Name("TfTemperedScatterRows")                       \
                              .Device(::tensorflow::DEVICE_CPU)               \
                              .TypeConstraint<T>("T")                         \
                              .TypeConstraint<Index>("Tindices")              \
                              .HostMemory("num_rows"),                        \
                          ScatterRowsOp<T, Index>);
TF_TEMPERED_REGISTER(float, int32_t);
TF_TEMPERED_REGISTER(float, int64_t);
TF_TEMPERED_REGISTER(double, int32_t);
TF_TEMPERED_REGISTER(double, int64_t);
#undef TF_TEMPERED_REGISTER

}  // namespace
}  // namespace tf_tempered
