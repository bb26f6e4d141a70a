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
// What the per-example convolution-gradient ops (conv_kernel_grads.cc, conv_clipped_sum.cc,
// depthwise_kernel_grads.cc) share: their geometry attributes, read and checked
// once, the check of their NHWC input / output-gradient pair, and their number of groups.

#ifndef TF_TEMPERED_CONV_GEOMETRY_H_
#define TF_TEMPERED_CONV_GEOMETRY_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tempered {

// kernel_size, strides, dilations (each (rows, columns)) and pads (top, left).
struct ConvGeometry {
  int kh, kw, sh, sw, dh, dw, pt, pl;

  // Reads the op's four attributes; an error names what is wrong.
  static absl::Status Read(::tensorflow::OpKernelConstruction* ctx, ConvGeometry* out) {
    std::vector<int32_t> k, s, d, p;
    TF_RETURN_IF_ERROR(ctx->GetAttr("kernel_size", &k));
    TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &s));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dilations", &d));
    TF_RETURN_IF_ERROR(ctx->GetAttr("pads", &p));
    if (k.size() != 2 || s.size() != 2 || d.size() != 2 || p.size() != 2)
      return absl::InvalidArgumentError("kernel_size, strides, dilations, pads need 2 values");
    *out = {k[0], k[1], s[0], s[1], d[0], d[1], p[0], p[1]};
    if (!(out->kh > 0 && out->kw > 0 && out->sh > 0 && out->sw > 0 && out->dh > 0 &&
          out->dw > 0 && out->pt >= 0 && out->pl >= 0))
      return absl::InvalidArgumentError(
          "kernel_size, strides, dilations must be positive, pads >= 0");
    return absl::OkStatus();
  }
};

// x [B, H, W, cin] and g [B, OH, OW, cout]: both 4-D, one batch size.
inline absl::Status CheckNhwcPair(const ::tensorflow::Tensor& x, const ::tensorflow::Tensor& g) {
  if (x.dims() != 4 || g.dims() != 4)
    return absl::InvalidArgumentError("input and out_grad must be 4-D (NHWC)");
  if (g.dim_size(0) != x.dim_size(0))
    return absl::InvalidArgumentError("input and out_grad batch sizes differ");
  return absl::OkStatus();
}

// The per-microbatch ops' num_groups (input 2): a scalar M dividing the batch into groups of
// consecutive examples; M = 0 only for an empty batch, and only where allow_empty.
inline absl::Status ReadNumGroups(::tensorflow::OpKernelContext* ctx, int64_t batch,
                                  bool allow_empty, int32_t* num_groups) {
  const ::tensorflow::Tensor& m = ctx->input(2);
  if (!::tensorflow::TensorShapeUtils::IsScalar(m.shape()))
    return absl::InvalidArgumentError("num_groups must be a scalar");
  *num_groups = m.scalar<int32_t>()();
  const bool empty_ok = allow_empty && *num_groups == 0 && batch == 0;
  if (!empty_ok && !(*num_groups > 0 && batch % *num_groups == 0))
    return absl::InvalidArgumentError(absl::StrCat("batch size ", batch,
                                                   " is not a multiple of num_groups ",
                                                   *num_groups));
  return absl::OkStatus();
}

}  // namespace tf_tempered

#endif  // TF_TEMPERED_CONV_GEOMETRY_H_
