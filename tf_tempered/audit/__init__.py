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
"""Empirical privacy audit: membership inference, canary exposure and ε lower bounds.

These pieces are NumPy/SciPy only and work on any model's logits or scores:

* :mod:`.metrics`: ROC, AUC, attacker advantage, TPR at low FPR, Clopper–Pearson
  intervals, the empirical ε lower bound of an (ε, δ)-DP run, exposure;
* :mod:`.attacks`: loss and confidence threshold attacks, LiRA (online/offline);
* :mod:`.canaries`: mislabeled canaries and their exposure;
* :mod:`.one_run`: one-run ε lower bounds from canary scores; :mod:`.canary_scores`:
  white-box scores from a parameter trajectory.

With TensorFlow: :func:`white_box_one_run` (gradient canaries inside the DP step,
:mod:`.gradient_canaries`) and :func:`black_box_one_run` (input canaries) audit DP-SGD
on a model of the caller's in one training run each; ``python -m tf_tempered.audit
one-run`` runs both on digits, MNIST or Fashion-MNIST (:mod:`.one_run_cli`).
:mod:`.experiment` trains and audits non-private and DP-SGD models with
membership-inference attacks, and ``python -m tf_tempered.audit`` runs it on an
MNIST subset (see :mod:`.cli`).

>>> from tf_tempered import audit
>>> result = audit.threshold_attack([0.9, 0.8, 0.4], [0.7, 0.3, 0.2])
>>> round(result.auc, 3)
0.889
"""

from tf_tempered.audit.attacks import (AttackResult, confidence_attack, lira_attack,
                                       lira_scores, logit_scaled_confidence, loss_attack,
                                       per_example_loss, shadow_scores, threshold_attack)
from tf_tempered.audit.black_box import black_box_one_run
from tf_tempered.audit.canary_scores import (likelihood_ratio_scores, step_signals,
                                            trajectory_scores)
from tf_tempered.audit.canaries import (Canaries, ExposureReport, canary_exposure,
                                        canary_ranks, mislabeled_canaries)
from tf_tempered.audit.metrics import (EpsilonLowerBound, RocCurve, attacker_advantage,
                                       clopper_pearson, epsilon_lower_bound, exposure,
                                       roc_auc, roc_curve, tpr_at_fpr)
from tf_tempered.audit.one_run import (OneRunAudit, epsilon_one_run, epsilon_one_run_fdp,
                                       one_run_audit)
from tf_tempered.audit.one_run_counts import (OneRunBound, epsilon_one_run_fdp_from_counts,
                                              epsilon_one_run_from_counts, one_run_p_value)
from tf_tempered.audit.gradient_canaries import CanaryTrajectory, GradientCanaries
from tf_tempered.audit.one_run_training import OneRunResult
from tf_tempered.audit.white_box import white_box_one_run

__all__ = [
    "AttackResult", "confidence_attack", "lira_attack", "lira_scores",
    "logit_scaled_confidence", "loss_attack", "per_example_loss", "shadow_scores",
    "threshold_attack",
    "Canaries", "ExposureReport", "canary_exposure", "canary_ranks", "mislabeled_canaries",
    "EpsilonLowerBound", "RocCurve", "attacker_advantage", "clopper_pearson",
    "epsilon_lower_bound", "exposure", "roc_auc", "roc_curve", "tpr_at_fpr",
    "OneRunAudit", "OneRunBound", "epsilon_one_run", "epsilon_one_run_fdp",
    "epsilon_one_run_fdp_from_counts", "epsilon_one_run_from_counts", "one_run_audit",
    "one_run_p_value",
    "white_box_one_run", "black_box_one_run", "OneRunResult", "GradientCanaries",
    "CanaryTrajectory", "likelihood_ratio_scores", "step_signals", "trajectory_scores",
]
