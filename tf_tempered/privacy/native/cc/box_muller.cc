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
// TfTemperedBoxMuller: the DP noise of randomness.DPRandomness.box_muller in one pass,
//
//     u1_j = (k_j + 1/2)·2^-64,  u2_j = the float32 uniform of 32 random bits,
//     r_j = √(−2 ln u1_j)·stddev,  (r_j·cos 2πu2_j, r_j·sin 2πu2_j),
//
// from the same Philox-4x32-10 bits as TF's StatelessRandomUniformFullIntV2 (uint64 k_j at
// radius_counter) and StatelessRandomUniformV2 (float32 u2_j at angle_counter) with the same
// key: block b of a draw is Philox(key, counter + b) (128-bit counter), k_j the 64 bits
// (words 2i, 2i + 1) of block j/2, u2_j word j mod 4 of block j/4. TF's ops write each
// uniform to memory and then run six elementwise ops over [num_pairs] vectors (log, sqrt,
// cos, sin, products), eight passes over memory; here each chunk of pairs stays in cache,
// the Philox rounds vectorise across blocks, and the functions are Eigen's vectorised
// ones (the ones TF's kernels use). The values equal TF's to float32 rounding of those
// functions (tests/test_native_noise.py).
//
// TfTemperedBoxMullerPieces: the same values as the vector [cos half; sin half], written
// straight into consecutive pieces of given sizes (the noise of each variable).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "Eigen/Core"
#include "philox.h"
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
using philox::Advance;
using philox::kLanes;
using philox::PhiloxBlocks;
#if defined(__AVX512F__)
using philox::Philox16;
#endif

REGISTER_OP("TfTemperedBoxMuller")
    .Input("key: uint64")             // [1]
    .Input("radius_counter: uint64")  // [2]: low, high 64 bits
    .Input("angle_counter: uint64")   // [2]
    .Input("shape: int64")            // [1]: num_pairs
    .Input("stddev: float")           // scalar
    .Output("cos_half: float")
    .Output("sin_half: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(3, &out));
      c->set_output(0, out);
      c->set_output(1, out);
      return absl::OkStatus();
    });

REGISTER_OP("TfTemperedBoxMullerPieces")
    .Attr("N: int >= 1")
    .Input("key: uint64")             // [1]
    .Input("radius_counter: uint64")  // [2]
    .Input("angle_counter: uint64")   // [2]
    .Input("sizes: int64")            // [N]
    .Input("stddev: float")           // scalar
    .Output("pieces: N * float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      const ::tensorflow::Tensor* sizes = c->input_tensor(3);
      if (sizes != nullptr && sizes->NumElements() != c->num_outputs()) sizes = nullptr;
      for (int i = 0; i < c->num_outputs(); ++i)
        c->set_output(i, c->Vector(sizes != nullptr ? c->MakeDim(sizes->flat<int64_t>()(i))
                                                    : c->UnknownDim()));
      return absl::OkStatus();
    });

constexpr int64_t kChunk = 2048;  // pairs per unit of work (a multiple of 4 · kLanes)

// u1[0..count) and u2[0..count) of pairs first.. (any count, any CPU): one element at a time.
inline void UnpackedChunk(uint64_t key, uint64_t radius_low, uint64_t radius_high,
                          uint64_t angle_low, uint64_t angle_high, int64_t first, int64_t count,
                          float* u1, float* u2) {
  uint32_t words[4][kLanes];
  // Radius: 2 uint64 per block.
  for (int64_t j = 0; j < count; j += 2 * kLanes) {
    uint64_t low, high;
    Advance(radius_low, radius_high, static_cast<uint64_t>((first + j) / 2), &low, &high);
    PhiloxBlocks(key, low, high, words);
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t k0 = words[0][l] | (static_cast<uint64_t>(words[1][l]) << 32);
      const uint64_t k1 = words[2][l] | (static_cast<uint64_t>(words[3][l]) << 32);
      if (j + 2 * l < count) u1[j + 2 * l] = (static_cast<float>(k0) + 0.5f) * 0x1p-64f;
      if (j + 2 * l + 1 < count)
        u1[j + 2 * l + 1] = (static_cast<float>(k1) + 0.5f) * 0x1p-64f;
    }
  }
  // Angle: 4 float32 per block, 23 low bits each as the mantissa of [1, 2), minus 1.
  for (int64_t j = 0; j < count; j += 4 * kLanes) {
    uint64_t low, high;
    Advance(angle_low, angle_high, static_cast<uint64_t>((first + j) / 4), &low, &high);
    PhiloxBlocks(key, low, high, words);
    for (int l = 0; l < kLanes; ++l) {
      for (int w = 0; w < 4; ++w) {
        const int64_t at = j + 4 * l + w;
        if (at >= count) break;
        const uint32_t bits = (127u << 23) | (words[w][l] & 0x7fffffu);
        float value;
        std::memcpy(&value, &bits, sizeof(value));
        u2[at] = value - 1.0f;
      }
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The AVX-512 path of a full chunk: the Philox blocks in registers (philox::Philox16) and their
// words unpacked by vector shuffles (the scalar unpacking, one element at a time, was a third
// of the op's time). The same bits as UnpackedChunk.

// (k + 1/2)·2^-64 of the 64-bit values k_l = low_l | high_l << 32, lanes in order.
inline __m512 RadiusUniforms(__m512i low, __m512i high) {
  const __m512i k_first = _mm512_or_si512(
      _mm512_cvtepu32_epi64(_mm512_castsi512_si256(low)),
      _mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(high)), 32));
  const __m512i k_second = _mm512_or_si512(
      _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(low, 1)),
      _mm512_slli_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(high, 1)), 32));
  const __m512 k = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtepu64_ps(k_first)),
                                      _mm512_cvtepu64_ps(k_second), 1);
  return _mm512_mul_ps(_mm512_add_ps(k, _mm512_set1_ps(0.5f)), _mm512_set1_ps(0x1p-64f));
}

// u1[0..31] of the 32 pairs whose radius bits are the 16 blocks from `counter`.
inline void RadiusChunk(uint64_t key, uint64_t low, uint64_t high, float* u1) {
  __m512i c[4];
  Philox16(key, low, high, c);
  const __m512 first = RadiusUniforms(c[0], c[1]), second = RadiusUniforms(c[2], c[3]);
  // Pair 2l takes block l's first 64 bits, pair 2l + 1 its second.
  const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(8));
  _mm512_store_ps(u1, _mm512_permutex2var_ps(first, even, second));
  _mm512_store_ps(u1 + 16, _mm512_permutex2var_ps(first, odd, second));
}

// u2[0..63] of the 64 pairs whose angle bits are the 16 blocks from `counter`: pair 4l + w
// takes word w of block l, 23 low bits as the mantissa of [1, 2), minus 1.
inline void AngleChunk(uint64_t key, uint64_t low, uint64_t high, float* u2) {
  __m512i c[4];
  Philox16(key, low, high, c);
  __m512 v[4];
  for (int w = 0; w < 4; ++w)
    v[w] = _mm512_sub_ps(
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(c[w], _mm512_set1_epi32(0x7fffff)),
                                            _mm512_set1_epi32(127 << 23))),
        _mm512_set1_ps(1.0f));
  // A 4 × 16 transpose: within each 128-bit lane, then across lanes.
  const __m512 t0 = _mm512_unpacklo_ps(v[0], v[1]), t1 = _mm512_unpackhi_ps(v[0], v[1]);
  const __m512 t2 = _mm512_unpacklo_ps(v[2], v[3]), t3 = _mm512_unpackhi_ps(v[2], v[3]);
  const __m512 s0 = _mm512_shuffle_ps(t0, t2, 0x44), s1 = _mm512_shuffle_ps(t0, t2, 0xEE);
  const __m512 s2 = _mm512_shuffle_ps(t1, t3, 0x44), s3 = _mm512_shuffle_ps(t1, t3, 0xEE);
  const __m512 a = _mm512_shuffle_f32x4(s0, s1, 0x44), b = _mm512_shuffle_f32x4(s2, s3, 0x44);
  const __m512 e = _mm512_shuffle_f32x4(s0, s1, 0xEE), f = _mm512_shuffle_f32x4(s2, s3, 0xEE);
  _mm512_store_ps(u2, _mm512_shuffle_f32x4(a, b, 0x88));
  _mm512_store_ps(u2 + 16, _mm512_shuffle_f32x4(a, b, 0xDD));
  _mm512_store_ps(u2 + 32, _mm512_shuffle_f32x4(e, f, 0x88));
  _mm512_store_ps(u2 + 48, _mm512_shuffle_f32x4(e, f, 0xDD));
}
#endif

// The key and counters of one draw, and its scale.
struct Draw {
  uint64_t key, radius_low, radius_high, angle_low, angle_high;
  float stddev;
};

// Reads inputs 0-2 (key, radius and angle counters) and 4 (stddev) of either op.
bool ReadDraw(OpKernelContext* ctx, Draw* draw) {
  const Tensor& key_t = ctx->input(0);
  const Tensor& radius_t = ctx->input(1);
  const Tensor& angle_t = ctx->input(2);
  if (key_t.NumElements() != 1 || radius_t.NumElements() != 2 || angle_t.NumElements() != 2) {
    ctx->SetStatus(::tensorflow::errors::InvalidArgument(
        "TfTemperedBoxMuller: key [1] and counters [2] expected"));
    return false;
  }
  *draw = {key_t.flat<uint64_t>()(0),    radius_t.flat<uint64_t>()(0),
           radius_t.flat<uint64_t>()(1), angle_t.flat<uint64_t>()(0),
           angle_t.flat<uint64_t>()(1),  ctx->input(4).scalar<float>()()};
  return true;
}

// Pairs first .. first + count - 1 (count ≤ kChunk, first a multiple of kChunk) into
// cos_vals and sin_vals; u1 and u2 are kChunk floats of scratch, 64-byte aligned.
inline void DrawChunk(const Draw& d, int64_t first, int64_t count, float* u1, float* u2,
                      float* cos_vals, float* sin_vals) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  if (count == kChunk) {
    for (int64_t j = 0; j < count; j += 2 * kLanes) {
      uint64_t low, high;
      Advance(d.radius_low, d.radius_high, static_cast<uint64_t>((first + j) / 2), &low, &high);
      RadiusChunk(d.key, low, high, u1 + j);
    }
    for (int64_t j = 0; j < count; j += 4 * kLanes) {
      uint64_t low, high;
      Advance(d.angle_low, d.angle_high, static_cast<uint64_t>((first + j) / 4), &low, &high);
      AngleChunk(d.key, low, high, u2 + j);
    }
  } else {
    UnpackedChunk(d.key, d.radius_low, d.radius_high, d.angle_low, d.angle_high, first, count,
                  u1, u2);
  }
#else
  UnpackedChunk(d.key, d.radius_low, d.radius_high, d.angle_low, d.angle_high, first, count, u1,
                u2);
#endif
  const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);
  Eigen::Map<Eigen::ArrayXf> radius(u1, count), angle(u2, count);
  Eigen::Map<Eigen::ArrayXf> out_cos(cos_vals, count), out_sin(sin_vals, count);
  radius = (-2.0f * radius.log()).sqrt() * d.stddev;
  angle = two_pi * angle;
  out_cos = radius * angle.cos();
  out_sin = radius * angle.sin();
}

// Runs work(first_chunk, end_chunk) over the chunks of num_pairs pairs on TF's CPU threads.
template <typename Work>
void ShardChunks(OpKernelContext* ctx, int64_t num_pairs, Work work) {
  const int64_t num_chunks = (num_pairs + kChunk - 1) / kChunk;
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(threads->num_threads, threads->workers, num_chunks, kChunk * 400, work);
}

// TfTemperedBoxMuller: the two halves, cos_half[j] = r_j·cos θ_j and sin_half[j] = r_j·sin θ_j.
class BoxMullerOp : public OpKernel {
 public:
  explicit BoxMullerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    Draw draw;
    if (!ReadDraw(ctx, &draw)) return;
    const Tensor& shape_t = ctx->input(3);
    OP_REQUIRES(ctx, shape_t.NumElements() == 1,
                ::tensorflow::errors::InvalidArgument("TfTemperedBoxMuller: shape [1] expected"));
    const int64_t num_pairs = shape_t.flat<int64_t>()(0);
    OP_REQUIRES(ctx, num_pairs >= 0,
                ::tensorflow::errors::InvalidArgument("TfTemperedBoxMuller: shape < 0"));
    Tensor* cos_t = nullptr;
    Tensor* sin_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_pairs}), &cos_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_pairs}), &sin_t));
    float* cos_out = cos_t->flat<float>().data();
    float* sin_out = sin_t->flat<float>().data();
    ShardChunks(ctx, num_pairs, [&](int64_t begin_chunk, int64_t end_chunk) {
      alignas(64) float u1[kChunk];
      alignas(64) float u2[kChunk];
      for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
        const int64_t first = chunk * kChunk;
        const int64_t count = std::min<int64_t>(kChunk, num_pairs - first);
        DrawChunk(draw, first, count, u1, u2, cos_out + first, sin_out + first);
      }
    });
  }
};

// TfTemperedBoxMullerPieces: the vector [cos_half; sin_half] of (Σ sizes + 1) / 2 pairs (its
// last value dropped when Σ sizes is odd) cut into consecutive pieces of `sizes`, written
// straight into them: DPRandomness.normal_pieces without the halves, their slices and the
// concatenation of the piece that straddles them (a copy of the largest variable's noise).
class BoxMullerPiecesOp : public OpKernel {
 public:
  explicit BoxMullerPiecesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    Draw draw;
    if (!ReadDraw(ctx, &draw)) return;
    const auto sizes = ctx->input(3).flat<int64_t>();
    const int num_pieces = static_cast<int>(sizes.size());
    OP_REQUIRES(ctx, num_pieces == num_outputs(),
                ::tensorflow::errors::InvalidArgument(
                    "TfTemperedBoxMullerPieces: ", num_outputs(), " sizes expected, got ",
                    num_pieces));
    std::vector<int64_t> offsets(num_pieces + 1, 0);  // piece i holds [offsets[i], offsets[i+1])
    std::vector<float*> pieces(num_pieces);
    for (int i = 0; i < num_pieces; ++i) {
      OP_REQUIRES(ctx, sizes(i) >= 0,
                  ::tensorflow::errors::InvalidArgument("TfTemperedBoxMullerPieces: size < 0"));
      offsets[i + 1] = offsets[i] + sizes(i);
      Tensor* piece = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({sizes(i)}), &piece));
      pieces[i] = piece->flat<float>().data();
    }
    const int64_t total = offsets[num_pieces];
    const int64_t num_pairs = (total + 1) / 2;
    // Copies values of the whole vector's positions [at, at + count) into their pieces.
    auto place = [&](int64_t at, const float* values, int64_t count) {
      count = std::min(count, total - at);
      int i = static_cast<int>(std::upper_bound(offsets.begin(), offsets.end(), at) -
                               offsets.begin()) - 1;
      while (count > 0) {
        while (offsets[i + 1] <= at) ++i;  // skip empty pieces
        const int64_t n = std::min(count, offsets[i + 1] - at);
        std::memcpy(pieces[i] + (at - offsets[i]), values, sizeof(float) * n);
        at += n;
        values += n;
        count -= n;
      }
    };
    ShardChunks(ctx, num_pairs, [&](int64_t begin_chunk, int64_t end_chunk) {
      alignas(64) float u1[kChunk];
      alignas(64) float u2[kChunk];
      alignas(64) float cos_vals[kChunk];
      alignas(64) float sin_vals[kChunk];
      for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
        const int64_t first = chunk * kChunk;
        const int64_t count = std::min<int64_t>(kChunk, num_pairs - first);
        DrawChunk(draw, first, count, u1, u2, cos_vals, sin_vals);
        place(first, cos_vals, count);
        place(num_pairs + first, sin_vals, count);
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("TfTemperedBoxMuller")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("shape")
                            .HostMemory("stddev"),
                        BoxMullerOp);
REGISTER_KERNEL_BUILDER(Name("TfTemperedBoxMullerPieces")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("sizes")
                            .HostMemory("stddev"),
                        BoxMullerPiecesOp);

}  // namespace
}  // namespace tf_tempered
