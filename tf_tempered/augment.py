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
"""Augmentation multiplicity for DP-SGD (De et al. 2022, "Unlocking high-accuracy DP image
classification through scale").

Each example of a batch is replaced by K augmented copies, consecutive in the batch
(rows i·K … i·K+K−1 are example i), and the model is prepared with
``make_private(..., augmentation_multiplicity=K)``: example i's gradient is the mean
over its copies, clipped once,

    g_i = clip_C( (1/K) Σ_k ∇ℓ(aug_k(x_i), y_i) ),

so the sensitivity (C), the normaliser and ε are those of per-example clipping:
augmentation multiplicity costs compute, not privacy. The augmentations' randomness
need not be secret: it is drawn independently of the data and acts inside each
example's clipped term, so the DP guarantee holds for every value of it.

>>> import numpy as np
>>> ds = tf.data.Dataset.from_tensor_slices((np.zeros((4, 6, 6, 1), "float32"),
...                                          np.arange(4))).batch(2)
>>> x, y = next(iter(augmult_batches(ds, multiplicity=3, max_shift=1, seed=0)))
>>> x.shape, y.numpy().tolist()
(TensorShape([6, 6, 6, 1]), [0, 0, 0, 1, 1, 1])
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import data_sampling

__all__ = ["augmult_batches", "declare_copies", "draw_variants", "pick_variants",
           "random_shift_flip"]


def random_shift_flip(images, *, max_shift, flip, seed):
    """Each image shifted by an independent uniform (dy, dx) in [−max_shift, max_shift]²
    (zero fill) and, with ``flip``, mirrored left-right with probability 1/2.

    ``images``: [N, H, W, C]; ``seed``: a stateless seed, shape [2] (int).
    Shifting by s and padding with zeros is a random crop of the image padded by s.

    >>> x = tf.reshape(tf.range(9, dtype=tf.float32), [1, 3, 3, 1])
    >>> random_shift_flip(x, max_shift=0, flip=False, seed=[1, 2]).numpy().ravel().tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    """
    images = tf.convert_to_tensor(images)
    if images.shape.rank != 4:
        raise ValueError(f"random_shift_flip expects images of shape [N, H, W, C], got "
                         f"{images.shape}. Fix: add a channel axis (e.g. x[..., None]).")
    n, h, w = tf.shape(images)[0], images.shape[1], images.shape[2]
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 2)
    if max_shift:
        s = int(max_shift)
        padded = tf.pad(images, [[0, 0], [s, s], [s, s], [0, 0]])
        offsets = tf.random.stateless_uniform([n, 2], seeds[0], minval=0, maxval=2 * s + 1,
                                              dtype=tf.int32)
        rows = offsets[:, :1] + tf.range(h)[None]  # [N, H] rows of the padded image
        cols = offsets[:, 1:] + tf.range(w)[None]
        images = tf.gather(padded, rows, axis=1, batch_dims=1)
        images = tf.gather(images, cols, axis=2, batch_dims=1)
    if flip:
        mirror = tf.random.stateless_uniform([n], seeds[1]) < 0.5
        images = tf.where(mirror[:, None, None, None], images[:, :, ::-1], images)
    return images


def draw_variants(n, multiplicity, variants, seed):
    """[n, multiplicity] int32, uniform in [0, variants): which variant each copy takes.

    The draw of :func:`pick_variants`, shared with
    :meth:`tf_tempered.scatternet.ShiftedFeatures.copies` (which reads the variants
    from disk): the same seed picks the same variants in both.

    >>> draw_variants(2, 3, 9, seed=[0, 1]).shape
    TensorShape([2, 3])
    """
    return tf.random.stateless_uniform([n, multiplicity], tf.cast(seed, tf.int64), minval=0,
                                       maxval=variants, dtype=tf.int32)


def pick_variants(x, multiplicity, seed):
    """K copies of each example, each a uniformly random one of its precomputed variants.

    ``x``: [B, V, ...] (V variants of each example, e.g.
    :func:`tf_tempered.scatternet.shifted_scattering_features` with ``cache=False``; the
    cached ones stay on disk and pick their variants with
    :meth:`~tf_tempered.scatternet.ShiftedFeatures.copies`); returns [B·K, ...]
    float32, the K copies of example i consecutive (rows i·K … i·K+K−1), as
    :func:`augmult_batches` lays them out. ``seed``: a stateless seed, shape [2].

    >>> x = tf.reshape(tf.range(6, dtype=tf.float32), [2, 3])   # 2 examples, 3 variants
    >>> copies = pick_variants(x, 4, seed=[0, 1]).numpy()
    >>> copies.shape, bool(set(copies[:4]) <= {0, 1, 2}), bool(set(copies[4:]) <= {3, 4, 5})
    ((8,), True, True)
    """
    x = tf.convert_to_tensor(x)
    which = draw_variants(tf.shape(x)[0], multiplicity, x.shape[1], seed)
    copies = tf.gather(x, which, axis=1, batch_dims=1)  # [B, K, ...]
    return tf.cast(tf.reshape(copies, tf.concat([[-1], tf.shape(x)[2:]], 0)), tf.float32)


def augmult_batches(dataset, *, multiplicity, max_shift=0, flip=False, augment=None,
                    copies=None, seed=None):
    """``dataset``'s batches with each example repeated ``multiplicity`` times, augmented.

    ``dataset`` yields (x, y) or (x, y, sample_weight) batches, e.g. from
    :func:`tf_tempered.privacy.poisson_batches` (whose mask is repeated with the
    rows and whose expected batch size, counted in examples, is kept). Copies are
    augmented by ``augment(images, seed)`` if given, else by
    :func:`random_shift_flip` with ``max_shift`` and ``flip``; or ``copies(x, K, seed)``
    makes them from the batch's x directly, [B·K, ...] consecutive per example (e.g.
    :func:`pick_variants` when x holds precomputed variants). ``seed`` (public)
    makes the augmentations reproducible; None draws it once at random.
    """
    if isinstance(multiplicity, bool) or not isinstance(multiplicity, int) or multiplicity < 1:
        raise ValueError(f"multiplicity={multiplicity!r} is invalid: it must be an int >= 1 "
                         "(augmented copies of each example). Fix: e.g. multiplicity=4.")
    if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 0:
        raise ValueError(f"max_shift={max_shift!r} is invalid: it must be an int >= 0 "
                         "(pixels). Fix: e.g. max_shift=2.")
    k = multiplicity
    if augment is None:
        def augment(images, s):
            return random_shift_flip(images, max_shift=max_shift, flip=flip, seed=s)
    if seed is None:
        seed = int(tf.random.uniform([], maxval=2**31 - 1, dtype=tf.int32))
    # Fresh augmentations every epoch (each iteration of the dataset).
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

    def repeat(t):
        return tf.repeat(t, k, axis=0)

    def expand(batch, s):
        x, y, *rest = batch
        x = augment(repeat(x), s) if copies is None else copies(x, k, s)
        y = tf.nest.map_structure(repeat, y)
        if rest:
            weight = rest[0]
            if isinstance(weight, dict) and "expected_batch_size" in weight:
                weight = {key: value if key == "expected_batch_size" else repeat(value)
                          for key, value in weight.items()}
            else:
                weight = tf.nest.map_structure(repeat, weight)
            return x, y, weight
        return x, y

    expanded = tf.data.Dataset.zip((dataset, seeds)).map(
        lambda batch, s: expand(batch, s), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True).prefetch(tf.data.AUTOTUNE)
    # The examples are sampled as the input's were (each example's copies form one
    # microbatch): the accounting reads the input's sampling.
    sampling = data_sampling.sampling_of(dataset)
    # Batches of augmult_batches already: each of their K₁ copies is repeated K times, in
    # order, so each example's K₁·K copies stay consecutive (probe Y: the outer K alone was
    # declared, and make_private(augmentation_multiplicity=K) clipped one example as K₁
    # groups, moving the sum by K₁·C against noise for C, at the same logged ε).
    inner = data_sampling.copies_of(dataset)
    if inner is None and data_sampling.copies_below(dataset):
        data_sampling.refuse_mismatched_copies(k, dataset)  # regrouped: refused, naming why
    expanded = declare_copies(expanded, multiplicity=k * (inner or 1))
    return expanded if sampling is None else data_sampling.tag_dataset(expanded, sampling)


def declare_copies(dataset, *, multiplicity):
    """Declares that every batch of ``dataset`` holds ``multiplicity`` consecutive copies
    of each example ([B·K, ...]: example i's copies are rows i·K ... i·K + K − 1), as
    :func:`augmult_batches` makes them, for a model made private with
    ``augmentation_multiplicity=multiplicity`` (fit refuses other batches on such a
    model: K different examples would be clipped together as one). Returns ``dataset``.
    """
    if isinstance(multiplicity, bool) or not isinstance(multiplicity, int) or multiplicity < 1:
        raise ValueError(f"multiplicity={multiplicity!r} is invalid: it must be an int >= 1 "
                         "(augmented copies of each example). Fix: e.g. multiplicity=4.")
    return data_sampling.tag_copies(dataset, multiplicity)
