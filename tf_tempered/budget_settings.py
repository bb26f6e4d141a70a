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
"""What PrivacyBudget reads from the model it watches: DP settings, and whether ε holds.

For a model tf_tempered does not train (TF Privacy's own DP path): σ and the microbatch
size, each from the budget's arguments if given, else from the model (TF Privacy's
DPModel/DPSequential) or its DP optimizer (ours or TF Privacy's); microbatch size =
⌈batch_size / num_microbatches⌉. For any model: ``epsilon_holds``, True for make_private's
secret randomness, False for ``insecure_dp_seed``, None when tf_tempered does not draw the
noise. The callback itself: :mod:`tf_tempered.privacy_budget`.
"""

import math
import warnings

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import errors, randomness, settings
from tf_tempered.privacy.make_private import has_secret_dp_randomness
from tf_tempered.privacy.state import get_state

__all__ = ["dp_optimizer_settings", "legacy_dp_settings", "epsilon_holds"]


def dp_optimizer_settings(optimizer):
    """(noise_multiplier, num_microbatches) of a DP optimizer (ours or TF Privacy's), or None.

    >>> from tf_tempered._compat import keras
    >>> from tf_tempered.privacy import DPKerasSGDOptimizer
    >>> dp_optimizer_settings(DPKerasSGDOptimizer(l2_norm_clip=2.0, noise_multiplier=1.1,
    ...                                           num_microbatches=4))
    (1.1, 4)
    >>> dp_optimizer_settings(keras.optimizers.SGD()) is None
    True
    """
    if optimizer is None:
        return None
    _check_no_gradient_accumulation(optimizer)
    config = settings.dp_config(optimizer)  # the one reader of TF Privacy's optimizer settings
    return None if config is None else (config.noise_multiplier, config.num_microbatches)


def _check_no_gradient_accumulation(optimizer):
    steps = getattr(optimizer, "gradient_accumulation_steps", None) or 1
    if steps > 1:
        raise ValueError(
            f"gradient_accumulation_steps={steps} > 1 is not "
            f"accounted for (the batch and the noise per update change); account for it "
            f"yourself with tf_tempered.privacy.accounting.compute_epsilon.")


def _model_dp_settings(model):
    """(σ, num_microbatches) a model tf_tempered does not train trains with, or None."""
    _check_no_gradient_accumulation(getattr(model, "optimizer", None))
    config = settings.model_dp_config(model)
    if config is not None:
        return config.noise_multiplier, config.num_microbatches
    return keras_bridge.tf_privacy_model_settings(model)


def legacy_dp_settings(model, *, num_examples, batch_size, noise_multiplier, microbatch_size):
    """(σ, microbatch size) of PrivacyBudget's ε for a model tf_tempered does not train.

    ``model`` may be None (then only the arguments count). ValueError when ``num_examples``
    or ``batch_size`` is None, or σ is neither given nor found.
    """
    # A model that trains without DP first: passing the sizes would not help it (probe W).
    found = _model_dp_settings(model) if model is not None else None
    if model is not None and found is None:
        raise errors.NotPrivateError(
            "PrivacyBudget: nothing on this model clips and noises its gradients (it was not "
            "prepared by tf_tempered.make_private, is not compiled with a DP optimizer, and "
            "is not a TF Privacy DPModel), so it trains without differential privacy and no "
            "ε holds for it. Fix: make_private(model, l2_norm_clip=..., noise_multiplier=...) "
            "before compile; fit then draws Poisson batches and the budget reads the settings "
            "from the model.")
    if num_examples is None or batch_size is None:
        raise ValueError(
            "PrivacyBudget needs num_examples= and batch_size= for a model that "
            "tf_tempered.make_private did not prepare (Keras does not tell callbacks "
            "the data size): pass them, e.g. PrivacyBudget(..., num_examples=60000, "
            "batch_size=256), or call make_private(model) (then they are known).")
    if found and noise_multiplier is not None and not math.isclose(
            float(noise_multiplier), float(found[0]), rel_tol=1e-9):
        raise ValueError(
            f"PrivacyBudget(noise_multiplier={noise_multiplier!r}), but the model's DP "
            f"optimizer adds noise_multiplier={found[0]!r}. Fix: drop noise_multiplier= (the "
            "budget reads it from the model).")
    sigma = noise_multiplier if noise_multiplier is not None else (
        found[0] if found else None)
    if sigma is None:
        raise ValueError(
            "PrivacyBudget found no noise_multiplier: the model was not given DP "
            "settings by tf_tempered.make_private(model, l2_norm_clip=..., "
            "noise_multiplier=...) and is not compiled with a DP optimizer "
            "(tf_tempered.privacy.DPKeras*Optimizer, or TF Privacy's "
            "DPKeras*/GenericDP*/VectorizedDPKeras*). Pass noise_multiplier= explicitly.")
    count = found[1] if found else None
    used = None if count is None else max(1, math.ceil(batch_size / int(count)))
    if microbatch_size is not None and used is not None and microbatch_size != used:
        raise ValueError(
            f"PrivacyBudget(microbatch_size={microbatch_size!r}), but the model's DP optimizer "
            f"splits each batch of {batch_size} into {count} microbatches of {used}. Fix: drop "
            "microbatch_size= (the budget reads it from the model).")
    microbatch = microbatch_size if microbatch_size is not None else (used or 1)
    return float(sigma), microbatch


def _global_seed_is_set():
    """Whether tf.random.set_seed (or keras.utils.set_random_seed) has fixed a global seed."""
    # An explicit op seed (0) leaves TF's op-seed counter alone; without a global seed,
    # TF pairs it with DEFAULT_GRAPH_SEED = 87654321.
    return tf.compat.v1.get_seed(0)[0] != 87654321


def epsilon_holds(model):
    """PrivacyBudget's ``epsilon_holds`` for ``model`` (None: no model); warns if ε may not hold.

    The warnings point at the caller of the callback hook that calls this (stacklevel 3).
    """
    if model is None:
        return None
    if get_state(model) is not None:
        holds = has_secret_dp_randomness(model)
        if not holds:
            warnings.warn(
                f"PrivacyBudget: model {model.name!r} was made private with "
                f"insecure_dp_seed, so {randomness.INSECURE_NOTE}; the epsilon logged "
                f"is what a private run with these settings would spend.",
                errors.InsecureDPRandomnessWarning, stacklevel=3)
        return holds
    if _global_seed_is_set():
        warnings.warn(
            f"PrivacyBudget: model {model.name!r} trains on TF Privacy's own DP path, "
            f"whose noise follows TensorFlow's global seed, and a global seed is set "
            f"(keras.utils.set_random_seed / tf.random.set_seed): anyone who knows it can "
            f"regenerate the noise, and the epsilon does not hold. Use "
            f"tf_tempered.make_private(model) for secret noise.", UserWarning, stacklevel=3)
    return None
