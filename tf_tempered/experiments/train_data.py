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
"""The train script's batches: Poisson or shuffled sampling, then augmentation copies."""

import numpy as np

from tf_tempered import augment, scatternet
from tf_tempered._compat import tf
from tf_tempered.privacy import data_sampling, randomness, sampling

__all__ = ["sampled_batches", "training_batches"]


def training_batches(config, plan, x, y, strategy=None):
    """The run's training batches: sampled as config.sampling says, then K augmented
    copies of each example with --augmult=K (x: the features of every shift, [N, V, ...],
    for ScatterNet features; a scatternet.ShiftedFeatures stays on disk: the batches
    sample its file rows, and each copy reads the features of its shift)."""
    if isinstance(x, scatternet.ShiftedFeatures):
        # Batches of file rows + 1 (8 bytes an example; Poisson padding is 0, read as zeros,
        # as padding is elsewhere): the features are read per batch.
        batches = sampled_batches(config, plan, x.rows + 1, y, strategy)
        return augment.augmult_batches(
            batches, multiplicity=config.augmult, seed=config.seed,
            copies=lambda rows, k, seed: x.copies(rows - 1, k, seed))
    batches = sampled_batches(config, plan, x, y, strategy)
    if config.augmult == 1:
        return batches
    # Public augmentation randomness (see tf_tempered.augment): from --seed. ScatterNet
    # features: x holds each example's shifted variants, and each copy picks one.
    copies = augment.pick_variants if config.features == "scatternet" else None
    return augment.augmult_batches(batches, multiplicity=config.augmult,
                                   max_shift=config.augment_shift, flip=config.augment_flip,
                                   copies=copies, seed=config.seed)


def sampled_batches(config, plan, x, y, strategy=None):
    """Poisson batches (padded, with a mask; per replica under a strategy) for DP-SGD with
    --sampling=poisson, else shuffled fixed-size batches (the shuffle keyed by a secret
    for DP-SGD, by --seed otherwise)."""
    replicas = 1 if strategy is None else strategy.num_replicas_in_sync
    if config.dpsgd and config.sampling == "poisson" and replicas > 1:
        # Replica r samples x[r::R] with the same q: a Poisson sample of all N per step.
        return sampling.distributed_poisson_batches(
            strategy, x, y, expected_batch_size=config.batch_size,
            steps=plan.steps_per_epoch, insecure_dp_seed=config.insecure_dp_seed)
    if config.dpsgd and config.sampling == "poisson":
        if config.poisson_padding:  # padded to the size no step of the whole run exceeds
            size = dict(max_batch_size=sampling.default_max_batch_size(
                num_examples=len(x), sampling_probability=config.batch_size / len(x),
                total_steps=plan.total_steps))
        else:  # --nopoisson_padding: batches of the sampled examples only
            size = dict(fixed_size=False)
        if not _read_per_batch(x):
            # One epoch's steps; every new iteration (epoch) draws fresh batches.
            return sampling.poisson_batches(x, y, expected_batch_size=config.batch_size,
                                            steps=plan.steps_per_epoch, **size,
                                            insecure_dp_seed=config.insecure_dp_seed)
        # A large array (e.g. MNIST's ScatterNet features): sample its row numbers + 1 and
        # read the rows per batch, instead of a TensorFlow copy of the whole array (more
        # resident memory: docs/reproduction.md). Padding (0) reads as zeros, as before.
        batches = sampling.poisson_batches(np.arange(1, len(x) + 1), y,
                                           expected_batch_size=config.batch_size,
                                           steps=plan.steps_per_epoch, **size,
                                           insecure_dp_seed=config.insecure_dp_seed)
        return batches.map(lambda rows, *rest: (_rows_of(x, rows), *rest),
                           num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=True).prefetch(tf.data.AUTOTUNE)
    seed = config.seed
    if config.dpsgd:  # which examples share a batch is privacy-relevant: secret
        seed = randomness.dp_seed("shuffle", insecure_dp_seed=config.insecure_dp_seed)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = ds.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    # Fixed-size batches: microbatches must divide every batch. Declared shuffled (each
    # example at most once per epoch): accounted with the bound without amplification.
    ds = ds.batch(config.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return data_sampling.tag_dataset(ds, data_sampling.SamplingTag(
        "shuffle", len(x), config.batch_size, None, len(x) // config.batch_size))


READ_PER_BATCH_BYTES = 64 << 20  # training arrays from this size stay in NumPy


def _read_per_batch(x):
    return isinstance(x, np.ndarray) and x.nbytes >= READ_PER_BATCH_BYTES and x.ndim >= 1


def _rows_of(x, rows):
    """x[rows − 1] (zeros where rows is 0) as a tensor, read from the NumPy array x."""

    def read(r):
        out = np.zeros((len(r),) + x.shape[1:], x.dtype)
        keep = np.flatnonzero(r > 0)
        flat = out.reshape(len(r), -1)
        flat[keep] = x.reshape(len(x), -1)[r[keep] - 1]
        return out

    batch = tf.numpy_function(read, [rows], tf.as_dtype(x.dtype))
    return tf.ensure_shape(batch, [None] + list(x.shape[1:]))
