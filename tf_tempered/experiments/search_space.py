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
"""The search space: ``--vary`` axes parsed as the train flags' types, and the trials.

``FLAG=V1,V2`` is an axis (``none`` unsets); ``F1+F2=a1+a2,b1+b2`` one joint axis (flags
that change together); ``activation`` also takes ``ts:S/T/O`` and ``ts_learnable:S/T/O``.
The trials: every combination (grid), a seeded sample of them (random: the seed is public,
which configs are tried is not private), or the base and each value alone on it
(one_at_a_time). :mod:`tf_tempered.experiments.search` trains them.

>>> base = common.TrainConfig(dataset="digits", learning_rate=0.5, target_epsilon=3.0)
>>> [labels for labels, _ in expand_trials(base, [parse_axis("learning_rate=0.5,2")],
...                                        search="one_at_a_time")]
[{}, {'learning_rate': 2.0}]
"""

import dataclasses
import itertools

import numpy as np

from tf_tempered.experiments import common

__all__ = ["parse_axis", "expand_trials"]

_FIELDS = {f.name: f for f in dataclasses.fields(common.TrainConfig)}
_NOT_SEARCHABLE = ("dataset", "data_dir", "output_dir", "target_epsilon", "noise_multiplier",
                   "validation_size", "validation_fold", "delta", "dpsgd", "insecure_dp_seed")
_TEMPERED = ("scale", "inverse_temperature", "offset", "learnable")


def _parse_value(name, text):
    """One --vary value of flag ``name``, parsed as the TrainConfig field's type."""
    if text.lower() == "none":
        return None
    if name == "activation":
        for prefix, learnable in (("ts:", False), ("ts_learnable:", True)):
            if text.startswith(prefix):
                parts = text[len(prefix):].split("/")
                try:
                    s, t, o = (float(p) for p in parts)
                except ValueError:
                    raise common.ConfigError(
                        f"--vary=activation value {text!r} is invalid: use {prefix}S/T/O, "
                        f"e.g. {prefix}2/2/1.") from None
                return {"activation": "tempered_sigmoid", "scale": s, "inverse_temperature": t,
                        "offset": o, "learnable": learnable}
        defaults = common.TrainConfig()
        return {"activation": text, **{n: getattr(defaults, n) for n in _TEMPERED}}
    kind = type(getattr(common.TrainConfig(), name))
    if kind is type(None):  # a flag unset by default (--recipe, ...): its values are names
        kind = str
    kind = {"learning_rate": float, "l2_norm_clip": float, "ema_decay": float,
            "num_train": int, "num_test": int, "microbatches": int}.get(name, kind)
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        return kind(float(text)) if kind is int and float(text).is_integer() else kind(text)
    except ValueError:
        raise common.ConfigError(f"--vary={name}: value {text!r} is not a valid "
                                 f"{kind.__name__}.") from None


def parse_axis(spec):
    """``"FLAG=V1,V2"`` -> (FLAG, [value or {flag: value} per V]); ConfigError if invalid.

    Flags that only make sense together form one joint axis, ``"F1+F2=a1+a2,b1+b2"``:
    each value sets every named flag.

    >>> parse_axis("learning_rate=0.5,2")
    ('learning_rate', [0.5, 2.0])
    >>> parse_axis("batch_size+epochs=2048+40,4096+80")
    ('batch_size+epochs', [{'batch_size': 2048, 'epochs': 40}, {'batch_size': 4096, 'epochs': 80}])
    """
    name, sep, values = str(spec).partition("=")
    name = name.strip().lstrip("-")
    if not sep or not values:
        raise common.ConfigError(f"--vary={spec!r} is invalid: use --vary=FLAG=V1,V2,... "
                                 "e.g. --vary=learning_rate=0.5,2.")
    names = [n.strip() for n in name.split("+")]
    for one in names:
        if one not in _FIELDS or one in _NOT_SEARCHABLE or (len(names) > 1 and
                                                             one == "activation"):
            searchable = sorted(set(_FIELDS) - set(_NOT_SEARCHABLE))
            raise common.ConfigError(f"--vary={spec!r}: {one!r} cannot be searched over"
                                     f"{' in a joint axis' if one == 'activation' else ''}. "
                                     f"Searchable flags: {', '.join(searchable)}.")
    texts = [v.strip() for v in values.split(",") if v.strip()]
    if len(names) == 1:
        return name, [_parse_value(name, v) for v in texts]
    parsed = []
    for text in texts:
        parts = text.split("+")
        if len(parts) != len(names):
            raise common.ConfigError(
                f"--vary={spec!r}: value {text!r} has {len(parts)} part(s) for {len(names)} "
                f"flags. Fix: one '+'-separated part per flag, e.g. "
                f"{'+'.join(names)}={'+'.join(['V'] * len(names))}.")
        parsed.append({n: _parse_value(n, part.strip()) for n, part in zip(names, parts)})
    return "+".join(names), parsed


def expand_trials(base_config, axes, *, search="grid", num_trials=None, seed=0):
    """The configs to train: every combination of ``axes`` (grid), a seeded sample of them
    (random), or the base config and each axis value alone on it (one_at_a_time: an
    ablation design, 1 + Σ (values that differ from the base) configs)."""
    names = [n for n, _ in axes]
    if search == "one_at_a_time":  # each value alone: a flag may be in two axes
        return _one_at_a_time(base_config, axes)
    flags = [f for n in names for f in n.split("+")]
    if len(set(flags)) != len(flags):  # combined, two axes would set one flag twice
        raise common.ConfigError(f"--vary names a flag twice ({names}); give each flag once "
                                 "with all its values, or use --search=one_at_a_time.")
    combos = list(itertools.product(*(values for _, values in axes))) or [()]
    if search == "random":
        if num_trials is None or num_trials < 1:
            raise common.ConfigError("--search=random needs --num_trials >= 1.")
        rng = np.random.default_rng(seed)  # public: which configs are tried is not private
        picks = rng.permutation(len(combos))[:num_trials]
        combos = [combos[i] for i in sorted(picks)]
    elif search != "grid":
        raise common.ConfigError(f"--search={search!r} is invalid: use grid, random or "
                                 "one_at_a_time.")
    return [_trial(base_config, zip(names, combo)) for combo in combos]


def _trial(base_config, named_values):
    changes, labels = {}, {}
    for name, value in named_values:
        changes.update(value if isinstance(value, dict) else {name: value})
        labels[name] = _label(value)
    return labels, common.validate_config(base_config.replace(**changes))


def _one_at_a_time(base_config, axes):
    """The base, then each value of each axis that changes the base, the rest at base.

    A flag may appear alone and in a joint axis (``learning_rate=2`` and
    ``batch_size+learning_rate=4096+8``); a config already listed is trained once.
    """
    trials = [({}, common.validate_config(base_config))]
    for name, values in axes:
        for value in values:
            labels, config = _trial(base_config, [(name, value)])
            if any(config == seen for _, seen in trials):
                continue  # the base itself, or a value another axis already set
            trials.append((labels, config))
    return trials


def _label(value):
    """How a value reads in the tables (``ts:S/T/O`` for a tempered sigmoid)."""
    if not isinstance(value, dict):
        return value
    if "activation" not in value:  # a joint axis
        return "+".join(str(v) for v in value.values())
    if value["activation"] != "tempered_sigmoid":
        return value["activation"]
    kind = "ts_learnable" if value["learnable"] else "ts"
    return f"{kind}:{value['scale']:g}/{value['inverse_temperature']:g}/{value['offset']:g}"
