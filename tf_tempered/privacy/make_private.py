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
"""``make_private(model)``: a Keras model that trains with fast, exact DP-SGD.

Example (any Keras loss and optimizer; ``fit`` on arrays draws Poisson batches and
logs ε):

>>> import numpy as np
>>> from tf_tempered._compat import keras
>>> from tf_tempered.privacy import make_private
>>> model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
...                      l2_norm_clip=1.0, noise_multiplier=1.1)
>>> model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
>>> history = model.fit(np.zeros((64, 4)), np.zeros(64), batch_size=16, epochs=2, verbose=0)
>>> sorted(k for k in history.history if k.startswith(("dp_", "eps", "delta")))
['delta', 'dp_clipped_fraction', 'dp_grad_norm', 'dp_nonfinite', 'epsilon']
"""

from tf_tempered.privacy import (keras_adapter, ledger_lineage, microbatching, randomness,
                                 recording, saving, shared_ledgers, update_guard)
from tf_tempered.privacy.outside_steps import (record_outside_steps,
                                               record_steps_when_collected)
from tf_tempered.privacy.ledger import PrivacyLedger
from tf_tempered.privacy.make_private_checks import (checked_model, training_overrides_allowed,
                                                     warn_if_trained_without_dp)
from tf_tempered.privacy.options import EngineOptions
from tf_tempered.privacy.public_layers import check_public_layers
from tf_tempered.privacy.settings import model_dp_config, settings_config
from tf_tempered.privacy.state import (SAMPLINGS, PrivateState, RetiredKey, attach_state,
                                       get_state)
from tf_tempered.privacy.step.random_ops import refuse_random_layers
from tf_tempered.privacy.step.metrics import DPMetrics

__all__ = ["make_private", "is_private", "has_secret_dp_randomness",
           "training_overrides_allowed"]



def is_private(model):
    """True if the next ``fit`` of ``model`` runs DP-SGD: make_private prepared it and it
    has DP settings (given to make_private, or carried by its compiled DP optimizer)."""
    if get_state(model) is None:
        return False
    try:
        return model_dp_config(model) is not None
    except ValueError:  # settings given twice and differing: fit refuses
        return False


def has_secret_dp_randomness(model):
    """True if the DP noise of ``model`` (prepared by make_private) is keyed by a secret.

    False for ``make_private(model, insecure_dp_seed=K)``, whose ε does not hold.
    Raises ValueError for a model that make_private has not prepared.
    """
    state = get_state(model)
    if state is None:
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} was not prepared by make_private, so "
            "tf_tempered does not draw its DP noise (TF Privacy's own DP path draws it "
            "from TensorFlow's global seed). Call tf_tempered.make_private(model) first.")
    return state.noise.is_secret


def _saved_settings(saved):
    values = (saved or {}).get("settings")
    if not values:
        return None
    return settings_config(**values)


def _choice(name, value, choices, default):
    if value is None:
        return default
    if value not in choices:
        raise ValueError(f"make_private: {name} must be one of {', '.join(choices)}, got "
                         f"{value!r}. Fix: e.g. {name}={choices[0]!r}.")
    return value


def _options(options, previous, saved):
    if options is None:
        if previous is not None:
            return previous.options
        return EngineOptions(**saved["options"]) if saved and saved.get("options") \
            else EngineOptions()
    if not isinstance(options, EngineOptions):
        raise TypeError(f"make_private: options must be a tf_tempered.privacy.EngineOptions, "
                        f"got {type(options).__name__}.")
    return options


def _ledger(model, previous, saved, delta, accountant):
    if previous is not None:
        ledger = previous.ledger
    elif saved and saved.get("ledger"):
        ledger = PrivacyLedger.from_config(saved["ledger"])
        for other in saving.saved_dps(model)[1:]:  # parts of other loaded private models
            if other.get("ledger"):
                ledger_lineage.absorb(ledger, other["ledger"])
    else:
        ledger = PrivacyLedger()
    ledger = shared_ledgers.shared_ledger(model, ledger)  # weights shared with another model
    shared_ledgers.set_accounting(model, ledger, delta, accountant, "make_private")
    return ledger


def _retire_old_key(previous, model):
    """Records the DP steps of the key being replaced that no fit recorded, and keeps the
    key: a step traced with it (a DPGradients loop's tf.function) may go on drawing."""
    if previous is None:
        return []
    config = previous.settings or _compiled_settings(model)
    if config is None:  # no settings: no DP step could have been traced with this key
        return list(previous.retired_keys)
    record_outside_steps(previous, config)
    return [*previous.retired_keys, RetiredKey(previous.noise, config, previous.steps_taken())]


def _compiled_settings(model):
    try:
        return model_dp_config(model)
    except ValueError:  # two different settings: no step could have been traced with them
        return None


def _public_layers(public_layers, model, previous, saved):
    """The layers declared public: given, else kept from before or from the saved model."""
    if public_layers is None:
        kept = previous.public_layers if previous is not None else (saved or {}).get(
            "public_layers", ())
        return check_public_layers(list(kept), model)
    return check_public_layers(public_layers, model)


def make_private(model, *, l2_norm_clip=None, noise_multiplier=None, num_microbatches=None,
                 sampling=None, delta=None, accountant=None, augmentation_multiplicity=None,
                 options=None, insecure_dp_seed=None, public_layers=None):
    """Prepares a Keras model for fast, exact DP-SGD and returns it (the same object).

    Works for Sequential, Functional and subclassed models of the active Keras (Keras 3
    by default, Keras 2 with ``TF_USE_LEGACY_KERAS=1``) whose trainable layers treat
    examples independently. Then ``compile`` as usual — any Keras loss (a name such as
    ``"sparse_categorical_crossentropy"``, a loss object with any reduction, a function
    returning one loss per example, a dict or list for several outputs) and any Keras
    optimizer — and ``fit``:

    * each microbatch's gradient (one example by default) is clipped to L2 norm
      ``l2_norm_clip``, N(0, (σ·C)²) noise with σ = ``noise_multiplier`` is added to
      their sum once, and the sum is divided by the number of microbatches (or the
      expected batch size of Poisson batches);
    * ``fit`` on in-memory data draws Poisson batches of expected size ``batch_size``
      (``sampling="poisson"``, the default; ``"shuffle"``: Keras' shuffled batches, whose
      ε has no amplification by subsampling); a tf.data pipeline is accounted as its
      sampling says (:mod:`tf_tempered.privacy.fit_data`);
    * every epoch's logs hold ``epsilon`` (at δ = ``delta``, default 1e-5; ``accountant``
      "rdp" or "pld") for all the DP steps the model has taken, and the DP metrics
      ``dp_clipped_fraction``, ``dp_grad_norm``, ``dp_nonfinite``.

    Without ``l2_norm_clip``/``noise_multiplier``, compile with a DP optimizer that carries
    them (``tf_tempered.privacy.DPKerasSGDOptimizer``, Adam, Adagrad, or TF Privacy's on
    Keras 2); with neither, ``fit`` raises NotPrivateError instead of training without
    privacy. Calling make_private again keeps every setting not given (and the privacy
    ledger; ``noise_multiplier`` alone keeps C, ``l2_norm_clip`` alone keeps σ), and re-keys
    the noise. A model loaded from a file saved by a private model
    refuses to train until make_private is called on it; without arguments it takes the
    settings saved with it.

    ``num_microbatches=M``: M microbatches per batch (TF Privacy's microbatching; needs
    fixed-size batches, so ``sampling="shuffle"``). ``augmentation_multiplicity=K`` (De et
    al. 2022): batches of K augmented copies of each example
    (:func:`tf_tempered.augment.augmult_batches`), each example's copies clipped as one.
    ``options`` (:class:`~tf_tempered.privacy.options.EngineOptions`) trade speed and
    memory, never values. The noise is keyed by a secret from the OS's entropy, never by a
    seed; ``insecure_dp_seed=K`` derives it from K instead: reproducible, NOT private.
    A layer whose state adapt() fit to data (Normalization, TextVectorization, lookups,
    Discretization) is refused unless named in ``public_layers`` (adapted on public data):
    that state is released with the model, outside ε (:mod:`~.public_layers`).

    Layers that mix examples (a trainable BatchNormalization in training mode) are refused
    by the first step (UnsupportedLayerError, a ValueError). Raises ValueError for invalid settings (naming the argument).
    """
    previous = checked_model(model)
    saved = saving.saved_dp(model) if previous is None else None
    optimizer = getattr(model, "optimizer", None)
    if previous is None and (saved is None or optimizer is None
                             or not saving.is_marked(optimizer)):
        # A loaded private model's own (marked) optimizer applied DP steps only; any other
        # one trained without DP (a plain head on a loaded private encoder; probe Z).
        warn_if_trained_without_dp(model)
    settings = _settings(previous, saved, l2_norm_clip, noise_multiplier, num_microbatches)
    default_sampling = (previous.sampling if previous is not None
                        else (saved or {}).get("sampling", "poisson"))
    sampling = _choice("sampling", sampling, SAMPLINGS, default_sampling)
    if augmentation_multiplicity is None:
        augmentation_multiplicity = (previous.augmentation_multiplicity if previous is not None
                                     else (saved or {}).get("augmentation_multiplicity", 1))
    multiplicity = microbatching.validate_multiplicity(augmentation_multiplicity)
    options = _options(options, previous, saved)
    if options.clipped_sum == "recompute":
        refuse_random_layers(model)
    ledger = _ledger(model, previous, saved, delta, accountant)
    recording.instrument(model)
    retired_keys = _retire_old_key(previous, model)
    with model.distribute_strategy.scope():  # replicated variables under a strategy
        noise = randomness.DPRandomness("noise", insecure_dp_seed=insecure_dp_seed)
        metrics = previous.metrics if previous is not None else DPMetrics()
    state = PrivateState(settings, options, noise, sampling, multiplicity, ledger, metrics,
                         public_layers=_public_layers(public_layers, model, previous, saved),
                         retired_keys=retired_keys)
    _attach(model, state)
    return model


def _settings(previous, saved, l2_norm_clip, noise_multiplier, num_microbatches):
    """The DPConfig given, completed by the one kept (an earlier call's, or saved)."""
    kept = previous.settings if previous is not None else _saved_settings(saved)
    if kept is not None and (l2_norm_clip is None) != (noise_multiplier is None):
        # One of C and σ given again: the other, and the microbatches, are kept.
        l2_norm_clip = kept.l2_norm_clip if l2_norm_clip is None else l2_norm_clip
        noise_multiplier = kept.noise_multiplier if noise_multiplier is None else noise_multiplier
        if num_microbatches is None:
            num_microbatches = kept.num_microbatches
    settings = settings_config(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                               num_microbatches=num_microbatches)
    return kept if settings is None else settings


def _attach(model, state):
    """Gives ``model`` its new state: its weights tagged (private, under its ledger), the
    DP engine's methods installed, its optimizer marked."""
    attach_state(model, state)
    saving.release_loaded_variables(model)
    update_guard.tag_private_weights(model)
    shared_ledgers.register(model)
    shared_ledgers.tag_weights(model, state.ledger)
    record_steps_when_collected(model, state)
    keras_adapter.install(model)
    keras_adapter.bind_the_step_optimizer(model, state)
    model.train_function = None  # drop a step compiled before this call (old key)


