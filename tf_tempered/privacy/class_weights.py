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
"""``fit(class_weight={class: weight})`` as sample weights, for arrays and Poisson pipelines.

Keras turns ``class_weight`` into one sample weight per example, w_i = class_weight[c_i],
with c_i the integer label or the argmax of a one-hot label. DP-SGD weighs example i's
loss by w_i before clipping, as for any sample weight. Arrays: :func:`per_example` before
sampling. A Poisson pipeline (``poisson_batches``, or batches of ``(x, y, {"mask",
"expected_batch_size"})``) carries its batch's info dict where Keras expects sample weights,
so Keras cannot add class weights to it: :func:`into_poisson_info` joins them to the info
dict's ``"sample_weight"`` instead. Every class met needs a weight (as for arrays).

>>> per_example(np.array([0, 2, 1]), {0: 0.5, 1: 1.0, 2: 4.0})
array([0.5, 4. , 1. ], dtype=float32)
>>> per_example(np.array([[0.0, 1.0], [1.0, 0.0]]), {0: 3.0, 1: 1.0})  # one-hot labels
array([1., 3.], dtype=float32)
"""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import data_sampling
from tf_tempered.privacy.step.batch import POISSON_KEYS, masked_rows

__all__ = ["per_example", "into_poisson_info", "is_poisson_pipeline"]

_SEVERAL_OUTPUTS = ("class_weight is not supported for models with several outputs (as in "
                    "Keras). Fix: pass sample_weight instead.")


def per_example(y, class_weight):
    """[N] float32 weights of the examples of labels ``y`` (integers, or one-hot [N, C])."""
    if tf.nest.is_nested(y):
        raise ValueError(_SEVERAL_OUTPUTS)
    labels = np.asarray(y)
    if labels.ndim == 2 and labels.shape[1] > 1:
        labels = np.argmax(labels, axis=1)
    labels = labels.reshape(len(labels), -1)[:, 0].astype(np.int64)
    missing = sorted(set(labels.tolist()) - set(int(k) for k in class_weight))
    if missing:
        raise ValueError(f"class_weight has no weight for classes {missing[:10]}. Fix: give "
                         "every class a weight.")
    return np.array([class_weight[int(c)] for c in labels], np.float32)


def is_poisson_pipeline(dataset):
    """Whether ``dataset``'s elements are Poisson batches: (x, y, {"mask",
    "expected_batch_size", ...}); a dict of per-output weights may hold an output "mask"."""
    spec = getattr(dataset, "element_spec", None)
    return (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], dict)
            and POISSON_KEYS <= set(spec[2]))


def into_poisson_info(dataset, class_weight):
    """``dataset`` (a Poisson pipeline) with each batch's class weights joined to its info
    dict's ``"sample_weight"`` (times the weights already there); keeps its SamplingTag.
    Batches it cannot map (an iterator's, a tf.distribute dataset's) are refused."""
    if isinstance(dataset, tf.data.Iterator):  # (named a tf.distribute dataset; probe E3)
        raise ValueError(
            "class_weight with an iterator of Poisson batches (iter(poisson_batches(...))): "
            "an iterator's batches cannot be reweighted here. Fix: fit on the dataset "
            "itself, or drop class_weight and pass each example's weight as "
            "poisson_batches(x, y, sample_weight=..., ...).")
    if not isinstance(dataset, tf.data.Dataset):  # distributed_poisson_batches' (probe B2)
        raise ValueError(
            "class_weight with batches a tf.distribute dataset gives each replica "
            "(distributed_poisson_batches): they cannot be reweighted here. Fix: drop "
            "class_weight and pass each example's weight as distributed_poisson_batches("
            "strategy, x, y, sample_weight=..., ...).")
    if tf.nest.is_nested(dataset.element_spec[1]):
        raise ValueError(_SEVERAL_OUTPUTS)
    size = max(int(k) for k in class_weight) + 1
    table = np.zeros(size, np.float32)
    known = np.zeros(size, bool)
    for k, weight in class_weight.items():
        table[int(k)], known[int(k)] = weight, True
    table, known = tf.constant(table), tf.constant(known)

    def join(x, y, info):
        labels = tf.cast(y, tf.float32) if y.shape.rank == 2 and y.shape[-1] != 1 else y
        if labels.shape.rank == 2 and labels.shape[-1] != 1:
            labels = tf.argmax(labels, axis=-1)
        labels = tf.cast(tf.reshape(labels, [tf.shape(labels)[0], -1])[:, 0], tf.int32)
        inside = (labels >= 0) & (labels < size)
        index = tf.where(inside, labels, 0)
        weighted = inside & tf.gather(known, index)
        real = tf.cast(info["mask"], tf.float32) > 0  # padding rows' labels are no classes
        check = tf.debugging.Assert(
            tf.reduce_all(weighted | ~real),
            ["class_weight has no weight for a class of this batch. Fix: give every class "
             "a weight; labels:", tf.boolean_mask(labels, real & ~weighted)])
        with tf.control_dependencies([check]):
            weights = tf.where(weighted, tf.gather(table, index), 0.0)
        info = dict(info)
        user = info.get("sample_weight")
        info["sample_weight"] = weights if user is None else masked_rows(user, weights)
        return x, y, info

    joined = dataset.map(join, deterministic=True)
    tag = data_sampling.sampling_of(dataset)
    return joined if tag is None else data_sampling.tag_dataset(joined, tag)
