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
"""EngineOptions: defaults, validation, and make_private(options=...)."""

import dataclasses

import pytest

from tf_tempered._compat import keras
from tf_tempered.privacy import EngineOptions, make_private
from tf_tempered.privacy.options import NORM_PATHS
from tf_tempered.privacy.state import get_state


def test_defaults_are_the_measured_thresholds(monkeypatch):
    monkeypatch.delenv("TF_TEMPERED_NATIVE", raising=False)
    options = EngineOptions()
    assert options.native is True
    assert options.norm_path == "auto" and options.forced is None
    assert options.materialize_max_bytes == 64 * 2**20
    assert options.depthwise_max_channel_pairs is None  # by the runtime:
    assert options.conv2d_depthwise_max_channel_pairs(onednn=True) == 64
    assert options.conv2d_depthwise_max_channel_pairs(onednn=False) == 0
    assert options.native_min_ghost_rows == 32
    assert options.native_materialize_min_rows == 64
    assert options.patch_chunk_bytes == 32 * 2**20
    assert options.depthwise_chunk == 128
    assert options.vectorize_recurrent is True


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_environment_switch_turns_native_off_by_default(monkeypatch, value):
    # Every spelling the library's loader reads as off (it then builds nothing).
    monkeypatch.setenv("TF_TEMPERED_NATIVE", value)
    assert EngineOptions().native is False
    assert EngineOptions(native=True).native is True


@pytest.mark.parametrize("value", ["1", "on", ""])
def test_environment_switch_on_or_unset_keeps_native(monkeypatch, value):
    monkeypatch.setenv("TF_TEMPERED_NATIVE", value)
    assert EngineOptions().native is True


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineOptions().norm_path = "ghost"  # type: ignore[misc]


@pytest.mark.parametrize("norm_path", NORM_PATHS)
def test_every_norm_path_is_accepted(norm_path):
    assert EngineOptions(norm_path=norm_path, native=True).norm_path == norm_path


@pytest.mark.parametrize("field,value,message", [
    ("native", 1, "native must be True or False"),
    ("native", "yes", "native must be True or False"),
    ("norm_path", "fast", "norm_path must be one of auto, ghost, materialize, native, depthwise"),
    ("materialize_max_bytes", -1, "materialize_max_bytes must be an integer >= 0"),
    ("materialize_max_bytes", 1.5, "materialize_max_bytes must be an integer >= 0"),
    ("depthwise_max_channel_pairs", True, "depthwise_max_channel_pairs must be an integer"),
    ("native_min_ghost_rows", -3, "native_min_ghost_rows must be an integer >= 0"),
    ("native_materialize_min_rows", None, "native_materialize_min_rows must be an integer"),
    ("patch_chunk_bytes", 0, "patch_chunk_bytes must be an integer >= 1"),
    ("depthwise_chunk", 0, "depthwise_chunk must be an integer >= 1"),
    ("vectorize_recurrent", 0, "vectorize_recurrent must be True or False"),
    ("norms_in_backward", "no", "norms_in_backward must be True or False"),
    ("fused_clipped_sum", 1, "fused_clipped_sum must be True or False"),
    ("clipped_sum", "ghost", "clipped_sum must be one of bookkeeping, second_pass, recompute"),
])
def test_bad_values_name_the_option_and_the_allowed_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineOptions(**{field: value})


def test_low_memory_preset_and_overrides():
    options = EngineOptions.low_memory()
    assert (options.clipped_sum, options.materialize_max_bytes, options.patch_chunk_bytes) == (
        "recompute", 8 * 2**20, 4 * 2**20)
    assert EngineOptions.low_memory(clipped_sum="second_pass").clipped_sum == "second_pass"
    assert EngineOptions().clipped_sum == "bookkeeping"
    assert EngineOptions.low_memory(patch_chunk_bytes=2**20).patch_chunk_bytes == 2**20
    with pytest.raises(ValueError, match="clipped_sum must be one of"):
        EngineOptions.low_memory(clipped_sum="both")


def test_native_path_needs_the_native_op():
    with pytest.raises(ValueError, match="norm_path='native' needs native=True"):
        EngineOptions(native=False, norm_path="native")


def test_make_private_takes_options_and_refuses_other_types():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    options = EngineOptions(norm_path="ghost")
    assert get_state(make_private(model, options=options)).options is options
    make_private(model)  # again, without: the options given before are kept
    assert get_state(model).options is options
    make_private(model, options=EngineOptions())
    assert get_state(model).options == EngineOptions()
    with pytest.raises(TypeError, match="options must be a tf_tempered.privacy.EngineOptions"):
        make_private(model, options={"norm_path": "ghost"})
