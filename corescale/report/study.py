"""A study's files: study.csv (the table), study.png (its figure), study.json (the document with the table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from corescale.record.files import write_atomic, write_json_atomic
from corescale.report import plots

FILES = {"csv": "study.csv", "figure": "study.png", "json": "study.json"}
FIGURES = {"cores": plots.cores_figure, "instances": plots.instances_figure, "batch": plots.batch_figure}


def write_study(study) -> dict[str, Path]:
    """Each file written whole, then renamed into the study directory; returns their paths by kind."""
    paths = {name: study.study_dir / file for name, file in FILES.items()}
    write_atomic(paths["csv"], study.frame.to_csv(index=False), "study table")
    plots.save_figure(FIGURES[study.kind](study.frame), paths["figure"])
    table = study.frame.replace({np.nan: None}).to_dict(orient="records")
    write_json_atomic(paths["json"], {**study.document, "table": table, "files": FILES})
    return paths
