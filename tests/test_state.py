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
"""tf_tempered.privacy.state: one PrivateState per private model, out of Keras' tracking."""

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.privacy import EngineOptions, make_private
from tf_tempered.privacy.state import SAMPLINGS, PrivateState, get_state


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_make_private_creates_one_state_with_its_arguments():
    model = _model()
    assert get_state(model) is None
    options = EngineOptions(clipped_sum="second_pass")
    make_private(model, l2_norm_clip=0.5, noise_multiplier=1.3, sampling="shuffle",
                 options=options)
    state = get_state(model)
    assert isinstance(state, PrivateState)
    assert state.settings.l2_norm_clip == 0.5 and state.settings.noise_multiplier == 1.3
    assert state.sampling == "shuffle" in SAMPLINGS
    assert state.options == options and state.augmentation_multiplicity == 1
    assert state.steps_taken() == 0 and state.layer_paths is None


def test_state_is_no_weight_and_counts_the_steps():
    model = _model()
    weights_before = len(model.weights)
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    assert len(model.weights) == weights_before
    model.fit(np.ones((8, 3), np.float32), np.zeros(8), batch_size=4, epochs=1, verbose=0)
    state = get_state(model)
    # Poisson sampling: ceil(1/q) = 2 steps of expected size 4 over 8 examples.
    assert state.steps_taken() == 2
    assert [row["layer"] for row in state.layer_paths] == [model.layers[0].name]


def test_get_state_of_objects_without_a_dict():
    assert get_state(3) is None


def test_make_private_again_with_one_of_clip_and_sigma_keeps_the_other(tmp_path):
    # It was refused ("DP-SGD needs both"), also for a loaded model whose saved clip was
    # there, though make_private again keeps every setting not given.
    import pytest  # pylint: disable=g-import-not-at-top
    with pytest.raises(ValueError, match="got noise_multiplier but not l2_norm_clip"):
        make_private(_model(), noise_multiplier=3.0)  # nothing to keep: refused
    model = make_private(_model(), l2_norm_clip=0.5, noise_multiplier=1.3, num_microbatches=2,
                         sampling="shuffle")
    make_private(model, noise_multiplier=3.0)
    settings = get_state(model).settings
    assert (settings.l2_norm_clip, settings.noise_multiplier, settings.num_microbatches) == \
        (0.5, 3.0, 2)
    make_private(model, l2_norm_clip=0.25)
    settings = get_state(model).settings
    assert (settings.l2_norm_clip, settings.noise_multiplier) == (0.25, 3.0)
    model.fit(np.ones((4, 3), np.float32), np.zeros(4), batch_size=4, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = make_private(keras.models.load_model(path), noise_multiplier=2.0)
    settings = get_state(loaded).settings
    assert (settings.l2_norm_clip, settings.noise_multiplier) == (0.25, 2.0)
