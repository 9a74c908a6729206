"""What a sweep leaves on disk and the typed results read from it: measuring a finished run folder into its run
record (``record``), the run record's versioned model and its single loader (``run_record``), the results folder
with its resume and lock (``results``), the typed result model and a run's and a cell's values
(``figures``), the speed normalization by the machine-speed probe (``speed``) and a sweep's summary tables
(``summary``)."""
