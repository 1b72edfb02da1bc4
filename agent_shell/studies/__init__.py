"""The two studies of history renderings, one module each, over shared recorded trials.

* :mod:`~agent_shell.studies.recorded`: trials read from results files of ``cb-agent run``, and
  study lines on disk (one JSON line per (item, condition, rendering, actor), resumable).
* :mod:`~agent_shell.studies.probe`: the repetition probe (does an actor repeat an action that
  just did nothing?), asked through each agent's ``next_action`` on a fixed history.
* :mod:`~agent_shell.studies.recovery`: reference-history recovery (replay a failed game to a
  third of its length, let the agent continue with or without the recorded segment).
* :mod:`~agent_shell.studies.tables`: rates with 95% Wilson intervals.
"""

from agent_shell.history import RENDERINGS
from agent_shell.studies.probe import (NOTHING_HAPPENS, PROBE_SCHEMA, STUDY_ACTORS, ProbeItem, ReviewCache,
                                       mine_probe_items, probe_answer, probe_record, probe_rows, run_probe,
                                       unsupported_repeats)
from agent_shell.studies.recorded import (RecordedTrial, env_name_of, finished_keys, pending_keys, read_study,
                                          recorded_trials)
from agent_shell.studies.recovery import (CONDITIONS, MIN_ENV_STEPS, RECOVER_SCHEMA, RecoveryItem, recovery_record,
                                          recovery_rows, replay, review_replayed, run_recovery,
                                          select_recovery_items)
from agent_shell.studies.tables import RateRow, rate_rows, rate_table

__all__ = ["CONDITIONS", "MIN_ENV_STEPS", "NOTHING_HAPPENS", "PROBE_SCHEMA", "ProbeItem", "RECOVER_SCHEMA", "RENDERINGS",
           "RateRow", "RecordedTrial", "RecoveryItem", "ReviewCache", "STUDY_ACTORS", "env_name_of", "finished_keys",
           "mine_probe_items", "pending_keys", "probe_answer", "probe_record", "probe_rows", "rate_rows", "rate_table",
           "read_study", "recorded_trials", "recovery_record", "recovery_rows", "replay", "review_replayed",
           "run_probe", "run_recovery", "select_recovery_items", "unsupported_repeats"]
