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
// Philox-4x32-10 (Salmon et al., SC 2011), the counter-based generator of TF's stateless random
// ops, over many consecutive 128-bit counters at once: block b of a draw is Philox(key,
// counter + b), the bits TF's kernels give at the same key and counter.

#ifndef TF_TEMPERED_NATIVE_CC_PHILOX_H_
#define TF_TEMPERED_NATIVE_CC_PHILOX_H_

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tf_tempered {
namespace philox {

constexpr uint32_t kW32A = 0x9E3779B9u, kW32B = 0xBB67AE85u;
constexpr uint32_t kM4x32A = 0xD2511F53u, kM4x32B = 0xCD9E8D57u;
constexpr int kLanes = 16;  // Philox blocks computed side by side

// The 128-bit counters low + l (carrying into high), l = 0 .. kLanes - 1, as words c[w][l].
inline void CounterWords(uint64_t counter_low, uint64_t counter_high, uint32_t c[4][kLanes]) {
  for (int l = 0; l < kLanes; ++l) {
    const uint64_t low = counter_low + static_cast<uint64_t>(l);
    const uint64_t high = counter_high + (low < counter_low ? 1 : 0);  // carry
    c[0][l] = static_cast<uint32_t>(low);
    c[1][l] = static_cast<uint32_t>(low >> 32);
    c[2][l] = static_cast<uint32_t>(high);
    c[3][l] = static_cast<uint32_t>(high >> 32);
  }
}

#if defined(__AVX512F__)
// The ten rounds on 16 blocks in place, lane l of c[w] word w of block l (the 32 × 32 → 64-bit
// products of even and odd lanes by two vpmuludq).
inline void Rounds16(uint64_t key, __m512i c[4]) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  const __m512i ma = _mm512_set1_epi32(static_cast<int>(kM4x32A));
  const __m512i mb = _mm512_set1_epi32(static_cast<int>(kM4x32B));
  for (int round = 0; round < 10; ++round) {
    const __m512i pa_even = _mm512_mul_epu32(c[0], ma);
    const __m512i pa_odd = _mm512_mul_epu32(_mm512_srli_epi64(c[0], 32), ma);
    const __m512i pb_even = _mm512_mul_epu32(c[2], mb);
    const __m512i pb_odd = _mm512_mul_epu32(_mm512_srli_epi64(c[2], 32), mb);
    const __m512i lo0 = _mm512_mask_blend_epi32(0xAAAA, pa_even, _mm512_slli_epi64(pa_odd, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pa_even, 32), pa_odd);
    const __m512i lo1 = _mm512_mask_blend_epi32(0xAAAA, pb_even, _mm512_slli_epi64(pb_odd, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pb_even, 32), pb_odd);
    c[0] = _mm512_xor_si512(_mm512_xor_si512(hi1, c[1]), _mm512_set1_epi32(static_cast<int>(k0)));
    c[2] = _mm512_xor_si512(_mm512_xor_si512(hi0, c[3]), _mm512_set1_epi32(static_cast<int>(k1)));
    c[1] = lo1;
    c[3] = lo0;
    k0 += kW32A;
    k1 += kW32B;
  }
}

// Philox-4x32-10 of the 16 counters (low + l, high), l = 0..15, left in registers: c[w] lane l
// is word w of block l. The counters are set up by vector adds unless word 0 carries (then
// as PhiloxBlocks does): the scalar setup cost as much as the rounds.
inline void Philox16(uint64_t key, uint64_t counter_low, uint64_t counter_high, __m512i c[4]) {
  if ((counter_low & 0xffffffffu) <= 0xffffffffu - (kLanes - 1)) {  // no carry out of word 0
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    c[0] = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(counter_low)), iota);
    c[1] = _mm512_set1_epi32(static_cast<int>(counter_low >> 32));
    c[2] = _mm512_set1_epi32(static_cast<int>(counter_high));
    c[3] = _mm512_set1_epi32(static_cast<int>(counter_high >> 32));
  } else {
    alignas(64) uint32_t words[4][kLanes];
    CounterWords(counter_low, counter_high, words);
    for (int w = 0; w < 4; ++w) c[w] = _mm512_load_si512(words[w]);
  }
  Rounds16(key, c);
}
#endif

// Philox-4x32-10 of kLanes consecutive 128-bit counters start, start + 1, ...: words[w][l]
// is word w of block l. With AVX-512 or AVX2 the lanes are vector lanes, else a scalar loop.
inline void PhiloxBlocks(uint64_t key, uint64_t counter_low, uint64_t counter_high,
                         uint32_t words[4][kLanes]) {
#if defined(__AVX512F__)
  __m512i c[4];
  Philox16(key, counter_low, counter_high, c);
  for (int w = 0; w < 4; ++w) _mm512_storeu_si512(words[w], c[w]);
#else
  alignas(64) uint32_t c[4][kLanes];
  CounterWords(counter_low, counter_high, c);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#if defined(__AVX2__)
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
#endif
}

// Adds `blocks` to a 128-bit counter (low, high).
inline void Advance(uint64_t low, uint64_t high, uint64_t blocks, uint64_t* out_low,
                    uint64_t* out_high) {
  *out_low = low + blocks;
  *out_high = high + (*out_low < low ? 1 : 0);
}

}  // namespace philox
}  // namespace tf_tempered

#endif  // TF_TEMPERED_NATIVE_CC_PHILOX_H_
