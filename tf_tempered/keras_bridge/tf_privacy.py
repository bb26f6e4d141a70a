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
"""TF Privacy internals: the DP settings its optimizers and models keep in private attributes.

TF Privacy's Keras DP optimizers (DPKeras*, GenericDP* with a Gaussian query,
VectorizedDPKeras*) keep the clip norm, noise and microbatches in private attributes,
and mark a DP gradient computation with ``_was_dp_gradients_called``; its DPModel /
DPSequential keep σ on the model. tf_tempered's own DP optimizers use the same mark.
"""

__all__ = ["add_dp_mark", "clear_dp_mark", "dp_mark_is_set", "has_dp_mark", "set_dp_mark",
           "tf_privacy_model_settings", "tf_privacy_optimizer_settings"]


def has_dp_mark(optimizer):
    """Whether the optimizer takes TF Privacy's DP mark (a DP optimizer, or a marked one)."""
    return hasattr(optimizer, "_was_dp_gradients_called")


def set_dp_mark(optimizer):
    """Marks the next ``apply_gradients`` as the DP engine's (a DP optimizer refuses others)."""
    if has_dp_mark(optimizer):
        optimizer._was_dp_gradients_called = True  # pylint: disable=protected-access


def add_dp_mark(optimizer):
    """Gives ``optimizer`` the DP mark, unset, unless it has one (TF Privacy's protocol)."""
    if not has_dp_mark(optimizer):
        optimizer._was_dp_gradients_called = False  # pylint: disable=protected-access


def dp_mark_is_set(optimizer):
    """Whether the DP engine marked the optimizer's next update as its own."""
    return bool(getattr(optimizer, "_was_dp_gradients_called", False))


def clear_dp_mark(optimizer):
    """Unsets the mark after the update it allowed: one mark, one update."""
    optimizer._was_dp_gradients_called = False  # pylint: disable=protected-access


def tf_privacy_optimizer_settings(optimizer):
    """(l2_norm_clip, noise stddev, num_microbatches, σ or None) of a TF Privacy DP optimizer.

    None for an optimizer without the DP mark. Raises ValueError for a DP query this
    engine cannot reproduce exactly (anything but the Gaussian sum query).
    """
    if not has_dp_mark(optimizer) or not (hasattr(optimizer, "_dp_sum_query")
                                          or hasattr(optimizer, "_noise_multiplier")):
        return None  # no DP optimizer of TF Privacy's (a plain one marked for saving)
    num_microbatches = getattr(optimizer, "_num_microbatches", None)
    if num_microbatches is not None:
        num_microbatches = int(num_microbatches)
        if num_microbatches <= 0:
            raise ValueError(f"num_microbatches must be positive, got {num_microbatches}.")
    if hasattr(optimizer, "_noise_multiplier"):  # Vectorized* optimizers
        clip = float(optimizer._l2_norm_clip)  # pylint: disable=protected-access
        sigma = float(optimizer._noise_multiplier)  # pylint: disable=protected-access
        return clip, clip * sigma, num_microbatches, sigma
    query = getattr(optimizer, "_dp_sum_query", None)
    if type(query).__name__ != "GaussianSumQuery":
        raise ValueError(
            f"The optimizer {type(optimizer).__name__} uses the DP query "
            f"{type(query).__name__}; the fast DP engine reproduces the Gaussian "
            "sum query only (DPKeras*/GenericDP* with GaussianSumQuery, "
            "VectorizedDPKeras*). Use one of those, or train without "
            "tf_tempered.privacy.make_private to use TF Privacy's own path.")
    return (float(query._l2_norm_clip), float(query._stddev),  # pylint: disable=protected-access
            num_microbatches, None)


def tf_privacy_model_settings(model):
    """(σ, num_microbatches) of TF Privacy's DPModel/DPSequential, or None."""
    sigma = getattr(model, "_noise_multiplier", None)
    if sigma is None:
        return None
    return float(sigma), getattr(model, "_num_microbatches", None)
