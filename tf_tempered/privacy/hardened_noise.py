# Copyright 2026 The tf_tempered Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Hardened Gaussian noise, opt-in: ``EngineOptions(noise="sum_of_gaussians")``.

The default sampler (:meth:`DPRandomness.normal`, Box–Muller on Philox uniforms)
hands out both values of each Box–Muller pair, from which the pair's two uniforms can
be read back to the precision of the output (about 2 × 23 bits of Philox output in
float32). Holohan & Braghin (ESORICS 2021, the construction of Opacus'
``secure_mode``) draw N(0, σ²) instead as

    Z = Z₁ + Z₂ + Z₃ + Z₄,    Zᵢ ~ N(0, (σ/2)²) independent,

exactly N(0, σ²) in real arithmetic. Each Zᵢ comes from its own Box–Muller pair: the
two values of one pair must not meet in a sum (r·cos θ + r·sin θ = √2·r·sin(θ + π/4)
is just one scaled sample). A released coordinate is then a sum of four samples,
which cannot be split back into them, and the tails reach 4 × 9.49σ/2 = 19σ. Four
times the draws of the default (benchmarks/results/noise_modes.md). What it does and
does not protect against: docs/randomness.md, "Hardened noise".

>>> from tf_tempered.privacy.randomness import DPRandomness
>>> source = DPRandomness("noise")
>>> sum_of_gaussians(source, [2, 3], stddev=1.0, counter=source.next_counter()).shape
TensorShape([2, 3])
"""

import numpy as np

from tf_tempered._compat import tf

# Four terms: Holohan & Braghin's 2n samples with n = 2, Opacus' choice.
__all__ = ["sum_of_gaussians"]


def sum_of_gaussians(source, shape, *, stddev, counter, stream=0, dtype=tf.float32,
                     pair_op=None):
    """N(0, stddev²) of ``shape`` as the sum of 4 independent N(0, (stddev/2)²).

    One Philox draw at ``(stream, counter)`` of ``source`` (a
    :class:`~tf_tempered.privacy.randomness.DPRandomness`): with m = max(size, 2), the
    2m + 1 Box–Muller pairs (c_j, s_j) = r_j·(cos θ_j, sin θ_j) of
    :meth:`~tf_tempered.privacy.randomness.DPRandomness.box_muller` give value i as

        c_i + c_{m+i} + s_{i+1} + s_{m+i+1},

    four different pairs as m ≥ 2 (``pair_op``: box_muller's kernel). Four contiguous
    slices: faster than summing the rows of an [m, 4] matrix of values
    (docs/randomness.md, "Measured cost").

    >>> from tf_tempered.privacy.randomness import DPRandomness
    >>> source = DPRandomness("noise")
    >>> draw = sum_of_gaussians(source, [40_000], stddev=2.0, counter=1)
    >>> round(float(tf.math.reduce_std(draw)), 1)  # ± 0.007 (one standard error)
    2.0
    """
    size = int(np.prod(shape))
    m = max(size, 2)
    cos, sin = source.box_muller(2 * m + 1, stddev=tf.cast(stddev, dtype) / 2.0,
                                 counter=counter, stream=stream, dtype=dtype, pair_op=pair_op)
    total = cos[:m] + cos[m:2 * m] + sin[1:m + 1] + sin[m + 1:]
    return tf.reshape(total[:size], shape)
