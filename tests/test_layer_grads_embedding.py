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
"""Embedding per-microbatch norms and clipped sums against per-example tapes.

The reference for every case is the gradient of a real keras.layers.Embedding's
matrix, one tf.GradientTape per example (densified here, in the test only),
summed per microbatch.
"""

import doctest
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy.layer_grads import clip_weights as clip_lib
from tf_tempered.privacy.layer_grads import embedding as emb_grads
from tf_tempered.privacy import native

_NORMS = {"tf_ops": emb_grads.embedding_sq_norms, "native": emb_grads.native_embedding_sq_norms}

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 6
VOCAB = 7  # small, so that ids repeat within examples and across a microbatch
DIM = 3


@pytest.fixture(params=sorted(_NORMS))
def norms(request):
    """Each norm implementation: the TF-ops form and the native op (CPU, built if needed)."""
    if request.param == "native" and native.library._compiler() is None:
        pytest.skip("no C++ compiler to build the native op")
    return _NORMS[request.param]


def _ids_shape(rank):
    return {1: [BATCH], 2: [BATCH, 5], 3: [BATCH, 3, 4]}[rank]


def _make_layer(dtype="float64", mask_zero=False, vocab=VOCAB, dim=DIM):
    layer = keras.layers.Embedding(vocab, dim, mask_zero=mask_zero, dtype=dtype,
                                   embeddings_initializer="random_normal")
    layer.build(None)
    return layer


def _reference_per_microbatch(layer, ids, grad_output, num_microbatches):
    """[M, V, d]: per-example tape gradients of the embedding matrix, summed per microbatch."""
    per_example = []
    for b in range(ids.shape[0]):
        with tf.GradientTape() as tape:
            y = layer(ids[b:b + 1])
        g = tape.gradient(y, layer.embeddings, output_gradients=grad_output[b:b + 1])
        per_example.append(tf.convert_to_tensor(g).numpy())
    per_example = np.stack(per_example)
    return per_example.reshape((num_microbatches, -1) + per_example.shape[1:]).sum(1)


def _clip_weights(norms, clip):
    """ClipWeights as the engine makes them: scale = C / max(‖g‖, C), 0 if not finite."""
    norms = tf.constant(norms, tf.float32)
    finite = tf.cast(tf.math.is_finite(norms), tf.float32)
    scale = tf.where(finite > 0, clip / tf.maximum(tf.where(finite > 0, norms, clip), clip), 0.0)
    return clip_lib.ClipWeights(scale, finite)


def _densify(slices):
    return tf.convert_to_tensor(slices).numpy()


def _random_case(rank, dtype="float64", seed=0, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=_ids_shape(rank)).astype(np.int32)
    g = rng.normal(size=ids.shape + (DIM,)).astype(dtype)
    return tf.constant(ids), tf.constant(g)


def _num_microbatches(kind):
    return {"per-example": BATCH, "divisor": 2, "one": 1}[kind]


def _assert_clipped_sum(ids, g, reference, layer, static=True):
    """The clipped sum with C = median reference norm (some microbatches clipped, some not)."""
    ref_norms = np.sqrt(np.sum(reference.reshape(reference.shape[0], -1) ** 2, 1))
    clip = float(np.median(ref_norms))
    weights = _clip_weights(ref_norms, clip)
    factors = np.minimum(1.0, clip / ref_norms)
    if reference.shape[0] > 1:
        assert (factors < 1).any() and (factors == 1).any()
    expected = np.tensordot(factors, reference, 1)
    if static:
        slices = emb_grads.embedding_clipped_sum(ids, g, weights, VOCAB)
    else:
        fn = tf.function(
            lambda i, gg: tf.convert_to_tensor(emb_grads.embedding_clipped_sum(i, gg, weights, VOCAB)),
            input_signature=[tf.TensorSpec([None] + ids.shape[1:].as_list(), ids.dtype),
                             tf.TensorSpec([None] + g.shape[1:].as_list(), g.dtype)])
        slices = fn(ids, g)
    assert _densify(slices).shape == (VOCAB, DIM)
    np.testing.assert_allclose(_densify(slices), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("microbatches", ["per-example", "divisor", "one"])
@pytest.mark.parametrize("batch", ["static", "unknown"])
def test_matches_per_example_tapes(rank, microbatches, batch, norms):
    layer = _make_layer()
    ids, g = _random_case(rank, seed=rank)
    m = _num_microbatches(microbatches)
    reference = _reference_per_microbatch(layer, ids, g, m)
    ref_sq = np.sum(reference.reshape(m, -1) ** 2, 1)
    if batch == "static":
        sq = norms(ids, g, m)
    else:
        # The batch size is unknown while tracing; M static, or a tensor (per-example).
        spec = [tf.TensorSpec([None] + ids.shape[1:].as_list(), ids.dtype),
                tf.TensorSpec([None] + g.shape[1:].as_list(), g.dtype)]
        if microbatches == "per-example":
            fn = tf.function(lambda i, gg: norms(i, gg, tf.shape(i)[0]),
                             input_signature=spec)
        else:
            fn = tf.function(lambda i, gg: norms(i, gg, m),
                             input_signature=spec)
        assert fn.get_concrete_function().structured_outputs.shape.rank == 1
        sq = fn(ids, g)
    assert sq.dtype == tf.float64 and sq.shape == (m,)
    np.testing.assert_allclose(sq.numpy(), ref_sq, rtol=1e-12)
    # Where a microbatch repeats an id the grouping matters: the sum of
    # per-position squares differs (rank 1, one example per microbatch: no repeats).
    rows = ids.numpy().reshape(m, -1)
    if any(len(set(r)) < len(r) for r in rows):
        assert not np.allclose(np.sum(g.numpy().reshape(m, -1) ** 2, 1), ref_sq)
    else:
        assert rank == 1 and microbatches == "per-example"
    _assert_clipped_sum(ids, g, reference, layer, static=batch == "static")


def test_duplicates_within_and_across_examples(norms):
    layer = _make_layer()
    # Example 0 looks up row 2 three times, example 1 once more (same microbatch
    # of 2), example 2 uses row 2 too but in another microbatch.
    ids = tf.constant([[2, 2, 2, 5], [2, 0, 6, 6], [2, 1, 1, 1], [4, 3, 3, 0]])
    g = tf.constant(np.random.default_rng(3).normal(size=(4, 4, DIM)))
    reference = _reference_per_microbatch(layer, ids, g, 2)
    sq = norms(ids, g, 2)
    np.testing.assert_allclose(sq.numpy(), np.sum(reference.reshape(2, -1) ** 2, 1), rtol=1e-12)
    # By hand for microbatch 0: row 2 gets four g's, row 5 one, row 0 one, row 6 two.
    gn = g.numpy()
    by_hand = (np.sum((gn[0, 0] + gn[0, 1] + gn[0, 2] + gn[1, 0]) ** 2) + np.sum(gn[0, 3] ** 2)
               + np.sum(gn[1, 1] ** 2) + np.sum((gn[1, 2] + gn[1, 3]) ** 2))
    np.testing.assert_allclose(sq.numpy()[0], by_hand, rtol=1e-12)
    _assert_clipped_sum(ids, g, reference, layer)


@pytest.mark.parametrize("num_microbatches", [4, 2, 1])
def test_all_positions_one_id(num_microbatches, norms):
    """Every microbatch uses the same one row: groups must not run across microbatches."""
    layer = _make_layer()
    ids = tf.fill([4, 5], 3)
    g = tf.constant(np.random.default_rng(4).normal(size=(4, 5, DIM)))
    m = num_microbatches
    sq = norms(ids, g, m)
    reference = _reference_per_microbatch(layer, ids, g, m)
    np.testing.assert_allclose(sq.numpy(), np.sum(reference.reshape(m, -1) ** 2, 1), rtol=1e-12)
    np.testing.assert_allclose(
        sq.numpy(), np.sum(np.sum(g.numpy().reshape(m, -1, DIM), 1) ** 2, 1), rtol=1e-12)


def test_float32(norms):
    layer = _make_layer("float32")
    ids, g = _random_case(2, dtype="float32", seed=5)
    reference = _reference_per_microbatch(layer, ids, g, 3)
    sq = norms(ids, g, 3)
    assert sq.dtype == tf.float32
    np.testing.assert_allclose(sq.numpy(), np.sum(reference.reshape(3, -1) ** 2, 1), rtol=1e-5)
    norms = np.sqrt(np.sum(reference.reshape(3, -1) ** 2, 1))
    clip = float(np.median(norms))
    slices = emb_grads.embedding_clipped_sum(ids, g, _clip_weights(norms, clip), VOCAB)
    assert slices.values.dtype == tf.float32
    np.testing.assert_allclose(_densify(slices),
                               np.tensordot(np.minimum(1, clip / norms), reference, 1),
                               rtol=1e-5, atol=1e-6)


def test_mask_zero_through_a_real_model():
    """G from one backward pass of a masked model equals the per-example tapes.

    mask_zero only tells downstream layers to skip id-0 positions (here the
    pooling gives them a zero output gradient); row 0's gradient is whatever
    flows into the layer's output, exactly as for any other row.
    """
    layer = _make_layer(mask_zero=True)
    pool = keras.layers.GlobalAveragePooling1D(dtype="float64")
    dense = keras.layers.Dense(1, dtype="float64")
    ids = tf.constant([[0, 1, 1, 0, 2], [3, 0, 0, 0, 0], [4, 4, 5, 6, 0], [1, 2, 3, 4, 5]])
    targets = tf.constant([[1.0], [-1.0], [0.5], [2.0]], tf.float64)

    def losses(x, t):
        e = layer(x)
        out = dense(pool(e, mask=layer.compute_mask(x)))
        return e, tf.reduce_sum((out - t) ** 2, 1)

    with tf.GradientTape() as tape:
        e, per_example = losses(ids, targets)
        total = tf.reduce_sum(per_example)
    g = tape.gradient(total, e)
    # Masked positions get no output gradient from the pooling (not the embedding's doing).
    assert np.all(g.numpy()[ids.numpy() == 0] == 0)
    sq = emb_grads.embedding_sq_norms(ids, g, 2)
    reference = []
    for b in range(4):
        with tf.GradientTape() as tape:
            _, loss = losses(ids[b:b + 1], targets[b:b + 1])
        reference.append(tf.convert_to_tensor(tape.gradient(loss, layer.embeddings)).numpy())
    reference = np.stack(reference).reshape(2, 2, VOCAB, DIM).sum(1)
    np.testing.assert_allclose(sq.numpy(), np.sum(reference.reshape(2, -1) ** 2, 1), rtol=1e-12)
    _assert_clipped_sum(ids, g, reference, layer)
    # Without the pooling's mask the id-0 rows do get gradient: the layer itself
    # does not stop it, and the functions count it like any row.
    ids2, g2 = _random_case(2, seed=6)
    ids2 = tf.where(tf.range(5)[None] % 2 == 0, 0, ids2)
    reference2 = _reference_per_microbatch(layer, ids2, g2, 3)
    assert np.any(reference2[:, 0] != 0)
    np.testing.assert_allclose(emb_grads.embedding_sq_norms(ids2, g2, 3).numpy(),
                               np.sum(reference2.reshape(3, -1) ** 2, 1), rtol=1e-12)


def test_non_integer_ids_cast_like_keras(norms):
    """Keras casts float ids to int32 (truncation) before the lookup; so do the functions."""
    layer = _make_layer()
    float_ids = tf.constant([[1.7, 2.2, 2.9], [0.4, 6.99, 1.0]], tf.float64)
    g = tf.constant(np.random.default_rng(7).normal(size=(2, 3, DIM)))
    reference = _reference_per_microbatch(layer, float_ids, g, 1)
    sq = norms(float_ids, g, 1)
    np.testing.assert_allclose(sq.numpy(), np.sum(reference.reshape(1, -1) ** 2, 1), rtol=1e-12)
    np.testing.assert_allclose(
        sq.numpy(), norms(tf.cast(float_ids, tf.int32), g, 1).numpy())
    _assert_clipped_sum(float_ids, g, reference, layer)
    # int64 ids are used as they are.
    ids64 = tf.constant([[1, 2, 2], [0, 6, 1]], tf.int64)
    np.testing.assert_allclose(norms(ids64, g, 1).numpy(), sq.numpy())
    assert emb_grads.embedding_clipped_sum(ids64, g, _clip_weights([1.0], 1.0), VOCAB
                                           ).indices.dtype == tf.int64


def test_negative_ids_wrap_like_keras3_with_vocab_size(norms):
    """Keras 3's lookup reads -1 as row V-1; with vocab_size so do the functions."""
    ids = tf.constant([[-1, VOCAB - 1], [2, -5]])
    g = tf.constant(np.random.default_rng(8).normal(size=(2, 2, DIM)))
    wrapped = tf.constant([[VOCAB - 1, VOCAB - 1], [2, VOCAB - 5]])
    np.testing.assert_allclose(norms(ids, g, 2, vocab_size=VOCAB).numpy(),
                               norms(wrapped, g, 2).numpy())
    slices = emb_grads.embedding_clipped_sum(ids, g, _clip_weights([1.0, 1.0], 10.0), VOCAB)
    np.testing.assert_array_equal(slices.indices.numpy(), wrapped.numpy().ravel())


def test_nan_row_contributes_zero(norms):
    layer = _make_layer()
    ids, g = _random_case(2, seed=9)
    g_np = g.numpy().copy()
    g_np[3, 2, 1] = np.nan  # example 3 is in microbatch 1 of 3
    g_nan = tf.constant(g_np)
    sq = norms(ids, g_nan, 3).numpy()
    reference = _reference_per_microbatch(layer, ids, g, 3)
    ref_sq = np.sum(reference.reshape(3, -1) ** 2, 1)
    assert np.isnan(sq[1])
    np.testing.assert_allclose(sq[[0, 2]], ref_sq[[0, 2]], rtol=1e-12)
    norms = np.sqrt(sq)
    clip = float(np.sqrt(min(ref_sq[0], ref_sq[2])))  # clips one of the finite microbatches
    weights = _clip_weights(norms, clip)
    assert weights.scale.numpy()[1] == 0
    dense = _densify(emb_grads.embedding_clipped_sum(ids, g_nan, weights, VOCAB))
    assert np.all(np.isfinite(dense))
    factors = np.minimum(1, clip / np.sqrt(ref_sq))
    expected = factors[0] * reference[0] + factors[2] * reference[2]
    np.testing.assert_allclose(dense, expected, rtol=1e-6, atol=1e-9)  # float32 factors
    # An inf as well.
    g_np[3, 2, 1] = np.inf
    dense_inf = _densify(emb_grads.embedding_clipped_sum(ids, tf.constant(g_np), weights, VOCAB))
    np.testing.assert_allclose(dense_inf, expected, rtol=1e-6, atol=1e-9)


def test_deduplicate_and_optimizer():
    ids, g = _random_case(2, seed=10)
    weights = _clip_weights([1.0, 2.0, 3.0], 1.5)
    slices = emb_grads.embedding_clipped_sum(ids, g, weights, VOCAB)
    dedup = emb_grads.embedding_clipped_sum(ids, g, weights, VOCAB, deduplicate=True)
    assert len(np.unique(dedup.indices.numpy())) == dedup.indices.shape[0]
    np.testing.assert_allclose(_densify(dedup), _densify(slices), rtol=1e-12)
    # A Keras optimizer applies the IndexedSlices as the dense gradient.
    layer = _make_layer()
    before = layer.embeddings.numpy()
    keras.optimizers.SGD(1.0).apply_gradients([(slices, layer.embeddings)])
    np.testing.assert_allclose(layer.embeddings.numpy(), before - _densify(slices), rtol=1e-12)


def test_values_dtype_for_mixed_precision(norms):
    ids, g = _random_case(2, dtype="float16", seed=11)
    sq = norms(ids, g, 3)
    assert sq.dtype == tf.float32  # accumulated in float32
    expected = norms(ids, tf.cast(g, tf.float32), 3)
    np.testing.assert_allclose(sq.numpy(), expected.numpy(), rtol=1e-6)
    slices = emb_grads.embedding_clipped_sum(ids, g, _clip_weights([1.0, 2.0, 3.0], 1.5), VOCAB,
                                             dtype="float32")
    assert slices.values.dtype == tf.float32


def test_bad_shapes_refused():
    with pytest.raises(ValueError, match="grad_output"):
        emb_grads.embedding_sq_norms(tf.zeros([4, 3], tf.int32), tf.zeros([4, DIM]), 2)


@pytest.mark.parametrize("batch", ["static", "unknown"])
def test_xla(batch):
    ids, g = _random_case(3, dtype="float32", seed=12)
    shape = [None] if batch == "unknown" else [BATCH]
    spec = [tf.TensorSpec(shape + ids.shape[1:].as_list(), ids.dtype),
            tf.TensorSpec(shape + g.shape[1:].as_list(), g.dtype)]
    weights = _clip_weights([1.0, 2.0, 3.0], 1.5)

    @tf.function(jit_compile=True, input_signature=spec)
    def both(i, gg):
        s = emb_grads.embedding_clipped_sum(i, gg, weights, VOCAB)
        return emb_grads.embedding_sq_norms(i, gg, 3), s.values, s.indices

    sq, values, indices = both(ids, g)
    np.testing.assert_allclose(sq.numpy(), emb_grads.embedding_sq_norms(ids, g, 3).numpy(),
                               rtol=1e-5)
    eager = emb_grads.embedding_clipped_sum(ids, g, weights, VOCAB)
    np.testing.assert_allclose(values.numpy(), eager.values.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(indices.numpy(), eager.indices.numpy())


def test_hyperparameters_keras2():
    layer = keras.layers.Embedding(11, 4, mask_zero=True)
    assert emb_grads.embedding_hyperparameters(layer) == emb_grads.EmbeddingHyperparameters(
        vocab_size=11, output_dim=4, dtype="float32", compute_dtype="float32", mask_zero=True)
    mixed = keras.layers.Embedding(11, 4, dtype="mixed_float16")
    assert emb_grads.embedding_hyperparameters(mixed).dtype == "float32"
    assert emb_grads.embedding_hyperparameters(mixed).compute_dtype == "float16"
    with pytest.raises(ValueError, match="sparse"):
        emb_grads.embedding_hyperparameters(keras.layers.Embedding(11, 4, sparse=True))


def test_docstring_example():
    result = doctest.testmod(emb_grads, verbose=False)
    assert result.attempted > 0 and result.failed == 0


KERAS3_CHILD = textwrap.dedent(r'''
    import dataclasses
    import json
    import numpy as np
    import keras  # Keras 3, before tf_tempered binds anything
    import tensorflow as tf
    from tf_tempered.privacy.layer_grads import embedding as emb_grads
    layer = keras.layers.Embedding(9, 3, mask_zero=True)
    layer.build((None, 4))
    ids = np.array([[1, 1, -1, 8], [2.7, 0, 0, 3]], np.float32)
    g = np.random.default_rng(0).normal(size=(2, 4, 3)).astype(np.float32)
    ref = []
    for b in range(2):
        with tf.GradientTape() as tape:
            y = layer(ids[b:b + 1])
        ref.append(tf.convert_to_tensor(
            tape.gradient(y, layer.embeddings.value, output_gradients=g[b:b + 1])).numpy())
    hp = dataclasses.asdict(emb_grads.embedding_hyperparameters(layer))
    sq = emb_grads.embedding_sq_norms(ids, g, 2, vocab_size=hp["vocab_size"]).numpy()
    print(json.dumps({"hp": hp, "sq": sq.tolist(),
                      "ref": [float(np.sum(r ** 2)) for r in ref]}))
''')


# keras3_suite: a Keras 3 child whichever Keras this process binds (the Keras 3 suite runs it).
@pytest.mark.keras3_suite
def test_keras3_layer_in_a_subprocess():
    """Keras 3's Embedding: the adapter's values and the norms (negative and float ids)."""
    import json
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)
    out = subprocess.run([sys.executable, "-c", KERAS3_CHILD], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["hp"] == {"vocab_size": 9, "output_dim": 3, "dtype": "float32",
                           "compute_dtype": "float32", "mask_zero": True}
    np.testing.assert_allclose(found["sq"], found["ref"], rtol=1e-5)


MEMORY_CHILD = textwrap.dedent(r'''
    import json, sys
    import tf_tempered
    from tf_tempered._compat import tf
    from tf_tempered.privacy.layer_grads import clip_weights as clip_lib
    from tf_tempered.privacy.layer_grads import embedding as emb_grads
    batch, seq, dim, m = 256, 64, 64, 256
    ids = tf.random.stateless_uniform([batch, seq], [1, 2], 0, 50000, tf.int32)
    g = tf.random.stateless_normal([batch, seq, dim], [3, 4])
    out = {}
    for vocab in (50000, 500000):
        @tf.function
        def step(i, gg):
            sq = emb_grads.embedding_sq_norms(i, gg, m)
            norms = tf.sqrt(sq)
            w = clip_lib.ClipWeights(tf.minimum(1.0, 1.0 / norms), tf.ones_like(norms))
            s = emb_grads.embedding_clipped_sum(i, gg, w, vocab)
            return sq, s.values, s.indices
        step(ids, g)  # trace and warm up
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        res = step(ids, g)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        # Largest intermediate anywhere in the graph, by static shape.
        graph = step.get_concrete_function(ids, g).graph
        largest = max(int(t.shape.num_elements() or 0) for op in graph.get_operations()
                      for t in op.outputs)
        out[vocab] = {"peak": int(peak - base), "largest": largest}
        del res
    print(json.dumps(out))
''')


# keras3_suite: TF ops only (no Keras) in a child process; the same on either Keras.
@pytest.mark.keras3_suite
def test_memory_independent_of_vocabulary():
    """V=50 000 vs 500 000 (B=256, T=64, d=64): the same peak, no V-sized tensor.

    Run in a fresh process with the BFC allocator on CPU so that TF's CPU
    memory statistics (get_memory_info) are kept.
    """
    import json
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3",
               TF_CPU_ALLOCATOR_USE_BFC="true")
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    small, large = found["50000"], found["500000"]
    positions_bytes = 256 * 64 * 64 * 4  # one [B·T, d] float32 tensor: 4 MiB
    assert 0 < small["peak"] <= 6 * positions_bytes, found
    assert large["peak"] <= small["peak"] * 1.05 + 2**20, found
    # A [V, d] float32 table alone would be 12.8 MB (V=50 000) and 128 MB (500 000).
    assert large["peak"] < 500000 * 64 * 4 / 10
    assert small["largest"] == large["largest"] == 256 * 64 * 64
