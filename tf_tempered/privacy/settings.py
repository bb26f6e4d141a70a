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
"""The DP-SGD settings (clip norm, noise, microbatches) read off a DP optimizer.

`dp_config(optimizer)` is the one reader of an optimizer's privacy settings: the
engine, the callbacks and the scripts all go through it, for tf_tempered's
DPKeras*Optimizer and for TF Privacy's Keras DP optimizers alike.
"""

from tf_tempered._compat import keras  # noqa: F401  (used by the doctests)
from tf_tempered import keras_bridge
from tf_tempered.privacy import optimizers
from tf_tempered.privacy.state import get_state

__all__ = ["DPConfig", "dp_config", "model_dp_config", "settings_config"]


class DPConfig:
    """The DP-SGD settings read off a DP optimizer (tf_tempered's or TF Privacy's).

    ``noise_multiplier`` is the optimizer's σ when it keeps one (tf_tempered's and
    TF Privacy's Vectorized* optimizers), else noise_stddev / l2_norm_clip.
    """

    def __init__(self, l2_norm_clip, noise_stddev, num_microbatches, *, noise_multiplier=None):
        self.l2_norm_clip = float(l2_norm_clip)
        self.noise_stddev = float(noise_stddev)
        self.num_microbatches = num_microbatches
        self._noise_multiplier = None if noise_multiplier is None else float(noise_multiplier)

    @property
    def noise_multiplier(self):
        if self._noise_multiplier is not None:
            return self._noise_multiplier
        return self.noise_stddev / self.l2_norm_clip

    def __repr__(self):
        return (f"DPConfig(l2_norm_clip={self.l2_norm_clip}, noise_multiplier="
                f"{self.noise_multiplier}, num_microbatches={self.num_microbatches})")


def settings_config(*, l2_norm_clip=None, noise_multiplier=None, num_microbatches=None):
    """DPConfig of settings given to make_private, validated; None when none are given.

    >>> settings_config(l2_norm_clip=1.0, noise_multiplier=1.1)
    DPConfig(l2_norm_clip=1.0, noise_multiplier=1.1, num_microbatches=None)
    >>> settings_config() is None
    True
    """
    if l2_norm_clip is None and noise_multiplier is None:
        if num_microbatches is not None:
            raise ValueError(
                "make_private got num_microbatches without l2_norm_clip and noise_multiplier. "
                "Fix: pass all the DP settings to make_private (l2_norm_clip=..., "
                "noise_multiplier=..., num_microbatches=...), or none and compile with a DP "
                "optimizer that carries them (tf_tempered.privacy.DPKerasSGDOptimizer).")
        return None
    missing = [name for name, value in (("l2_norm_clip", l2_norm_clip),
                                        ("noise_multiplier", noise_multiplier)) if value is None]
    if missing:
        raise ValueError(
            f"make_private got {'noise_multiplier' if missing == ['l2_norm_clip'] else 'l2_norm_clip'}"
            f" but not {missing[0]}: DP-SGD needs both. Fix: pass {missing[0]}=... too (e.g. "
            "l2_norm_clip=1.0, noise_multiplier=1.1; tf_tempered.privacy."
            "noise_multiplier_for_epsilon gives σ for a target ε).")
    clip = optimizers._check_l2_norm_clip(l2_norm_clip)  # pylint: disable=protected-access
    sigma = optimizers._check_noise_multiplier(noise_multiplier)  # pylint: disable=protected-access
    return DPConfig(clip, clip * sigma,
                    optimizers._check_num_microbatches(num_microbatches),  # pylint: disable=protected-access
                    noise_multiplier=sigma)


def dp_config(optimizer):
    """DPConfig of a DP optimizer; None for a non-private optimizer.

    Reads tf_tempered's DPKeras*Optimizer (``tf_tempered.privacy.optimizers``) and
    TF Privacy's Keras DP optimizers, also inside Keras' LossScaleOptimizer (mixed
    precision). Raises ValueError for a DP optimizer this engine cannot reproduce
    exactly (a non-Gaussian DP query), rather than training with different privacy.

    >>> from tf_tempered.privacy import DPKerasSGDOptimizer
    >>> config = dp_config(DPKerasSGDOptimizer(l2_norm_clip=2.0, noise_multiplier=0.5,
    ...                                        num_microbatches=4))
    >>> config.l2_norm_clip, config.noise_stddev, config.num_microbatches
    (2.0, 1.0, 4)
    >>> dp_config(keras.optimizers.SGD()) is None
    True
    """
    optimizer = keras_bridge.inner_optimizer(optimizer)
    if isinstance(optimizer, optimizers.DPOptimizerMixin):
        # Validated in its constructor; its attributes are not meant to change after.
        return DPConfig(optimizers._check_l2_norm_clip(optimizer.l2_norm_clip),  # pylint: disable=protected-access
                        optimizer.noise_stddev,
                        optimizers._check_num_microbatches(optimizer.num_microbatches),  # pylint: disable=protected-access
                        noise_multiplier=optimizer.noise_multiplier)
    found = keras_bridge.tf_privacy_optimizer_settings(optimizer)
    if found is None:
        return None
    clip, stddev, num_microbatches, sigma = found
    return _checked(clip, stddev, num_microbatches, noise_multiplier=sigma)


def _checked(clip, stddev, num_microbatches, noise_multiplier=None):
    if not clip > 0:
        raise ValueError(f"l2_norm_clip must be positive, got {clip}.")
    if not stddev >= 0:
        raise ValueError(f"noise_multiplier must be non-negative, got {stddev / clip}.")
    return DPConfig(clip, stddev, num_microbatches, noise_multiplier=noise_multiplier)


def model_dp_config(model):
    """The DPConfig ``model`` trains with: make_private's settings if it was given
    some, else :func:`dp_config` of the model's optimizer (None when it has none or
    a non-private one).

    Raises ValueError when both carry settings and they differ (give them once).

    >>> from tf_tempered.privacy import make_private
    >>> model = make_private(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
    ...                      l2_norm_clip=1.0, noise_multiplier=1.1)
    >>> model_dp_config(model)
    DPConfig(l2_norm_clip=1.0, noise_multiplier=1.1, num_microbatches=None)
    """
    optimizer = getattr(model, "optimizer", None)
    from_optimizer = dp_config(optimizer) if optimizer is not None else None
    state = get_state(model)
    settings = state.settings if state is not None else None
    if settings is None:
        return from_optimizer
    if from_optimizer is not None and repr(from_optimizer) != repr(settings):
        raise ValueError(
            f"make_private was given DP settings {settings} and the model is compiled with "
            f"the DP optimizer {type(optimizer).__name__} carrying different ones "
            f"({from_optimizer}). Fix: give them once, either to make_private (then compile "
            "with a plain Keras optimizer such as keras.optimizers.SGD) or to the DP "
            "optimizer (then call make_private(model) without them).")
    return settings

