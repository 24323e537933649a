"""`corescale explain`: where the time goes (profiles by op class) and why (roofline, findings).

run.py starts the pinned profiling process, worker.py runs in it, profilers.py holds each framework's profiler,
opclasses.py classifies ops, analysis.py turns a profile into a breakdown and findings.py into advice."""
