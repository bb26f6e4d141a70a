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
"""tf_tempered.privacy.step: each stage of the DP step, run by hand in the order of
``keras_step.dp_gradients``, against the closed form of a linear model.

For f(x) = w·x + b and the squared error ℓ_i = (f(x_i) − y_i)², example i's gradient is
g_i = 2 r_i (x_i, 1) with r_i = f(x_i) − y_i, so ‖g_i‖ = 2|r_i|·√(‖x_i‖² + 1), the clip
factor c_i = C / max(‖g_i‖, C), and with σ = 0 the update is Σ_i c_i g_i / B.
"""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private
from tf_tempered.privacy.errors import NotPrivateError
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step import batch as batch_stage
from tf_tempered.privacy.step import clipped_sum
from tf_tempered.privacy.step.backward import backward
from tf_tempered.privacy.step.clip_factors import clip_factors
from tf_tempered.privacy.step.forward import record_forward
from tf_tempered.privacy.step.metrics import local_stats
from tf_tempered.privacy.step.noise import noised_mean
from tf_tempered.privacy.step.norms import layer_norms
from tf_tempered.privacy.step.plan import plan_step

CLIP = 1.5
X = np.array([[1.0, 2.0], [0.5, -1.0], [0.0, 0.1], [3.0, 1.0]], np.float32)
Y = np.array([[1.0], [0.0], [0.2], [-2.0]], np.float32)
W, B = np.array([[0.3], [-0.2]], np.float32), np.array([0.1], np.float32)


def _linear_model(clipped_sum_mode="bookkeeping", norms_in_backward=True):
    from tf_tempered.privacy import EngineOptions  # pylint: disable=g-import-not-at-top
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.layers[0].set_weights([W, B])
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=CLIP, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.MeanSquaredError(reduction="none"))
    make_private(model, options=EngineOptions(clipped_sum=clipped_sum_mode,
                                              norms_in_backward=norms_in_backward))
    return model


def _closed_form():
    residual = (X @ W + B)[:, 0] - Y[:, 0]
    grads = 2 * residual[:, None] * np.concatenate([X, np.ones((4, 1), np.float32)], 1)
    norms = np.linalg.norm(grads, axis=1)
    factors = CLIP / np.maximum(norms, CLIP)
    return residual ** 2, norms, factors, (factors[:, None] * grads).sum(0) / len(X)


def _stages(model, data):
    """The stages of keras_step.dp_gradients in order, traced (as Keras runs them); returns
    what each stage left."""
    state = get_state(model)
    plan = plan_step(model, state)
    batch = batch_stage.unpack_batch(data)
    forward = record_forward(model, batch, plan)
    layout, groups = backward(model, forward, plan, len(X))
    layers = layer_norms(model, state, groups, layout, forward.recorder.norm_hooks)
    norm, finite, weights = clip_factors(layers, forward.num_microbatches, CLIP)
    summed = plan.clipped_sum.sum(forward, layers, weights, model.trainable_variables)
    stats = plan.replicas.sum(local_stats(plan, batch, forward, norm, finite))
    grads = [g for g, _ in noised_mean(model, state, plan, batch, forward, summed, stats)]
    hooks = forward.recorder.norm_hooks
    return {"plan": plan, "layers": [layer.first.layer.name for layer in layers],
            "summed_ops": [s.op for s in summed.values()],
            "norms_in_backward": None if hooks is None else [
                r.layer.name for r in forward.recorder.records if id(r) in hooks.results],
            "losses": forward.losses, "norm": norm, "finite": finite, "scale": weights.scale,
            "update": tf.concat([tf.reshape(g, [-1]) for g in grads], 0)}


def _run_stages(model, data):
    kept = {}

    @tf.function
    def traced():
        # Tensors, as Keras' data adapters give them.
        result = _stages(model, tf.nest.map_structure(tf.convert_to_tensor, data))
        kept.update(plan=result.pop("plan"), layers=result.pop("layers"),
                    summed_ops=result.pop("summed_ops"),
                    norms_in_backward=result.pop("norms_in_backward"))
        return result

    return dict(traced(), **kept)


@pytest.mark.keras3_suite  # the stages on a linear model; Keras 2 layers: the conformance tests
@pytest.mark.parametrize("mode,norms_in_backward", [
    ("bookkeeping", True), ("bookkeeping", False), ("second_pass", True), ("recompute", True)])
def test_stages_in_order_match_the_closed_form(mode, norms_in_backward):
    model = _linear_model(mode, norms_in_backward)
    losses, norms, factors, update = _closed_form()
    got = _run_stages(model, (X, Y))
    assert type(got["plan"].clipped_sum) is type(clipped_sum.strategy_for(mode, model))
    # The one layer's norms came from inside the backward pass, or (option off) after it.
    assert got["norms_in_backward"] == ([model.layers[0].name] if norms_in_backward else None)
    assert got["plan"].config.l2_norm_clip == CLIP and got["plan"].local_microbatches is None
    assert got["layers"] == [model.layers[0].name]
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    np.testing.assert_allclose(got["norm"], norms, rtol=1e-5)
    np.testing.assert_array_equal(got["finite"], np.ones(4))
    np.testing.assert_allclose(got["scale"], factors, rtol=1e-5)
    np.testing.assert_allclose(got["update"], update, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["bookkeeping", "second_pass"])
def test_a_recurrent_layers_own_loop_keeps_its_norms_after_the_backward_pass(mode):
    """The one-pass sum computes an LSTM's norms after the backward pass (inside it they
    held up the gradient below: slower, no less memory), the two-pass sums inside it."""
    from tf_tempered.privacy import EngineOptions  # pylint: disable=g-import-not-at-top
    model = keras.Sequential([keras.Input((5,)), keras.layers.Embedding(7, 3, name="embed"),
                              keras.layers.LSTM(4, name="lstm"),
                              keras.layers.Dense(1, name="head")])
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=CLIP, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.MeanSquaredError(reduction="none"))
    make_private(model, options=EngineOptions(clipped_sum=mode))
    data = (np.arange(20, dtype=np.int32).reshape(4, 5) % 7, Y)
    inside = _run_stages(model, data)["norms_in_backward"]
    expected = {"bookkeeping": ["embed", "head"], "second_pass": ["embed", "lstm", "head"]}
    assert sorted(inside) == sorted(expected[mode])


def _ancestors(op):
    """Every op ``op`` waits for: its inputs' ops and control inputs, transitively."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def test_the_noise_is_drawn_once_every_clipped_sum_is_known():
    """Drawn as soon as the forward pass ended, the scheduler ran the draw beside the
    backward pass, and an Embedding's [V, d] noise coexisted with its activations (the
    text classifier's peak memory, alone in a process: 1.30-1.33x the non-private step's
    against 1.13-1.18x with the draw after the sums)."""
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 2),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=CLIP, noise_multiplier=1.0,
                                                learning_rate=0.1),
                  loss=keras.losses.MeanSquaredError(reduction="none"))
    make_private(model)
    data = (np.arange(12, dtype=np.int32).reshape(4, 3) % 10, Y)
    got = _run_stages(model, data)
    graph = got["summed_ops"][0].graph
    counter = get_state(model).noise._counter  # pylint: disable=protected-access
    handle = {id(ext): inner for ext, inner in graph.captures}[id(counter.handle)]
    [draw] = [op for op in graph.get_operations()
              if op.type == "AssignAddVariableOp" and op.inputs[0] is handle]
    waits_for = _ancestors(draw)
    assert len(got["summed_ops"]) == 3  # the Embedding's sum, the kernel's, the bias'
    assert all(op in waits_for for op in got["summed_ops"])


def test_poisson_batch_divides_by_the_expected_batch_size():
    model = _linear_model()
    mask = np.array([1.0, 1.0, 0.0, 1.0], np.float32)  # row 2 is padding
    got = _run_stages(model, (X, Y, {"mask": mask, "expected_batch_size": np.float32(5.0)}))
    residual = (X @ W + B)[:, 0] - Y[:, 0]
    grads = 2 * residual[:, None] * np.concatenate([X, np.ones((4, 1), np.float32)], 1)
    _, _, factors, _ = _closed_form()
    expected = (mask[:, None] * factors[:, None] * grads).sum(0) / 5.0
    np.testing.assert_allclose(got["update"], expected, rtol=1e-5, atol=1e-7)


def test_clip_factors_zero_a_nonfinite_microbatch():
    class _Layer:  # the one field clip_factors reads
        def __init__(self, sq):
            self.result = type("R", (), {"sq_norms": tf.constant(sq, tf.float32)})()

    norm, finite, weights = clip_factors([_Layer([4.0, np.inf, 0.25]), _Layer([5.0, 1.0, 0.0])],
                                         3, l2_norm_clip=1.0)
    np.testing.assert_allclose(norm, [3.0, np.inf, 0.5])
    np.testing.assert_array_equal(finite, [1.0, 0.0, 1.0])
    np.testing.assert_allclose(weights.scale, [1 / 3, 0.0, 1.0], rtol=1e-6)


def test_unpack_sample_weight_poisson_and_user_weights():
    mask = tf.constant([1.0, 0.0, 1.0])
    weight, user, got_mask, normalizer = batch_stage.unpack_sample_weight(
        {"mask": mask, "expected_batch_size": 2.5, "sample_weight": tf.constant([2.0, 3.0, 0.5])})
    np.testing.assert_allclose(weight, [2.0, 0.0, 0.5])
    np.testing.assert_allclose(user, [2.0, 3.0, 0.5])
    assert got_mask is mask and normalizer == 2.5
    plain = tf.constant([1.0, 2.0])
    assert batch_stage.unpack_sample_weight(plain) == (plain, plain, None, None)
    for broken in ({"mask": mask}, {"mask": mask, "sample_weight": plain},
                   {"mask": mask, "expected_batch_size": 2.5, "extra": 1}):
        with pytest.raises(ValueError, match=r"Poisson-batch structure.*got keys"):
            batch_stage.unpack_sample_weight(broken)
    # Per-output weights of a model with an output named "mask" (probe U, F4): as given.
    per_output = {"mask": mask, "cls": mask}
    assert batch_stage.unpack_sample_weight(per_output) == (per_output, per_output, None, None)


def test_negative_sample_weight_is_refused_with_the_fix():
    with pytest.raises(tf.errors.InvalidArgumentError, match="pass finite weights >= 0"):
        batch_stage.unpack_batch((X, Y, tf.constant([1.0, -1.0, 1.0, 1.0])))


def test_plan_refuses_a_model_without_dp_settings():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    make_private(model)
    with pytest.raises(NotPrivateError, match=r"Fix: give the settings to make_private"):
        plan_step(model, get_state(model))
