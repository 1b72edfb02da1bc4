"""Action calibration (Sec. 6): judges, labels from the effect of experiences on actors' next
actions, and the learned calibrator (WHEN to write an experience and WHAT), one module each.

* :mod:`~agent_shell.calibration.judges`: the blind LM judge and the environment-grounded
  expert-distance judge behind one interface (:func:`judge_pair`).
* :mod:`~agent_shell.calibration.labels`: candidate experiences per recorded transition, paired
  next actions of several recipient actors, verdicts, labels, content screening (``cb-agent
  calibrate label``).
* :mod:`~agent_shell.calibration.calibrator`: the calibrator, a concept over the options
  (candidates + NO UPDATE) fitted with :func:`cb_core.fit` (``cb-agent calibrate fit/eval``),
  used by the "calibrator" history rendering.

The joint actor (calibration block + action in one reply) is an agent:
:mod:`agent_shell.agents.joint`.
"""

from agent_shell.calibration.calibrator import (KIND, LABEL_FIELDS, Calibrator, accuracy, baseline_predictions,
                                                decisive, fit_calibrator, predictions, record_features, split_tasks,
                                                tied_labels)
from agent_shell.calibration.judges import (JUDGES, ExpertDistanceJudge, Judge, LMJudge, Pair, Verdict, judge_pair)
from agent_shell.calibration.labels import (LABEL_SCHEMA, ContentScreen, Transition, label_counts, label_record,
                                            mine_transitions, propose, read_labels, retained, run_labels,
                                            transition_label)

__all__ = ["Calibrator", "ContentScreen", "ExpertDistanceJudge", "JUDGES", "Judge", "KIND", "LABEL_FIELDS",
           "LABEL_SCHEMA", "LMJudge", "Pair", "Transition", "Verdict", "accuracy", "baseline_predictions", "decisive",
           "fit_calibrator", "judge_pair", "label_counts", "label_record", "mine_transitions", "predictions",
           "propose", "read_labels", "record_features", "retained", "run_labels", "split_tasks", "tied_labels", "transition_label"]
