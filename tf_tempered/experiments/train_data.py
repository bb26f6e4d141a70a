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
"""The train script's data: loaded, split and featurized once (:func:`prepare_data`),
then its batches: Poisson or shuffled sampling, then augmentation copies."""

import dataclasses
import mmap
import pathlib

import numpy as np

from tf_tempered import augment, scatternet
from tf_tempered import data as data_lib
from tf_tempered._compat import tf
from tf_tempered.experiments import common, feature_norm
from tf_tempered.experiments.privacy_plan import PrivacyPlan, plan_privacy
from tf_tempered.privacy import data_sampling, randomness, sampling
from tf_tempered.scatternet.cache import RowFile

__all__ = ["TrainingData", "prepare_data", "sampled_batches", "training_batches"]


@dataclasses.dataclass
class TrainingData:
    """The run's data: the dataset (training part only with a validation split), the
    validation split, the training inputs fed to the batches, the privacy plan and the
    released feature statistics."""
    dataset: object
    validation: object
    train_x: object
    plan: PrivacyPlan
    feature_stats: object


def prepare_data(config, backup_dir=None):
    """Loads and splits the data, computes features, plans σ/ε and releases the statistics.

    ScatterNet features are memory-mapped from their cache (np.memmap), and batches read
    their rows from the file (:class:`~tf_tempered.scatternet.cache.RowFile`), so the
    features do not stay in resident memory (MNIST's training features: 953 MB; with
    --augmult, batches read the shifted copies' files, and the plain training features
    are read once, for --feature_norm=dp_stats).
    """
    dataset = data_lib.load(config.dataset, data_dir=config.data_dir,
                            num_train=config.num_train, num_test=config.num_test)
    images = dataset.x_train
    shifted = None
    if config.features == "scatternet":  # a fixed public transform: no privacy cost
        dataset, shifted = _scattered(config, dataset)
    common.check_num_examples(config, len(dataset.y_train))
    validation, held_out = None, (len(dataset.y_train), len(dataset.y_train))
    if config.validation_size:
        # A block of validation_size examples (the last, or --validation_fold's);
        # everything below (σ, ε, the model's data) sees only the others.
        held_out = data_lib.validation_block(len(dataset.y_train), config.validation_size,
                                             config.validation_fold)
        dataset, validation = data_lib.split_validation(dataset, config.validation_size,
                                                        fold=config.validation_fold)
    train_x = dataset.x_train
    if config.features == "scatternet" and config.augmult > 1:
        # The features of every shifted (and with --augment_flip mirrored) image, once
        # (for all images, so one cache serves every split): augmentation copies pick
        # among them.
        if shifted is None:  # float16 storage: not read above
            shifted = _shifted_features(config, images)
        train_x = data_lib.without_block(shifted, *held_out)
    plan = plan_privacy(config, len(dataset.y_train))
    # --feature_norm=dp_stats: released once, from the training part only (plan accounts it);
    # with --backup_dir, once per run, however often it is resumed.
    stats = feature_norm.release(config, dataset.x_train, store=None if backup_dir is None
                                 else pathlib.Path(backup_dir) / feature_norm.STORE_NAME)
    # A fresh map of the plain features (none of its pages read): the pages the release
    # read leave resident memory (MNIST: 953 MB).
    unread = _unread(dataset.x_train)
    if train_x is dataset.x_train:
        train_x = unread
    dataset = dataclasses.replace(dataset, x_train=unread)
    return TrainingData(dataset, validation, train_x, plan, stats)


def _scattered(config, dataset):
    """(the dataset's ScatterNet features, the shifted copies' features or None).

    --feature_storage=log8 (with --augmult > 1): the training images' features are the
    unshifted variant of the shifted copies' 8-bit files (scatternet.VariantRows, read
    when indexed), the test images' are computed in memory (float32, 3-5 s for MNIST's
    10,000), so the cache holds one byte a feature and no float32 file (MNIST: 2.14 GB).
    """
    if config.feature_storage != "log8":
        return scatternet.scatter_dataset(dataset, mmap_mode="r"), None
    shifted = _shifted_features(config, dataset.x_train)
    return dataclasses.replace(
        dataset, x_train=shifted.variant((0, 0, False)),
        x_test=scatternet.scattering_features(dataset.x_test, cache=False),
        source=f"{dataset.source} -> scattering J=2 L=8 (training features in log8 codes)"
    ), shifted


def _shifted_features(config, images):
    return scatternet.shifted_scattering_features(
        images, max_shift=config.augment_shift, flip=config.augment_flip,
        storage=config.feature_storage)


def _unread(x):
    """A new read-only map of the file ``x`` maps if ``x`` is a whole file's map; else ``x``."""
    if _is_file_map(x):
        return np.memmap(x.filename, dtype=x.dtype, mode="r", offset=x.offset, shape=x.shape)
    return x


def _is_file_map(x):
    """Whether ``x`` maps a whole file, as np.load(..., mmap_mode="r") returns it (not a
    slice of one: its rows would start elsewhere in the file)."""
    return isinstance(x, np.memmap) and isinstance(x.base, mmap.mmap)


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
    """x[rows − 1] (zeros where rows is 0) as a tensor, read from the NumPy array x; from
    a whole file's map by a RowFile's reads of the file, which leave no pages mapped (so
    resident memory does not grow to the file's size as the epochs read it)."""
    take = RowFile(x.filename).take if _is_file_map(x) else x.reshape(len(x), -1).__getitem__

    def read(r):
        out = np.zeros((len(r),) + x.shape[1:], x.dtype)
        keep = np.flatnonzero(r > 0)
        width = int(np.prod(x.shape[1:]))
        out.reshape(len(r), width)[keep] = take(r[keep] - 1).reshape(len(keep), width)
        return out

    batch = tf.numpy_function(read, [rows], tf.as_dtype(x.dtype))
    return tf.ensure_shape(batch, [None] + list(x.shape[1:]))
