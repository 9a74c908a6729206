"""Planning and stopping a sweep: how many timed steps and repeats a precision or budget needs, and when to stop.

* :mod:`.model` - the noise and cost model estimated from earlier sweeps of the same target;
* :mod:`.allocation` - steps x repeats for a ``--precision`` or ``--budget`` (:func:`.allocation.plan_allocation`);
* :mod:`.apply` - the plan applied to a matrix before its first run (``run --precision/--budget``);
* :mod:`.sequential` - the group-sequential stop rule (O'Brien-Fleming error spending, Jennison & Turnbull) and
  :mod:`.boundaries` its boundaries calibrated for the residual degrees of freedom;
* :mod:`.claims` - ``expect`` claims judged at each look;
* :mod:`.view` - the one interval a stopped sweep shows everywhere (report, summary, console, MLflow).
"""
