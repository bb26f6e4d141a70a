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
"""The randomness DP-SGD's guarantee rests on: Gaussian noise and Poisson batch membership.

(ε, δ) holds only if the noise added to every step, and which examples each
Poisson batch holds, are unpredictable to whoever sees the released model. A noise
vector derived from a public seed can be regenerated and subtracted, which leaves
the exact sum of clipped gradients; predictable batches void amplification by
subsampling. So every draw here comes from a Philox stream keyed by a 64-bit
secret read from the operating system's entropy (``secrets``), fresh for each
consumer (one per ``make_private`` model, one per ``poisson_batches`` dataset),
never from ``--seed``, ``keras.utils.set_random_seed`` or ``tf.random.set_seed``.

The key and a draw counter live in two untracked ``tf.Variable`` objects: their
values are not in traced graphs (nothing to leak through TensorBoard's graph
dump), not in ``model.weights``, checkpoints or ``model.keras``, and never printed.
Each draw is one stateless Philox call (``StatelessRandomUniformV2``,
XLA-compilable; normals by Box–Muller from its uniforms) at the 128-bit counter with ``c`` in
its high 64 bits and ``s·2^48`` in its low 64, where ``c`` is distinct per draw of a
stream ``s`` (0 unless a caller splits the key into streams, e.g. one per Poisson
shard), so no two draws share Philox blocks.

``insecure_dp_seed=K`` (an int) derives the key from K instead: reproducible, NOT
private, and it warns (the seeds and the opt-in: :mod:`~tf_tempered.privacy.dp_seeds`).

Philox-4x32-10 is a statistical generator (the one TensorFlow uses everywhere),
not a cryptographic one; what this module removes is the public seed.
``EngineOptions(noise="sum_of_gaussians")`` draws each noise coordinate as the sum of
four Box–Muller values instead (:mod:`~tf_tempered.privacy.hardened_noise`; the threat
model: docs/randomness.md).

>>> source = DPRandomness("noise")
>>> source.is_secret, "key" in repr(source)
(True, False)
>>> x = source.normal([3], stddev=1.0, counter=source.next_counter())
>>> x.shape
TensorShape([3])
"""

import secrets

import numpy as np

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import hardened_noise
from tf_tempered.privacy import native as native_ops
# The seeds (re-exported here, where callers import them from): privacy/dp_seeds.py.
from tf_tempered.privacy.dp_seeds import (INSECURE_NOTE, _derived, _warn_insecure,
                                          check_insecure_dp_seed, dp_seed, secret_seed)

__all__ = ["DPRandomness", "check_insecure_dp_seed",
           "gaussian_noise_like", "SAMPLERS", "secret_seed", "dp_seed", "INSECURE_NOTE"]

_PHILOX = 1  # tf.random.Algorithm.PHILOX
_STREAM_SHIFT = 48
_ANGLE_BLOCK_OFFSET = 1 << 47  # box_muller_uniforms: the angle's draw, half-way into the stream
MAX_STREAMS = 2 ** 15  # streams 0 .. 2^15 - 1 keep the int64 low word non-negative


def _to_int64(value):
    """The signed int64 with the same 64 bits as ``value`` (0 <= value < 2**64)."""
    return value - (1 << 64) if value >= (1 << 63) else value


class DPRandomness:
    """A Philox stream for one consumer of DP randomness, keyed by a secret.

    Args:
        purpose: a short name ("noise", "poisson"); with ``insecure_dp_seed`` it
            separates the streams derived from one seed.
        insecure_dp_seed: None (default): the key is ``secrets.randbits(64)``. An int:
            the key is derived from it (reproducible, not private; warns once).

    Keep instances out of Keras' tracking (``object.__setattr__``) so that neither
    variable is saved. Draws at one counter value repeat; use each value once
    (:meth:`next_counter`).
    """

    def __init__(self, purpose, *, insecure_dp_seed=None, name="insecure_dp_seed"):
        seed = check_insecure_dp_seed(insecure_dp_seed, name)
        self.purpose = purpose
        self.insecure_dp_seed = seed
        if seed is None:
            key = secrets.randbits(64)
        else:
            _warn_insecure(name, seed, stacklevel=4)  # at make_private's (...) caller
            key = _derived(seed, purpose)
        with tf.init_scope():  # created eagerly even if called while tracing
            self._key = tf.Variable(_to_int64(key), dtype=tf.int64, trainable=False,
                                    name=f"dp_{purpose}_key")
            # Under a tf.distribute strategy (created in its scope) one counter is
            # shared by the replicas: advanced once per synchronised call, every
            # replica reads the same value (a no-op outside strategies).
            self._counter = tf.Variable(
                0, dtype=tf.int64, trainable=False, name=f"dp_{purpose}_counter",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    @property
    def is_secret(self):
        """True unless built from ``insecure_dp_seed``."""
        return self.insecure_dp_seed is None

    def __repr__(self):  # never the key
        how = "secret" if self.is_secret else f"insecure_dp_seed={self.insecure_dp_seed}"
        return f"DPRandomness({self.purpose!r}, {how})"

    def next_counter(self):
        """A new counter value (int64 scalar tensor): 1, 2, 3, ... Stateful."""
        return self._counter.assign_add(1)

    def draws(self):
        """How many counter values were handed out (the DP steps of a model's noise)."""
        return int(keras_bridge.first_copy(self._counter).read_value().numpy())

    def _key_counter(self, counter, stream, *, block_offset=0):
        """Philox's 128-bit counter: draw counter c in the high 64 bits, the stream s in
        bits 48-62 of the low 64. A draw increments the low word from s·2^48, one per Philox
        block (4 float32 or 2 float64 values), so draws of different (s, c) never share a
        block (a draw would need 2^48 blocks to reach the next stream). A stream in the
        low word's bottom bits would make stream s + 1 the draw of stream s shifted by
        one block: correlated, not independent, Poisson shards. ``block_offset`` (< 2^48)
        starts a second draw of the same (s, c) that many blocks in."""
        key = tf.reshape(tf.bitcast(self._key.read_value(), tf.uint64), [1])
        counter = tf.cast(counter, tf.int64)
        low = tf.bitwise.left_shift(tf.cast(stream, tf.int64), _STREAM_SHIFT) + block_offset
        return key, tf.bitcast(tf.stack([low, counter]), tf.uint64)

    def normal(self, shape, *, stddev, counter, stream=0, dtype=tf.float32, pair_op=None):
        """N(0, stddev²) of ``shape``: Philox draws at ``(stream, counter)`` (_key_counter).

        ``stream`` (default 0) separates independent sub-streams of one key, e.g. the
        shards of :func:`~tf_tempered.privacy.sampling.poisson_batches`.

        Box–Muller on Philox draws (u₁, u₂) in vectorised TF ops:
        z = √(−2 ln u₁)·(cos 2πu₂, sin 2πu₂), two exact N(0, 1) per pair. Same
        distribution as ``StatelessRandomNormalV2``, whose CPU kernel runs the same
        transform one value at a time, slower (measurements: docs/engine.md, "How each
        layer's path is chosen"). u₁ = (k + ½)·2⁻⁶⁴ from 64 random bits k
        whatever ``dtype``: tails end where u₁ is smallest, at √(130 ln 2) ≈ 9.49σ, where float32
        uniforms (and TF's own float32 kernel) stop at √(46 ln 2) ≈ 5.65σ. A truncated tail
        is a privacy leak the accountant does not see: an output beyond the truncation point
        is impossible without an example and possible with it, which adds about
        T·q·Q(t − 1/σ) to δ (truncation t, T steps of sampling rate q, Q the normal tail).
        At t = 5.65, 60 epochs at σ = 1.1 would add 6.5e-5, more than δ = 1e-5; at t = 9.49,
        below 1e-15 for any σ ≥ 0.5 and a million epochs.
        """
        num_values = tf.reduce_prod(tf.cast(shape, tf.int64))
        cos, sin = self.box_muller((num_values + 1) // 2, stddev=stddev, counter=counter,
                                   stream=stream, dtype=dtype, pair_op=pair_op)
        return tf.reshape(tf.concat([cos, sin], axis=0)[:num_values], shape)

    def normal_pieces(self, sizes, *, stddev, counter, stream=0, dtype=tf.float32,
                      pair_op=None, pieces_op=None):
        """``normal([sum(sizes)])`` cut into consecutive pieces of ``sizes``, without that vector.

        The same values: the draw is the two halves r·cos θ and r·sin θ one after the other,
        so each piece is a slice of one half (two slices for the piece across the middle).
        Forming the whole vector and splitting it would copy every value twice more (a
        50 000 × 64 embedding: 2 × 12.8 MB, held at the step's peak). ``pieces_op(key,
        radius_counter, angle_counter, sizes, stddev)``, if given (float32), writes the same
        values straight into the pieces (the native op: no halves, and no copy for the piece
        across the middle, in a text model its largest).

        >>> import warnings
        >>> with warnings.catch_warnings():  # a public seed, for the example only
        ...     warnings.simplefilter("ignore")
        ...     source = DPRandomness("doctest", insecure_dp_seed=0)
        >>> pieces = source.normal_pieces([3, 2, 4], stddev=1.0, counter=0)
        >>> whole = source.normal([9], stddev=1.0, counter=0)
        >>> bool(tf.reduce_all(tf.concat(pieces, 0) == whole)), [int(p.shape[0]) for p in pieces]
        (True, [3, 2, 4])
        """
        if pieces_op is not None and tf.as_dtype(dtype) == tf.float32 and sizes:
            key, radius_counter = self._key_counter(counter, stream)
            _, angle_counter = self._key_counter(counter, stream,
                                                 block_offset=_ANGLE_BLOCK_OFFSET)
            return pieces_op(key, radius_counter, angle_counter, sizes, stddev)
        num_pairs = (sum(sizes) + 1) // 2
        cos, sin = self.box_muller(num_pairs, stddev=stddev, counter=counter, stream=stream,
                                   dtype=dtype, pair_op=pair_op)
        pieces, start = [], 0
        for size in sizes:
            end = start + size
            if end <= num_pairs:
                pieces.append(cos[start:end])
            elif start >= num_pairs:
                pieces.append(sin[start - num_pairs:end - num_pairs])
            else:
                pieces.append(tf.concat([cos[start:], sin[:end - num_pairs]], 0))
            start = end
        return pieces

    def box_muller(self, num_pairs, *, stddev, counter, stream=0, dtype=tf.float32,
                   pair_op=None):
        """(r·cos θ, r·sin θ): two [num_pairs] N(0, stddev²) vectors, pair j at index j of both.

        From :meth:`box_muller_uniforms` at ``(stream, counter)``: the draw of :meth:`normal`, which
        returns the two halves one after the other; a sampler that combines values
        (:mod:`~tf_tempered.privacy.hardened_noise`) must not add up the two of one pair.
        ``pair_op(key, radius_counter, angle_counter, num_pairs, stddev)``, if given, computes
        the same pairs from the same Philox bits in one kernel, for float32 (the native op:
        ``tf_tempered.privacy.native.box_muller``, equal to these TF ops to float32 rounding).
        """
        if pair_op is not None and tf.as_dtype(dtype) == tf.float32:
            key, radius_counter = self._key_counter(counter, stream)
            _, angle_counter = self._key_counter(counter, stream,
                                                 block_offset=_ANGLE_BLOCK_OFFSET)
            return pair_op(key, radius_counter, angle_counter, num_pairs, stddev)
        radius_uniform, angle_uniform = self.box_muller_uniforms(num_pairs, counter=counter,
                                                                 stream=stream, dtype=dtype)
        radius = tf.cast(tf.sqrt(-2.0 * tf.math.log(radius_uniform)), dtype)
        radius *= tf.cast(stddev, dtype)
        angle = tf.cast(2.0 * np.pi, dtype) * angle_uniform
        return radius * tf.cos(angle), radius * tf.sin(angle)

    def box_muller_uniforms(self, num_pairs, *, counter, stream=0, dtype=tf.float32):
        """(u₁, u₂) of :meth:`box_muller`: [num_pairs] values u₁ = (k + ½)·2⁻⁶⁴ in (0, 1]
        from 64 random bits k each, for the radius, and [num_pairs] uniforms for the angle.

        u₁ is computed in float32 (float64 for a float64 ``dtype``): float32 holds (k + ½)·2⁻⁶⁴
        down to its smallest, 2⁻⁶⁵, so √(−2 ln u₁) reaches √(130 ln 2) ≈ 9.49σ (:meth:`normal`);
        its rounding near 1 (u₁ = 1 gives r = 0) is float32's relative 2⁻²⁴. This is faster than
        float64 uniforms with a float64 logarithm (the previous draw, tails to 8.49σ;
        measurements: docs/randomness.md, "The generator"), and the
        angle, used in ``dtype`` anyway, is a float32 (float64) uniform.
        The two are separate Philox draws at ``(stream, counter)``, the angle's starting
        2^47 blocks into the stream (n 64-bit values take n/2 blocks): no shared block.
        """
        key, radius_counter = self._key_counter(counter, stream)
        _, angle_counter = self._key_counter(counter, stream, block_offset=_ANGLE_BLOCK_OFFSET)
        num_pairs = tf.reshape(tf.cast(num_pairs, tf.int64), [1])
        compute_dtype = tf.float64 if tf.as_dtype(dtype) == tf.float64 else tf.float32
        radius_bits = tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=num_pairs, key=key, counter=radius_counter, alg=_PHILOX, dtype=tf.uint64)
        radius_uniform = (tf.cast(radius_bits, compute_dtype) + 0.5) * (2.0 ** -64)
        angle_uniform = tf.raw_ops.StatelessRandomUniformV2(
            shape=num_pairs, key=key, counter=angle_counter, alg=_PHILOX, dtype=compute_dtype)
        return radius_uniform, tf.cast(angle_uniform, dtype)

    def uniform(self, shape, *, counter, stream=0, dtype=tf.float64):
        """U[0, 1) of ``shape``: one Philox draw at ``(stream, counter)`` (_key_counter)."""
        key, counter = self._key_counter(counter, stream)
        return tf.raw_ops.StatelessRandomUniformV2(shape=shape, key=key, counter=counter,
                                                   alg=_PHILOX, dtype=dtype)


# EngineOptions.noise -> its draw: (source, shape, *, stddev, counter) -> N(0, stddev²).
SAMPLERS = {
    "gaussian": lambda source, shape, **kwargs: source.normal(shape, **kwargs),
    "sum_of_gaussians": hardened_noise.sum_of_gaussians,
}


def gaussian_noise_like(variables, stddev, source, counter, *, mode="gaussian", pair_op=None,
                        native=False):
    """Independent N(0, stddev²) noise shaped like each variable, from ``source``.

    One Philox draw for all coordinates at a fresh counter of the model's secret
    stream (a DPRandomness): several times faster on CPU than one stateful
    tf.random.normal per variable, same distribution. ``mode`` (``EngineOptions.noise``):
    "gaussian", Box–Muller (:meth:`DPRandomness.normal`); "sum_of_gaussians", the sum
    of 4 draws of std stddev/2 (:mod:`~tf_tempered.privacy.hardened_noise`), 4× the cost.
    ``pair_op``: the Box–Muller kernel of :meth:`DPRandomness.box_muller` (None: TF ops);
    ``native=True`` (EngineOptions.native: off under XLA) takes the native ops when they are
    usable for this many values (CPU; the same normals to float32 rounding, 3.5x faster
    on the AVX-512 host, benchmarks/results/noise_native.md).
    """
    if mode not in SAMPLERS:
        raise ValueError(f"gaussian_noise_like: mode must be one of {', '.join(SAMPLERS)} "
                         f"(EngineOptions.noise), got {mode!r}.")
    sizes = [int(np.prod(v.shape)) for v in variables]
    pieces_op = None
    if pair_op is None and native and native_ops.usable(sum(sizes)):
        pair_op, pieces_op = native_ops.box_muller, native_ops.box_muller_pieces
    if mode == "gaussian":  # DPRandomness.normal's values, without the whole vector
        pieces = source.normal_pieces(sizes, stddev=stddev, counter=counter, pair_op=pair_op,
                                      pieces_op=pieces_op)
    else:
        pieces = tf.split(SAMPLERS[mode](source, [sum(sizes)], stddev=stddev, counter=counter,
                                         pair_op=pair_op), sizes)
    return [tf.reshape(n, v.shape) for n, v in zip(pieces, variables)]
