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
"""--recipe: named flag defaults, explicit flags win, unknown names refused with the choices."""

import pytest
from absl import flags

from tf_tempered.experiments import command_line, recipes
from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config


def _flags(*argv):
    fv = flags.FlagValues()
    command_line.define_training_flags(fv)
    fv(["train", *argv])
    return fv


def test_paper_recipe_is_todays_defaults():
    defaults = TrainConfig()
    for name, value in recipes.RECIPES["paper"].items():
        assert getattr(defaults, name) == value, name
    # Measured recipes only: `best` covers the datasets it was selected and measured on.
    assert set(recipes.RECIPES["best"]) == {"mnist", "fashion_mnist"}


def test_recipe_fills_unset_flags_and_explicit_flags_win():
    table = {"fast": {"learning_rate": 4.0, "epochs": 3, "batch_size": 512},
             "per_dataset": {"mnist": {"learning_rate": 1.0}, "fashion_mnist": {"epochs": 7}}}
    fv = _flags("--recipe=fast", "--learning_rate=0.25", "--dataset=digits")
    values = {n: fv[n].value for n in TrainConfig.__dataclass_fields__}
    present = {n for n in values if fv[n].present}
    out = recipes.apply_recipe(values, present, table)
    assert out["learning_rate"] == 0.25  # given explicitly
    assert out["epochs"] == 3 and out["batch_size"] == 512  # from the recipe
    # An explicit flag equal to the default still wins over the recipe.
    fv = _flags("--recipe=fast", "--epochs=60")
    out = recipes.apply_recipe({n: fv[n].value for n in TrainConfig.__dataclass_fields__},
                               {"epochs"}, table)
    assert out["epochs"] == 60 and out["learning_rate"] == 4.0
    per = {"recipe": "per_dataset", "dataset": "fashion_mnist", "epochs": 60,
           "learning_rate": 0.15}
    assert recipes.apply_recipe(per, set(), table) == {**per, "epochs": 7}
    with pytest.raises(ConfigError, match="no values for --dataset=digits.*fashion_mnist, mnist"):
        recipes.apply_recipe({**per, "dataset": "digits"}, set(), table)


def test_config_from_flags_applies_the_recipe():
    config = command_line.config_from_flags(_flags("--recipe=paper", "--learning_rate=3",
                                             "--epochs=2"))
    assert config.recipe == "paper" and config.learning_rate == 3.0 and config.epochs == 2
    assert config.batch_size == 256 and config.l2_norm_clip == 1.0


def test_fashion_mnist_best_averages_the_weights_and_zero_turns_it_off():
    # The second round's selection (results/records_cv/stage1_interim.md): EMA 0.99.
    config = command_line.config_from_flags(_flags("--recipe=best", "--dataset=fashion_mnist"))
    assert config.ema_decay == 0.99 and config.head == "linear"
    validate_config(config)
    off = command_line.config_from_flags(_flags("--recipe=best", "--dataset=fashion_mnist",
                                                "--ema_decay=0"))
    assert off.ema_decay == 0.0
    validate_config(off)


def test_fashion_mnist_best_calibrates_sigma_with_the_pld_accountant():
    # The fifth round's selection (results/records_cv/stage1_interim.md): PLD, +0.11.
    config = command_line.config_from_flags(_flags("--recipe=best", "--dataset=fashion_mnist"))
    assert config.accountant == "pld"
    rdp = command_line.config_from_flags(_flags("--recipe=best", "--dataset=fashion_mnist",
                                                "--accountant=rdp"))
    assert rdp.accountant == "rdp"
    validate_config(config)


def test_mnist_best_averages_the_weights_with_sigma_from_pld_and_both_turn_off():
    # The third MNIST round's selection (results/records_cv/stage1_interim.md): PLD with
    # EMA 0.99 as one candidate, +0.14.
    config = command_line.config_from_flags(_flags("--recipe=best", "--dataset=mnist"))
    assert (config.accountant, config.ema_decay, config.augmult) == ("pld", 0.99, 4)
    validate_config(config)
    before = command_line.config_from_flags(_flags("--recipe=best", "--dataset=mnist",
                                                   "--accountant=rdp", "--ema_decay=0"))
    assert (before.accountant, before.ema_decay) == ("rdp", 0.0)
    validate_config(before)


def test_unknown_recipe_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match="--recipe='bestest' is unknown: choose one of best, paper"):
        command_line.config_from_flags(_flags("--recipe=bestest"))
    with pytest.raises(ConfigError, match="choose one of best, paper"):
        validate_config(TrainConfig(recipe="nope"))
    with pytest.raises(ConfigError, match="unknown flags"):
        recipes.recipe_flags("bad", "mnist", {"bad": {"learnin_rate": 1}})
