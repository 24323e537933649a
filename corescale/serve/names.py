"""The names a service answers to, as OpenAI-compatible clients use them: `--served-model-name NAME [NAME ...]`
(vLLM's convention: the first is the canonical one, the one answers carry), else the model as the bundle names it
and the names its model folder records (a Sentence-Transformers model card's `model_name` / `model-index` name, a
packaged model's own name). `GET /v1/models` lists them; a request's `model` must be one of them (or a hub id or path
ending in one)."""

from __future__ import annotations

import re
from pathlib import Path

from corescale.errors import UserError

MOST_NAMES = 16
NAME = re.compile(r"[\w.\-/:@+]{1,200}")  # what a client sends as a model id: no spaces, quotes or control characters
CARD = "README.md"  # a model card; its YAML front matter may name the model
CARD_BYTES = 65_536  # what is read of it at most


def checked(names: list[str]) -> list[str]:
    """--served-model-name's names, each a model id a client can send, without repeats; one line when not."""
    if len(names) > MOST_NAMES:
        raise UserError(f"--served-model-name: at most {MOST_NAMES} names, got {len(names)}")
    for name in names:
        if not NAME.fullmatch(name):
            raise UserError(f"--served-model-name: {name[:60]!r} is not a model id (1-200 letters, digits and "
                            "._-/:@+, no spaces)")
    return list(dict.fromkeys(names))


def display(model: str) -> str:
    """The model as a name: a folder's name for a path, else the config's word (a preset, a hub id)."""
    if model.startswith(("/", ".", "~")):
        return Path(model.rstrip("/")).name or model
    return model


def recorded(folder: Path | None) -> list[str]:
    """The names a model folder records of itself: its card's front matter (`model_name:`, `model-index: - name:`)."""
    if folder is None or not (folder / CARD).is_file():
        return []
    try:
        with open(folder / CARD, encoding="utf-8", errors="replace") as card:
            text = card.read(CARD_BYTES)
    except OSError:
        return []
    if not text.startswith("---"):
        return []
    front = text[3:].split("\n---", 1)[0]
    found = re.findall(r"^(?:model_name|  ?- name|- name):\s*['\"]?([^'\"\n]+?)['\"]?\s*$", front, re.M)
    return [name for name in found if NAME.fullmatch(name)]


def packaged_name(model: str) -> list[str]:
    """A packaged preset's own name (all-minilm-l6-v2: all-MiniLM-L6-v2), where the model is one."""
    from corescale.workload.packaged import PACKAGED

    return [PACKAGED[model].folder] if model in PACKAGED else []


def served_names(given: list[str] | None, model: str, folder: Path | None) -> list[str]:
    """The service's names, the canonical one first."""
    if given:
        return checked(given)
    found = [display(model), *packaged_name(model), *recorded(folder)]
    return list(dict.fromkeys(name for name in found if name))


def serves(names: list[str], asked: str) -> bool:
    """`asked` names one of the served models: the name, or a hub id or path ending in it (case aside)."""
    wanted = asked.rstrip("/").lower()
    tail = wanted.rsplit("/", 1)[-1]
    for name in names:
        served = name.rstrip("/").lower()
        if wanted in (served, served.rsplit("/", 1)[-1]) or tail == served.rsplit("/", 1)[-1]:
            return True
    return False
