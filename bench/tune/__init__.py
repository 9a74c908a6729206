"""``run_bench.py tune MATRIX.yaml``: Optuna search of the dynamic-bsz token limits on real runs.

A trial = the fixed factor levels of the matrix's ``tune`` block (dynamic bsz on) + the sampled
``ppo_max_token_len_per_gpu`` / ``log_prob_max_token_len_per_gpu``. The harness builds the trial's
:class:`~bench.spec.plan.RunSpec` exactly as a sweep does (a copy of the matrix whose ``base`` carries the
limits and whose design is the one fixed cell, through :func:`bench.spec.plan.make_plan`), runs it with
:func:`bench.execution.runner.execute_spec` into ``results/<matrix>/tune/<study>/trial-<n>/`` and takes the
objective from the run record: the run's value (:func:`bench.records.figures.run_value`, the median over its
timed steps of the step time, minimized, or of the throughput, maximized; the same statistic a sweep
reports per run), speed-normalized when the run timed the machine-speed probe
(:meth:`Tuner.speed_normalized`, :mod:`bench.records.speed`; the tune block's ``normalize: false`` turns it
off): trials run minutes apart on a shared machine whose speed drifts by several percent. The objective
is named with its unit in Optuna (``study.set_metric_names``), MLflow and the outputs
(:attr:`TuneSettings.metric_name`); the best trial is reported with its measured median beside the
normalized value (:func:`bench.tune.report.best_summary`). A trial is one run: trials run one at a time
in the sampler's order (there is no run order to block).

How a run's outcome becomes a trial:

- ``ok`` -> COMPLETE with the objective value and constraint ``infeasible = 0``;
- ``infeasible`` (a limit below the longest sequence: the engine's ``failure.json``) or ``oom`` ->
  PRUNED with ``trial.set_constraint("infeasible", c)``, ``c = 1 + shortfall / (P+R)`` for a too-small
  limit and ``c = 1`` for out of memory, and the reason / failure kind / log tail as user attributes.
  TPE puts constraint-violating trials in its "bad" group, so it learns to avoid the region; a PRUNED
  trial has no value, so ``study.best_trial`` (COMPLETE trials only), the importance and the plots
  never see a made-up number. (A NaN/FAIL trial would be ignored by TPE, which then keeps probing the
  infeasible region: see tests/tune/test_tune.py.)
- any other failure (crash, timeout, no metrics ...) -> FAIL with the reason and log tail kept; the tune
  goes on, except after ``bad_input`` (the engine refuses the matrix's settings whatever the limits):
  the study stops and the command exits 2 with the engine's reason.

After the trials, a confirmation (:mod:`bench.tune.confirm`; the tune block's ``confirm_blocks``, default 3,
0 = off): the best trial's limits against the rule of thumb (or the runner-up, when the best is the rule of
thumb) in interleaved blocks of one run each, run like trials but not told to the study; a paired t interval
of the per-block log ratios says whether the tune can tell them apart (``best.json``'s ``confirmation``, the
MLflow parent's ``confirm.*`` metrics, the tune's last line).

Resuming: the same study name (default: the matrix name) in the same storage continues; ``n_trials`` is
the number of finished trials the study should hold, so an interrupted tune runs only the rest. Trials
left RUNNING by a killed harness are marked FAIL (``interrupted``) and not counted. A study refuses to
resume when the settings its values depend on (engine, platform, base, fixed levels, space, objective)
changed.

MLflow (experiment = matrix name): a parent run per study (its id kept as the study user attribute
``mlflow_parent_run_id`` and reused on resume), a child per trial: the sweep's per-step metrics and
summary (:func:`bench.tracking.records.log_record`) plus the trial number, both limits, the objective value, the
Optuna state and the constraint. The parent gets the outputs (overrides, matrix fragment, importance,
plot, trials table) as artifacts.

Package layout: :mod:`bench.tune.settings` (what to tune), :mod:`bench.tune.trial` (one trial's spec),
:mod:`bench.tune.storage` (the Optuna storage), :mod:`bench.tune.tuner` (the study loop),
:mod:`bench.tune.confirm` (the confirmation's comparison), the outputs in
:mod:`bench.tune.report`, MLflow in :mod:`bench.tune.tracking`, the command in :mod:`bench.commands.tune`.
"""

from bench.tune.settings import TuneOutcome, TuneSettings, make_sampler, resolve_settings
from bench.tune.storage import default_storage, open_storage, redact
from bench.tune.trial import TrialFailed, constraint_of, fixed_cell, trial_matrix, trial_spec
from bench.tune.tuner import PROBE_REF, PROBE_SPEC, Tuner

__all__ = ["PROBE_REF", "PROBE_SPEC", "TrialFailed", "TuneOutcome", "TuneSettings", "Tuner", "constraint_of",
           "default_storage", "fixed_cell", "make_sampler", "open_storage", "redact", "resolve_settings",
           "trial_matrix", "trial_spec"]
