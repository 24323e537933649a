"""`corescale explain`: where the time goes (profiles by op class) and why (roofline, findings).

run.py starts the pinned profiling process, worker.py runs in it, profilers.py opens the profiler each backend's
registry entry names (backends/<framework>/profiler.py),
opclasses.py classifies ops, analysis.py turns a profile into a breakdown and findings.py into advice."""
