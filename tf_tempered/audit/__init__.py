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

The pieces here are NumPy/SciPy only and work on any model's logits:

* :mod:`.metrics`: ROC, AUC, attacker advantage, TPR at low FPR, Clopper–Pearson
  intervals, the empirical ε lower bound of an (ε, δ)-DP run, exposure;
* :mod:`.attacks`: loss and confidence threshold attacks, LiRA (online/offline);
* :mod:`.canaries`: mislabeled canaries and their exposure.

:mod:`.experiment` (TensorFlow) trains and audits non-private and DP-SGD models,
and ``python -m tf_tempered.audit`` runs it on an MNIST subset (see :mod:`.cli`).

>>> from tf_tempered import audit
>>> result = audit.threshold_attack([0.9, 0.8, 0.4], [0.7, 0.3, 0.2])
>>> round(result.auc, 3)
0.889
"""

from tf_tempered.audit.attacks import (AttackResult, confidence_attack, lira_attack,
                                       lira_scores, logit_scaled_confidence, loss_attack,
                                       per_example_loss, shadow_scores, threshold_attack)
from tf_tempered.audit.canaries import (Canaries, ExposureReport, canary_exposure,
                                        canary_ranks, mislabeled_canaries)
from tf_tempered.audit.metrics import (EpsilonLowerBound, RocCurve, attacker_advantage,
                                       clopper_pearson, epsilon_lower_bound, exposure,
                                       roc_auc, roc_curve, tpr_at_fpr)
from tf_tempered.audit.one_run import (OneRunAudit, OneRunBound, epsilon_one_run,
                                       epsilon_one_run_fdp, epsilon_one_run_fdp_from_counts,
                                       epsilon_one_run_from_counts, one_run_audit,
                                       one_run_p_value)

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
]
