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
// functions (tests/test_noise_native.py).

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

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

constexpr uint32_t kW32A = 0x9E3779B9u, kW32B = 0xBB67AE85u;
constexpr uint32_t kM4x32A = 0xD2511F53u, kM4x32B = 0xCD9E8D57u;
constexpr int kLanes = 16;       // Philox blocks computed side by side
constexpr int64_t kChunk = 2048;  // pairs per unit of work (a multiple of 4 · kLanes)

// Philox-4x32-10 of kLanes consecutive 128-bit counters start, start + 1, ...: words[w][l]
// is word w of block l. With AVX-512 or AVX2 the lanes are vector lanes (the 32 × 32 → 64-bit
// products of even and odd lanes by two vpmuludq), else a scalar loop.
inline void PhiloxBlocks(uint64_t key, uint64_t counter_low, uint64_t counter_high,
                         uint32_t words[4][kLanes]) {
  alignas(64) uint32_t c[4][kLanes];
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t low = counter_low + static_cast<uint64_t>(l);
    const uint64_t high = counter_high + (low < counter_low ? 1 : 0);  // carry
    c[0][l] = static_cast<uint32_t>(low);
    c[1][l] = static_cast<uint32_t>(low >> 32);
    c[2][l] = static_cast<uint32_t>(high);
    c[3][l] = static_cast<uint32_t>(high >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#if defined(__AVX512F__)
  __m512i c0 = _mm512_load_si512(c[0]), c1 = _mm512_load_si512(c[1]);
  __m512i c2 = _mm512_load_si512(c[2]), c3 = _mm512_load_si512(c[3]);
  const __m512i ma = _mm512_set1_epi32(static_cast<int>(kM4x32A));
  const __m512i mb = _mm512_set1_epi32(static_cast<int>(kM4x32B));
  for (int round = 0; round < 10; ++round) {
    const __m512i pa_even = _mm512_mul_epu32(c0, ma);
    const __m512i pa_odd = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), ma);
    const __m512i pb_even = _mm512_mul_epu32(c2, mb);
    const __m512i pb_odd = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), mb);
    const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, pa_even, _mm512_slli_epi64(pa_odd, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pa_even, 32), pa_odd);
    const __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, pb_even, _mm512_slli_epi64(pb_odd, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pb_even, 32), pb_odd);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1),
                                        _mm512_set1_epi32(static_cast<int>(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3),
                                        _mm512_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW32A;
    k1 += kW32B;
  }
  _mm512_store_si512(words[0], c0);
  _mm512_store_si512(words[1], c1);
  _mm512_store_si512(words[2], c2);
  _mm512_store_si512(words[3], c3);
#elif defined(__AVX2__)
  for (int half = 0; half < kLanes; half += 8) {
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[0] + half));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[1] + half));
    __m256i c2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[2] + half));
    __m256i c3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(c[3] + half));
    const __m256i ma = _mm256_set1_epi32(static_cast<int>(kM4x32A));
    const __m256i mb = _mm256_set1_epi32(static_cast<int>(kM4x32B));
    uint32_t r0 = k0, r1 = k1;
    for (int round = 0; round < 10; ++round) {
      const __m256i pa_even = _mm256_mul_epu32(c0, ma);
      const __m256i pa_odd = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), ma);
      const __m256i pb_even = _mm256_mul_epu32(c2, mb);
      const __m256i pb_odd = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), mb);
      const __m256i lo0 = _mm256_blend_epi32(pa_even, _mm256_slli_epi64(pa_odd, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pa_even, 32), pa_odd, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(pb_even, _mm256_slli_epi64(pb_odd, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pb_even, 32), pb_odd, 0xAA);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1),
                                          _mm256_set1_epi32(static_cast<int>(r0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3),
                                          _mm256_set1_epi32(static_cast<int>(r1)));
      c0 = n0;
      c1 = lo1;
      c2 = n2;
      c3 = lo0;
      r0 += kW32A;
      r1 += kW32B;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[0] + half), c0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[1] + half), c1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[2] + half), c2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words[3] + half), c3);
  }
#else
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(kM4x32A) * c[0][l];
      const uint64_t p1 = static_cast<uint64_t>(kM4x32B) * c[2][l];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1][l] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3][l] ^ k1;
      c[1][l] = static_cast<uint32_t>(p1);
      c[3][l] = static_cast<uint32_t>(p0);
      c[0][l] = n0;
      c[2][l] = n2;
    }
    k0 += kW32A;
    k1 += kW32B;
  }
  std::memcpy(words, c, sizeof(c));
#endif
}

// Adds `blocks` to a 128-bit counter (low, high).
inline void Advance(uint64_t low, uint64_t high, uint64_t blocks, uint64_t* out_low,
                    uint64_t* out_high) {
  *out_low = low + blocks;
  *out_high = high + (*out_low < low ? 1 : 0);
}

class BoxMullerOp : public OpKernel {
 public:
  explicit BoxMullerOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& key_t = ctx->input(0);
    const Tensor& radius_t = ctx->input(1);
    const Tensor& angle_t = ctx->input(2);
    const Tensor& shape_t = ctx->input(3);
    OP_REQUIRES(ctx, key_t.NumElements() == 1 && radius_t.NumElements() == 2 &&
                         angle_t.NumElements() == 2 && shape_t.NumElements() == 1,
                ::tensorflow::errors::InvalidArgument(
                    "TfTemperedBoxMuller: key [1], counters [2] and shape [1] expected"));
    const int64_t num_pairs = shape_t.flat<int64_t>()(0);
    OP_REQUIRES(ctx, num_pairs >= 0,
                ::tensorflow::errors::InvalidArgument("TfTemperedBoxMuller: shape < 0"));
    const uint64_t key = key_t.flat<uint64_t>()(0);
    const uint64_t radius_low = radius_t.flat<uint64_t>()(0);
    const uint64_t radius_high = radius_t.flat<uint64_t>()(1);
    const uint64_t angle_low = angle_t.flat<uint64_t>()(0);
    const uint64_t angle_high = angle_t.flat<uint64_t>()(1);
    const float stddev = ctx->input(4).scalar<float>()();
    Tensor* cos_t = nullptr;
    Tensor* sin_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({num_pairs}), &cos_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_pairs}), &sin_t));
    float* cos_out = cos_t->flat<float>().data();
    float* sin_out = sin_t->flat<float>().data();
    const float two_pi = static_cast<float>(2.0 * 3.14159265358979323846);

    auto work = [&](int64_t begin_chunk, int64_t end_chunk) {
      alignas(64) float u1[kChunk];
      alignas(64) float u2[kChunk];
      alignas(64) uint32_t words[4][kLanes];
      for (int64_t chunk = begin_chunk; chunk < end_chunk; ++chunk) {
        const int64_t first = chunk * kChunk;  // a multiple of 4 · kLanes
        const int64_t count = std::min<int64_t>(kChunk, num_pairs - first);
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
        Eigen::Map<Eigen::ArrayXf> radius(u1, count), angle(u2, count);
        Eigen::Map<Eigen::ArrayXf> out_cos(cos_out + first, count), out_sin(sin_out + first, count);
        radius = (-2.0f * radius.log()).sqrt() * stddev;
        angle = two_pi * angle;
        out_cos = radius * angle.cos();
        out_sin = radius * angle.sin();
      }
    };
    const int64_t num_chunks = (num_pairs + kChunk - 1) / kChunk;
    auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(threads->num_threads, threads->workers, num_chunks, kChunk * 400, work);
  }
};

REGISTER_KERNEL_BUILDER(Name("TfTemperedBoxMuller")
                            .Device(::tensorflow::DEVICE_CPU)
                            .HostMemory("shape")
                            .HostMemory("stddev"),
                        BoxMullerOp);

}  // namespace
}  // namespace tf_tempered
