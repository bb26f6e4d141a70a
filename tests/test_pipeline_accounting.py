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
"""tf_tempered/privacy/pipeline_accounting.py: the passes an untagged pipeline is accounted
with bound what its batches hold.

An example in a batch m times is a Gaussian of sensitivity m·C there; composed over the
steps that is Σ_s m_s² Gaussians of sensitivity C, so the passes counted (⌈steps / steps
per pass⌉ times the pass weight) must be at least every example's Σ_s m_s², read here off
the batches the pipeline really gives. (Fit-level ε: test_misuse_accounting.py.)"""

import math

import numpy as np
import pytest

from tf_tempered._compat import tf
from tf_tempered.privacy import pipeline_accounting

# Keras-independent code: runs in the Keras 3 suite (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def _worst_sum_of_squares(dataset, steps, examples):
    """max over examples of Σ_s (copies of the example in batch s)²."""
    total = np.zeros(examples)
    for batch in dataset.take(steps):
        total += np.bincount(batch.numpy(), minlength=examples) ** 2
    return total.max()


def _counted(dataset, steps):
    per_pass, weight = pipeline_accounting.untagged_steps_per_pass(dataset)
    return math.ceil(steps / per_pass) * weight


@pytest.mark.parametrize("examples,batch", [(64, 16), (64, 24), (64, 60), (10, 25),
                                            (3, 8), (12, 24), (7, 2)])
@pytest.mark.parametrize("form", ["shuffle_repeat_batch", "repeat_batch", "repeat3_batch",
                                  "repeat_skip_batch", "repeat_take_batch"])
def test_the_passes_counted_bound_each_example_s_share_of_the_steps(examples, batch, form):
    ds = tf.data.Dataset.range(examples)
    if form == "shuffle_repeat_batch":
        ds = ds.shuffle(examples).repeat().batch(batch)
    elif form == "repeat_batch":
        ds = ds.repeat().batch(batch)
    elif form == "repeat_skip_batch":  # the passes start off the batches' starts
        ds = ds.shuffle(examples).repeat().skip(examples // 2 + 1).batch(batch)
    elif form == "repeat_take_batch":
        ds = ds.shuffle(examples).repeat().take(40 * examples).batch(batch)
    else:
        ds = ds.repeat(3).batch(batch)
    steps = 12 if form != "repeat3_batch" else -(-3 * examples // batch)
    for _ in range(3):  # shuffled: other passes, other spans
        assert _counted(ds, steps) >= _worst_sum_of_squares(ds, steps, examples)


# Before: both were counted as one pass per ⌊N/B⌋ steps (at least one), each pass once.
@pytest.mark.parametrize("examples,batch,steps", [(3, 8, 4), (10, 25, 4)])
def test_a_batch_that_spans_passes_counts_them_more_than_once(examples, batch, steps):
    ds = tf.data.Dataset.range(examples).repeat().batch(batch)
    worst = _worst_sum_of_squares(ds, steps, examples)
    assert _counted(ds, steps) >= worst > math.ceil(steps / max(1, examples // batch))


@pytest.mark.parametrize("pipeline", ["shuffle_after_repeat", "uncounted_repeat",
                                      "rebatched_repeat", "filtered_repeat"])
def test_repeats_that_leave_an_example_s_copies_in_a_batch_unbounded_are_refused(pipeline):
    ds = tf.data.Dataset.range(64)
    if pipeline == "shuffle_after_repeat":
        ds, fix = ds.repeat().shuffle(100).batch(16), "shuffle before repeating"
    elif pipeline == "uncounted_repeat":
        ds, fix = ds.filter(lambda i: i % 2 == 0).repeat().batch(16), "batch before repeating"
    elif pipeline == "rebatched_repeat":  # batches of 24 across the passes of batches of 16
        ds, fix = ds.batch(16).repeat().unbatch().batch(24), "batch before repeating"
    else:
        ds, fix = ds.repeat().filter(lambda i: i < 60).batch(16), "batch before repeating"
    with pytest.raises(ValueError, match=fix):
        pipeline_accounting.untagged_steps_per_pass(ds)


def test_batches_that_hold_an_example_once_keep_one_count_per_pass():
    ds = tf.data.Dataset.range(64)
    assert pipeline_accounting.untagged_steps_per_pass(ds.shuffle(64).batch(16).repeat()) == (4, 1)
    assert pipeline_accounting.untagged_steps_per_pass(ds.shuffle(64).batch(24).repeat()) == (3, 1)
    assert pipeline_accounting.untagged_steps_per_pass(ds.shuffle(64).repeat().batch(16)) == (4, 1)
    assert pipeline_accounting.untagged_steps_per_pass(ds.batch(16)) == (4, 1)


def test_untagged_poisson_batches_count_every_step_and_warn_once():
    info = {"mask": tf.ones([4]), "expected_batch_size": tf.constant(4.0)}
    ds = tf.data.Dataset.from_tensors((tf.zeros([4, 2]), tf.zeros([4]), info)).repeat(3)
    warned = set()
    with pytest.warns(UserWarning, match="Poisson tag a transformation dropped"):
        assert pipeline_accounting.untagged_passes(warned, ds.cache()) == (1, 1)
    assert pipeline_accounting.untagged_passes(warned, ds) == (1, 1)  # said once


def _range(n=10):
    return tf.data.Dataset.range(n)


# A probe's pipelines (over 10 examples): every one was accounted below what its batches
# hold (1 pass where an example's Σ m² reached 3 to 20), now bounded or refused.
PIPELINES = {
    "repeated batches, a take": lambda: _range().repeat().batch(4).take(30),
    "batches repeated, a take": lambda: _range().batch(4).repeat().take(12),
    "batches repeated 5 times, a take": lambda: _range().batch(4).repeat(5).take(12),
    "batches repeated 3 times, a skip": lambda: _range().batch(4).repeat(3).skip(1),
    "filtered batches repeated": lambda: _range().filter(lambda i: i > 0).batch(4).repeat(3),
    "padded batches repeated": lambda: _range().padded_batch(4).repeat(3),
    "batches taken, repeated": lambda: _range().batch(4).take(2).repeat(3),
    "repeated batches shuffled": lambda: _range().batch(4).repeat(3).shuffle(5),
    "batches shuffled over a spanning repeat": lambda: _range().shuffle(10).repeat().batch(
        4).shuffle(3),
    "one dataset sampled twice": lambda: tf.data.Dataset.sample_from_datasets(
        [_SHARED, _SHARED], seed=1).batch(4),
    "one dataset zipped with itself shuffled": lambda: tf.data.Dataset.zip(
        (_SHARED.shuffle(10), _SHARED.shuffle(10))).map(lambda a, b: tf.stack([a, b])).unbatch(
        ).batch(4),
    "one dataset concatenated to itself": lambda: _SHARED.concatenate(_SHARED).batch(4),
    "sliding windows": lambda: _range().window(4, shift=1).flat_map(lambda w: w.batch(4)),
}
_SHARED = _range()
REFUSED = {
    "a filter between a repeat and the batch": lambda: _range().repeat(3).filter(
        lambda i: i > 0).batch(4),
    "enumerated repeats": lambda: _range().repeat(3).enumerate().map(lambda i, x: x).batch(4),
    "a repeat rebatched": lambda: _range().repeat(3).batch(4).unbatch().batch(4),
    "repeated batches rebatched": lambda: _range().batch(4).repeat(3).unbatch().batch(4),
    "a repeat in padded batches": lambda: _range().repeat(3).padded_batch(4),
    "repeats zipped": lambda: tf.data.Dataset.zip((_range().repeat(3), _range().repeat(3))).map(
        lambda a, b: a).batch(4),
    "nested repeats": lambda: _range().repeat(2).repeat().batch(4),
    "a repeat under a rebatch": lambda: _range().repeat(3).batch(4).rebatch(2),
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_pipelines_that_give_an_example_again_are_bounded(name):
    ds = PIPELINES[name]()
    steps = 24
    per_pass, weight = pipeline_accounting.untagged_steps_per_pass(ds)
    counted = math.ceil(steps / per_pass) * weight if per_pass else weight  # None: one pass
    for _ in range(3):
        assert counted >= _worst_sum_of_squares(ds, steps, 10), (per_pass, weight)


@pytest.mark.parametrize("name", list(REFUSED))
def test_repeats_below_a_batch_in_other_forms_are_refused(name):
    with pytest.raises(ValueError, match="batch before repeating"):
        pipeline_accounting.untagged_steps_per_pass(REFUSED[name]())
