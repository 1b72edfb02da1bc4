"""Action calibration (Sec. 6): judges and the learned calibrator (WHEN to write an experience and
WHAT), one module each; what the agents may use, so nothing here plays an agent.

* :mod:`~agent_shell.calibration.judges`: the judges' one interface (:func:`judge_pair`) and the
  blind LM judge; :mod:`~agent_shell.calibration.expert_distance`: the environment-grounded
  expert-distance judge, the one module here that plays a game (imported where it is used, not
  by this package, so reading the calibrator imports no game).
* :mod:`~agent_shell.calibration.calibrator`: the calibrator, a concept over the options
  (candidates + NO UPDATE) fitted with :func:`cb_core.fit` (``cb-agent calibrate fit/eval``),
  used by the "calibrator" history rendering.

The labels the calibrator is fitted on come from a study that plays agents:
:mod:`agent_shell.studies.labels` (candidate experiences per recorded transition, paired next
actions of several recipient actors, verdicts, labels, content screening; ``cb-agent calibrate
label``).

The joint actor (calibration block + action in one reply) is an agent:
:mod:`agent_shell.agents.joint`.
"""

from agent_shell.calibration.calibrator import (KIND, LABEL_FIELDS, Calibrator, accuracy, baseline_predictions,
                                                decisive, fit_calibrator, predictions, record_features, split_tasks,
                                                tied_labels)
from agent_shell.calibration.judges import JUDGES, Judge, LMJudge, Pair, Verdict, judge_pair

__all__ = ["Calibrator", "JUDGES", "Judge", "KIND", "LABEL_FIELDS", "LMJudge", "Pair", "Verdict", "accuracy",
           "baseline_predictions", "decisive", "fit_calibrator", "judge_pair", "predictions", "record_features",
           "split_tasks", "tied_labels"]
