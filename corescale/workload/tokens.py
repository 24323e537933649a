"""Tokenizers, light: which tokenizer a model's text goes through, loaded as the model's fast tokenizer (the
`tokenizers` library: no Transformers import, so a worker can tokenize inside its timed call cheaply)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corescale.errors import UserError
from corescale.userfiles import read_text

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

MAX_TOKENIZER_BYTES = 64 * 2**20  # the largest tokenizer.json read (real ones: under 40 MiB)
BUILTIN_TOKENIZER_MODEL = "all-minilm-l6-v2"  # its BERT WordPiece tokenizer serves presets that have none


def tokenizer_dir(cfg: BenchmarkConfig, model) -> tuple[Path | None, str]:
    """Where the tokenizer comes from, and how the record names it: workload.tokenizer, the model's own folder,
    or for a BERT preset the built-in BERT WordPiece one (the same 30,522-token vocabulary); None when there is
    none."""
    from corescale.workload.models import resolve_model  # models imports the heads, which import the config

    if cfg.workload.tokenizer:
        return Path(cfg.workload.tokenizer).expanduser(), f"tokenizer {cfg.workload.tokenizer}"
    if model.source in ("local", "packaged") and model.path:
        return Path(model.path), "the model's tokenizer"
    if model.source == "file" and model.path and (Path(model.path).parent / "tokenizer.json").is_file():
        return Path(model.path).parent, "the tokenizer beside the model file"
    if model.source == "file" and model.reference_spec is not None:  # the model the file came from
        folder, _ = tokenizer_dir(cfg, model.reference_spec)
        return folder, f"the tokenizer of reference={model.reference_spec.name}"
    if model.source == "hub" and model.path:
        from corescale.workload.models import hub_snapshot

        snapshot = hub_snapshot(model.path)
        if snapshot is not None:
            return snapshot, "the model's tokenizer"
    if model.source == "preset" and model.vocab_size == 30522 and model.model_type in ("bert", "distilbert"):
        try:
            packaged = resolve_model(BUILTIN_TOKENIZER_MODEL, cache_dir=cfg.cache_dir)
        except UserError:
            return None, ""
        return Path(str(packaged.path)), "the BERT WordPiece tokenizer of all-MiniLM-L6-v2 (the preset has none)"
    return None, ""


def fast_tokenizer(folder: Path, max_length: int):
    """The model's fast tokenizer (`tokenizers`, no Transformers import), no padding, truncated to max_length."""
    from tokenizers import Tokenizer

    file = folder / "tokenizer.json"
    if not file.is_file():
        raise UserError(f"tokenizer folder '{folder}' has no tokenizer.json (a fast tokenizer); corescale needs one "
                        "for real text and tokenize=true")
    text = read_text(file, "the tokenizer", MAX_TOKENIZER_BYTES)  # bounded: the Rust loader takes it whole
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust library raises its own exception type for any bad file
        raise UserError(f"{file} is not a readable fast tokenizer: {str(exc).splitlines()[0][:160]}") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def encode_texts(tokenizer, items: list, vocab: int, where: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(ids, type ids) of each text or (query, document) pair."""
    encoded = tokenizer.encode_batch(items)
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
    top = max(int(row.max()) for row in ids)
    if top >= vocab:
        raise UserError(f"{where} gives token id {top}, beyond the model's {vocab} embeddings; use the model's own "
                        "tokenizer (workload.tokenizer=DIR)")
    return ids, [np.asarray(e.type_ids, dtype=np.int64) for e in encoded]


def text_encoder(cfg: BenchmarkConfig, model):
    """items (texts, or (query, document) pairs) -> (ids, type ids): the model's fast tokenizer, else its
    Transformers tokenizer (one line when it has neither); the model's prompt first, as its library puts it."""
    from corescale.workload.heads import with_prompt

    folder, named = tokenizer_dir(cfg, model)
    prompt = model.head.prompt
    if folder is not None and (folder / "tokenizer.json").is_file():
        tokenizer = fast_tokenizer(folder, cfg.sequence_length)
        return lambda items: encode_texts(tokenizer, with_prompt(items, prompt), model.vocab_size, named)
    slow = load_tokenizer(cfg, model)

    def encode(items):
        items = with_prompt(items, prompt)
        pairs = bool(items) and isinstance(items[0], tuple)
        args = ([a for a, _ in items], [b for _, b in items]) if pairs else (items,)
        found = slow(*args, truncation=True, max_length=cfg.sequence_length)
        ids = [np.asarray(r, dtype=np.int64) for r in found["input_ids"]]
        types = [np.asarray(r, dtype=np.int64) for r in found.get("token_type_ids", [np.zeros_like(i) for i in ids])]
        top = max(int(row.max()) for row in ids)
        if top >= model.vocab_size:
            raise UserError(f"the tokenizer gives token id {top}, beyond the {model.vocab_size} embeddings of model "
                            f"'{cfg.model}'; use the model's own tokenizer (workload.tokenizer=DIR)")
        return ids, types
    return encode


def load_tokenizer(cfg: BenchmarkConfig, model):
    """The model's tokenizer (a local directory or a hub id already cached; HF_HUB_OFFLINE is respected)."""
    name = cfg.workload.tokenizer or (model.path if model.source == "local" else None) or (
        cfg.model if model.source == "hub" else None)
    if name is None:
        raise UserError(f"model '{cfg.model}' is a preset without a tokenizer: give workload.tokenizer=DIR "
                        "(a directory with tokenizer files) or a hub id in the local cache")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    local = Path(os.path.expanduser(name))
    if not local.is_dir() and (name.startswith(("/", ".", "~")) or local.exists()):
        raise UserError(f"tokenizer directory '{name}' does not exist (or is not a directory); give a directory "
                        "holding tokenizer.json or tokenizer_config.json, or a hub id in the local cache")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(local) if local.is_dir() else name,
                                             local_files_only=offline or local.is_dir())
    except Exception as exc:  # transformers raises many kinds for a directory it cannot read
        where = "offline (HF_HUB_OFFLINE is set)" if offline else "as a local directory or on the hub"
        raise UserError(f"tokenizer '{name}' cannot be found {where}: {str(exc).splitlines()[0][:160]}; give a "
                        "directory holding tokenizer.json or tokenizer_config.json") from None


def served_tokenizer(cfg: BenchmarkConfig, model) -> Path:
    """The folder of the fast tokenizer (tokenizer.json) a service tokenizes text with; UserError when there is
    none."""
    folder, _ = tokenizer_dir(cfg, model)
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise UserError(f"model '{cfg.model}' has no fast tokenizer (tokenizer.json) to serve text with: give "
                        "workload.tokenizer=DIR")
    return folder
