"""`corescale tune`: a constrained Optuna search over backends, precisions, layouts and runtime libraries.

settings.py parses the tune's own words (objective, constraints, budget, space.*) apart from the Hydra
overrides; space.py derives the search space from what is installed and what the CPU offers; plan.py checks
everything before a worker starts; search.py runs the search (every measurement an ordinary trial of the one
local loop) with successive halving on the window length and a final re-measure in fresh processes, keeping
its Optuna study (study.py) and ETA (progress.py); fanout.py tunes several node types; verdict.py ranks the
finalists with their intervals; outputs.py writes tune.json; recipe.py writes what deploys the winner. See
docs/tune.md.
"""
