"""The trial loop and what drives it: local.py (the one local loop), ray.py (one trial per Ray node),
sweep.py (a `-m` grid, planned whole, then run), studies.py (a scaling study's grid and table)."""
