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
"""The search space: axes parsed as the flag types, joint axes, grid, random and
one-at-a-time trials."""

import pytest

from tf_tempered.experiments import search_space
from tf_tempered.experiments.common import ConfigError, TrainConfig

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

BASE = TrainConfig(dataset="digits", epochs=1, batch_size=128, learning_rate=0.5,
                   target_epsilon=3.0, validation_size=300)


def test_axes_parse_as_the_flag_types():
    assert search_space.parse_axis("learning_rate=0.5,2") == ("learning_rate", [0.5, 2.0])
    assert search_space.parse_axis("batch_size=64,128") == ("batch_size", [64, 128])
    assert search_space.parse_axis("ema_decay=none,0.99") == ("ema_decay", [None, 0.99])
    # A flag unset by default takes names (a TypeError before).
    assert search_space.parse_axis("recipe=paper,best") == ("recipe", ["paper", "best"])
    name, values = search_space.parse_axis("activation=tanh,ts:1/4/0.5,ts_learnable:2/2/1")
    assert values[0]["activation"] == "tanh" and values[0]["scale"] == 2.0
    assert values[1] == {"activation": "tempered_sigmoid", "scale": 1.0,
                         "inverse_temperature": 4.0, "offset": 0.5, "learnable": False}
    assert values[2]["learnable"] is True
    labels = [c for c, _ in search_space.expand_trials(BASE, [(name, values)])]
    assert labels == [{"activation": "tanh"}, {"activation": "ts:1/4/0.5"},
                      {"activation": "ts_learnable:2/2/1"}]
    for bad, match in (("learning_rate", "FLAG=V1"), ("noise_multiplier=1", "cannot be searched"),
                       ("target_epsilon=1,2", "cannot be searched"),
                       ("activation=ts:1/2", "ts:S/T/O"), ("batch_size=abc", "not a valid int")):
        with pytest.raises(ConfigError, match=match):
            search_space.parse_axis(bad)


def test_grid_and_random_trials():
    axes = [search_space.parse_axis("learning_rate=0.5,1,2"),
            search_space.parse_axis("l2_norm_clip=0.1,1")]
    grid = search_space.expand_trials(BASE, axes)
    assert [(c.learning_rate, c.l2_norm_clip) for _, c in grid] == [
        (0.5, 0.1), (0.5, 1.0), (1.0, 0.1), (1.0, 1.0), (2.0, 0.1), (2.0, 1.0)]
    picked = search_space.expand_trials(BASE, axes, search="random", num_trials=4, seed=3)
    again = search_space.expand_trials(BASE, axes, search="random", num_trials=4, seed=3)
    assert len(picked) == 4 and [c for _, c in picked] == [c for _, c in again]
    assert len({(c.learning_rate, c.l2_norm_clip) for _, c in picked}) == 4  # no repeats
    with pytest.raises(ConfigError, match="num_trials"):
        search_space.expand_trials(BASE, axes, search="random")


def test_joint_axes_set_their_flags_together():
    name, values = search_space.parse_axis("batch_size+epochs+learning_rate=128+1+0.5,64+3+2")
    assert name == "batch_size+epochs+learning_rate"
    assert values == [{"batch_size": 128, "epochs": 1, "learning_rate": 0.5},
                      {"batch_size": 64, "epochs": 3, "learning_rate": 2.0}]
    trials = search_space.expand_trials(BASE, [(name, values)])
    assert [(c.batch_size, c.epochs, c.learning_rate) for _, c in trials] == [
        (128, 1, 0.5), (64, 3, 2.0)]
    assert trials[1][0] == {name: "64+3+2.0"}
    for bad, match in (("batch_size+epochs=64", "1 part"),
                       ("batch_size+activation=64+tanh", "joint axis"),
                       ("batch_size+delta=64+1e-6", "cannot be searched")):
        with pytest.raises(ConfigError, match=match):
            search_space.parse_axis(bad)
    with pytest.raises(ConfigError, match="twice"):
        search_space.expand_trials(BASE, [search_space.parse_axis("batch_size+epochs=64+1"),
                                    search_space.parse_axis("epochs=2")])


def test_one_at_a_time_is_the_base_and_each_value_alone():
    # none is the base's value, and 128+1 the base's batch size and epochs: not repeated.
    axes = [search_space.parse_axis("ema_decay=none,0.99,0.999"),
            search_space.parse_axis("batch_size+epochs=128+1,64+2"),
            search_space.parse_axis("learning_rate=2")]
    trials = search_space.expand_trials(BASE, axes, search="one_at_a_time")
    assert [labels for labels, _ in trials] == [
        {}, {"ema_decay": 0.99}, {"ema_decay": 0.999}, {"batch_size+epochs": "64+2"},
        {"learning_rate": 2.0}]
    configs = [c for _, c in trials]
    assert configs[0] == BASE
    assert [(c.ema_decay, c.batch_size, c.epochs, c.learning_rate) for c in configs[1:]] == [
        (0.99, 128, 1, 0.5), (0.999, 128, 1, 0.5), (None, 64, 2, 0.5), (None, 128, 1, 2.0)]


def test_one_at_a_time_lets_a_flag_vary_alone_and_jointly():
    # The Fashion-MNIST round-2 design: lr alone, epochs alone, and both in a joint axis.
    axes = [search_space.parse_axis("learning_rate=2,8"), search_space.parse_axis("epochs=3"),
            search_space.parse_axis("batch_size+epochs+learning_rate=64+2+8,128+3+0.5")]
    trials = search_space.expand_trials(BASE, axes, search="one_at_a_time")
    assert [(c.batch_size, c.epochs, c.learning_rate) for _, c in trials] == [
        (128, 1, 0.5), (128, 1, 2.0), (128, 1, 8.0), (128, 3, 0.5), (64, 2, 8.0)]
    # 128+3+0.5 equals the epochs=3 trial: trained once.
    assert trials[-1][0] == {"batch_size+epochs+learning_rate": "64+2+8.0"}
    with pytest.raises(ConfigError, match="one_at_a_time"):  # combined, it stays refused
        search_space.expand_trials(BASE, axes, search="grid")
