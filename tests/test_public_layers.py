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
"""Preprocessing state fit to data by adapt(): refused until declared public (public_layers.py)."""

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.privacy import NotPrivateError, epsilon_spent, make_private

pytestmark = pytest.mark.filterwarnings("ignore:fit on a pipeline")
ROWS = 16
RNG = np.random.default_rng(0)
NUMBERS = RNG.normal(size=(ROWS, 3)).astype("float32")
WORDS = np.array(["good film", "bad plot", "great cast", "awful end"] * (ROWS // 4))
LABELS = np.arange(ROWS) % 2


def _head(x):
    return keras.layers.Dense(2, name="logits")(keras.layers.Flatten()(x))


def _embedded(x, vocabulary_size=20):
    x = keras.layers.Embedding(vocabulary_size, 3)(x)
    return keras.layers.Dense(2, name="logits")(keras.layers.GlobalAveragePooling1D()(x))


# name -> (inputs, the layer adapted, the same kind given its state, build the rest, data)
def _cases():
    return {
        "normalization": (keras.Input((3,)), lambda: keras.layers.Normalization(name="pre"),
                          lambda: keras.layers.Normalization(mean=0.0, variance=1.0, name="pre"),
                          _head, NUMBERS, NUMBERS),
        "discretization": (keras.Input((3,)),
                           lambda: keras.layers.Discretization(num_bins=3, name="pre"),
                           lambda: keras.layers.Discretization(bin_boundaries=[0.0], name="pre"),
                           lambda x: _head(keras.layers.Embedding(4, 2)(x)), NUMBERS, NUMBERS),
        "text_vectorization": (
            keras.Input((), dtype="string"),
            lambda: keras.layers.TextVectorization(output_sequence_length=2, name="pre"),
            lambda: keras.layers.TextVectorization(output_sequence_length=2, name="pre",
                                                   vocabulary=["good", "bad"]),
            _embedded, WORDS, WORDS),
        "string_lookup": (keras.Input((), dtype="string"),
                          lambda: keras.layers.StringLookup(name="pre"),
                          lambda: keras.layers.StringLookup(vocabulary=["good film"], name="pre"),
                          lambda x: _embedded(x[:, None]), WORDS, WORDS),
        "integer_lookup": (keras.Input((), dtype="int64"),
                           lambda: keras.layers.IntegerLookup(name="pre"),
                           lambda: keras.layers.IntegerLookup(vocabulary=[1, 2], name="pre"),
                           lambda x: _embedded(x[:, None]), LABELS.astype("int64"),
                           LABELS.astype("int64")),
    }


def _private(case, adapted, **make_private_kwargs):
    inputs, make_adapted, make_given, rest, adapt_on, _ = _cases()[case]
    layer = make_adapted() if adapted else make_given()
    if adapted:
        layer.adapt(adapt_on)
    model = keras.Model(inputs, rest(layer(inputs)))
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1, **make_private_kwargs)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.parametrize("case", list(_cases()))
def test_an_adapted_layer_is_refused_until_declared_public(case):
    data = _cases()[case][-1]
    model = _private(case, adapted=True)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NotPrivateError, match=r"Layer 'pre' \(\w+\) holds .* that its "
                       r"constructor was not given \(fit to data by adapt\(\).* Fix: "
                       r".*public_layers=\['pre'\]"):
        model.fit(data, LABELS, batch_size=4, verbose=0)
    with pytest.raises(NotPrivateError, match="public_layers"):  # outside fit too
        model.train_on_batch(data[:4], LABELS[:4])
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))  # nothing trained
    assert epsilon_spent(model)[0] == 0
    make_private(model, public_layers=["pre"])
    history = model.fit(data, LABELS, batch_size=4, verbose=0).history
    assert history["epsilon"][0] > 0


@pytest.mark.parametrize("case", list(_cases()))
def test_a_layer_given_its_state_trains(case):
    data = _cases()[case][-1]
    model = _private(case, adapted=False)
    assert model.fit(data, LABELS, batch_size=4, verbose=0).history["epsilon"][0] > 0


def test_public_layers_are_checked_and_kept(tmp_path):
    model = _private("normalization", adapted=True, public_layers=["pre"])
    model.fit(NUMBERS, LABELS, batch_size=4, verbose=0)
    make_private(model, l2_norm_clip=0.5, noise_multiplier=1.3)  # kept when not given again
    model.fit(NUMBERS, LABELS, batch_size=4, verbose=0)
    path = str(tmp_path / ("model.keras" if KERAS_MAJOR == 3 else "model.h5"))
    model.save(path)
    loaded = make_private(keras.models.load_model(path))  # the saved settings, and these
    loaded.fit(NUMBERS, LABELS, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match=r"public_layers names \['nope'\], which are not "
                       "layers of model"):
        make_private(model, public_layers=["nope"])
    with pytest.raises(ValueError, match="public_layers='pre' is invalid: give a list"):
        make_private(model, public_layers="pre")


@pytest.mark.parametrize("case", ["normalization", "text_vectorization"])
def test_an_adapted_layer_is_refused_after_save_and_load(case, tmp_path):
    # tf-keras marks an adapted layer with is_adapted, which it does not save: the loaded
    # model trained with the training data's vocabulary inside it and an ε logged.
    inputs, make_adapted, _, rest, adapt_on, data = _cases()[case]
    layer = make_adapted()
    layer.adapt(adapt_on)
    model = keras.Model(inputs, rest(layer(inputs)))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    make_private(loaded, l2_norm_clip=1.0, noise_multiplier=1.1)
    loaded.compile(optimizer=keras.optimizers.SGD(0.1),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(NotPrivateError, match="Layer 'pre'.*public_layers"):
        loaded.fit(data, LABELS, batch_size=4, verbose=0)


def test_an_adapted_layer_called_inside_a_lambda_is_refused():
    vectorize = keras.layers.TextVectorization(output_sequence_length=2, name="pre")
    vectorize.adapt(WORDS)
    inputs = keras.Input((), dtype="string")
    tokens = keras.layers.Lambda(lambda s: vectorize(s), output_shape=(2,))(inputs)
    model = keras.Model(inputs, _embedded(tokens))
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(NotPrivateError, match="Layer 'pre'.*public_layers"):
        model.fit(WORDS, LABELS, batch_size=4, verbose=0)
    make_private(model, public_layers=["pre"])
    assert model.fit(WORDS, LABELS, batch_size=4, verbose=0).history["epsilon"][0] > 0
