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
"""Tables, ROC plots and JSON for audits (lists of ``experiment.ModelAudit``).

>>> _fmt(float("inf")), _fmt(0.12345), _percent(0.5)
('inf', '0.123', '50.0%')
"""

import math
import os

import numpy as np

__all__ = ["attack_table", "model_table", "format_report", "plot_rocs", "to_dict"]


def _fmt(value, digits=3):
    return "inf" if math.isinf(value) else f"{value:.{digits}f}"


def _percent(value):
    return f"{100 * value:.1f}%"


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def attack_table(audits):
    """One row per (model, attack): AUC, advantage, TPR at low FPR, ε lower bound, ε."""
    confidence = audits[0].attacks[0].epsilon_lb.confidence if audits else 0.95
    fprs = list(audits[0].attacks[0].tpr_at) if audits else []
    header = (["model", "attack", "AUC", "adv"] + [f"TPR@{100 * f:g}%" for f in fprs]
              + [f"eps_lb({100 * confidence:g}%CP)", "eps_lb(split)", "eps_est(max, biased)",
                 "eps_accounted"])
    rows = []
    for audit in audits:
        for attack in audit.attacks:
            rows.append([audit.name, attack.name, _fmt(attack.auc), _fmt(attack.advantage)]
                        + [_fmt(attack.tpr_at[f]) for f in fprs]
                        + [_fmt(attack.epsilon_lb.epsilon),
                           _fmt(attack.epsilon_lb_split.epsilon),
                           _fmt(attack.epsilon_lb.point_estimate),
                           _fmt(audit.epsilon, 2)])
    return _table(header, rows)


def model_table(audits):
    """One row per model: accuracy, ε, best ε lower bound, canary exposure (mean/max)."""
    header = ["model", "", "train_acc", "heldout_acc", "eps_accounted", "max eps_lb",
              "exposure mean/max", "control mean/max", "canary ranks"]
    rows = []
    for audit in audits:
        best = max(a.epsilon_lb.epsilon for a in audit.attacks)
        rows.append([audit.name, "", _percent(audit.train_accuracy),
                     _percent(audit.heldout_accuracy), _fmt(audit.epsilon, 2), _fmt(best),
                     f"{_fmt(audit.exposure.mean, 2)}/{_fmt(audit.exposure.max, 2)}",
                     f"{_fmt(audit.control_exposure.mean, 2)}/"
                     f"{_fmt(audit.control_exposure.max, 2)}",
                     " ".join(str(r) for r in audit.exposure.ranks.tolist())])
    return _table(header, rows)


def format_report(audits):
    """Both tables with a short legend."""
    num_candidates = audits[0].exposure.num_candidates if audits else 10
    delta = audits[0].attacks[0].epsilon_lb.delta if audits else None
    delta_note = "" if delta is None else f" (delta={delta:g})"
    legend = "\n".join([
        f"eps_lb{delta_note}: max over thresholds t of log((TPR_lo - delta) / FPR_hi) and "
        f"log((1 - FPR_hi - delta) / (1 - TPR_lo)),",
        "  with Clopper-Pearson bounds TPR_lo, FPR_hi; split: t picked on one random half "
        "of the scores,",
        "  bound on the other (no selection bias). eps_est(max, biased): the same maximum of "
        "the raw rates,",
        "  no confidence and biased upwards by the choice of t: NOT a lower bound, it may "
        "exceed eps_accounted.",
        f"exposure = log2({num_candidates}) - log2(rank of the canary's wrong label by loss) "
        f"(max {math.log2(num_candidates):.2f});",
        "  controls are canaries made the same way but never trained on."])
    return "\n\n".join([attack_table(audits), model_table(audits), legend])


def plot_rocs(audits, output_dir):
    """Saves ``roc_linear.png`` and ``roc_loglog.png`` (every attack on every model)."""
    # An Agg figure of its own: the global pyplot backend stays as the caller set it.
    from tf_tempered._plotting import agg_figure  # pylint: disable=g-import-not-at-top

    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for scale in ("linear", "loglog"):
        fig, (ax,) = agg_figure(figsize=(5.5, 5))
        floor = 1.0
        for audit in audits:
            style = "-" if audit.name == "non-private" else "--"
            for index, attack in enumerate(audit.attacks):
                roc = attack.roc
                ax.plot(roc.fpr, roc.tpr, style, color=f"C{index}",
                        label=f"{audit.name} {attack.name} (AUC {attack.auc:.3f})")
                floor = min(floor, 0.5 / max(roc.num_nonmembers, roc.num_members))
        grid = np.linspace(floor, 1, 200) if scale == "linear" else np.geomspace(floor, 1, 200)
        ax.plot(grid, grid, ":", color="gray", label="chance")
        if scale == "loglog":
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(floor, 1)
            ax.set_ylim(floor, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"Membership inference ROC ({scale})")
        ax.legend(fontsize=7, loc="lower right")
        path = os.path.join(output_dir, f"roc_{scale}.png")
        fig.savefig(path, dpi=120)
        paths.append(path)
    return paths


def to_dict(audits):
    """JSON-ready summary (no ROC arrays; an infinite accounted ε is None)."""
    out = []
    for audit in audits:
        out.append({
            "model": audit.name,
            "epsilon_accounted": None if math.isinf(audit.epsilon) else audit.epsilon,
            "train_accuracy": audit.train_accuracy, "heldout_accuracy": audit.heldout_accuracy,
            "canary_ranks": audit.exposure.ranks.tolist(),
            "canary_exposures": audit.exposure.exposures.tolist(),
            "control_ranks": audit.control_exposure.ranks.tolist(),
            "attacks": [{
                "name": a.name, "auc": a.auc, "advantage": a.advantage,
                "tpr_at_fpr": {str(f): t for f, t in a.tpr_at.items()},
                "epsilon_lb": a.epsilon_lb.epsilon,
                "epsilon_lb_split": a.epsilon_lb_split.epsilon,
                "epsilon_estimate_max_biased": a.epsilon_lb.point_estimate,
                "epsilon_lb_threshold": a.epsilon_lb.threshold,
                "epsilon_lb_form": a.epsilon_lb.form,
                "confidence": a.epsilon_lb.confidence, "delta": a.epsilon_lb.delta,
            } for a in audit.attacks]})
    return out
