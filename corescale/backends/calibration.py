"""Static int8's inputs: real text for calibration, and which nodes `backend.keep_fp32=` keeps in fp32.

Calibration texts are disjoint from the quality set (workload/quality.py: the first `quality_samples` texts of the
user's file, else of the built-in corpus): the user's texts that follow the quality set's when the file has enough,
else the built-in corpus's last `calibration_samples` texts (rerank: consecutive pairs of them). Each is one row padded
to `sequence_length` (the shape measured), its attention mask marking the text.

keep_fp32 maps to node names of the export by the encoder's own module names (BERT-family `encoder/layer.N/...`,
DistilBERT `transformer/layer.N/...`): attention_output = each layer's attention output projection, ffn_output = each
layer's FFN down projection (its input is the GELU output, whose range is widest), first_last = every node of the first
and last layer, head = every node outside the encoder and the embeddings (pooling, classifier, normalization).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np

from corescale.backends.options import Int8Options, options_as
from corescale.errors import UserError
from corescale.workload import corpus
from corescale.workload.tasks import TASKS
from corescale.workload.tokens import text_encoder

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

_LAYER = re.compile(r"/(?:encoder|transformer)/layer\.(\d+)/")
_PATTERNS = {
    "attention_output": re.compile(r"/(?:encoder|transformer)/layer\.\d+/attention/(?:output/|out_lin/)"),
    "ffn_output": re.compile(r"/(?:encoder|transformer)/layer\.\d+/(?:output/|ffn/lin2/)"),
}


def calibration_items(cfg: BenchmarkConfig, task: str) -> tuple[list, str]:
    """The texts (a pair task's: pairs) calibration runs on, and where they come from relative to the quality
    set."""
    count, skip = options_as(cfg.backend, Int8Options).calibration_samples, cfg.quality_samples
    pairs = TASKS[task].pairs
    if not pairs and cfg.workload.source and cfg.workload.source != corpus.BUILTIN:
        from corescale.workload.samples import read_texts

        texts = read_texts(cfg.workload.source)[skip:skip + count]
        if len(texts) == count:
            return texts, f"{cfg.workload.source} texts {skip}..{skip + count - 1} (after the quality set's)"
    every = corpus.texts()
    tail = every[-(count + 1 if pairs else count):]
    overlap = max(0, min(skip, len(every)) - (len(every) - len(tail)))
    where = "disjoint from the quality set" if not overlap else f"{overlap} of them in the quality set"
    items = list(zip(tail, tail[1:])) if pairs else tail
    return items, f"built-in corpus, its last {len(tail)} texts ({where})"


def calibration_feeds(spec, cfg: BenchmarkConfig, input_names) -> tuple[list[dict[str, np.ndarray]], str, str]:
    """One feed per calibration text (batch 1, padded to sequence_length), their origin, and their digest (part of
    the artifact's key)."""
    items, origin = calibration_items(cfg, spec.task)
    ids, types = text_encoder(cfg, spec)(items)
    length = cfg.sequence_length
    feeds = []
    for row, type_row in zip(ids, types):
        mask = np.zeros((1, length), np.int64)
        mask[0, :len(row)] = 1
        feed = {"input_ids": _padded(row, length), "attention_mask": mask, "token_type_ids": _padded(type_row, length)}
        feeds.append({name: feed[name] for name in input_names})
    digest = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            digest.update(name.encode() + feed[name].tobytes())
    return feeds, origin, digest.hexdigest()[:12]


def _padded(row: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros((1, length), np.int64)
    out[0, :len(row)] = row[:length]
    return out


def kept_fp32(names: list[str], keep: str) -> list[str]:
    """The names among `names` (the export's node names) that keep_fp32=`keep` keeps in fp32; one line when it
    names a part this graph does not have."""
    if keep == "none":
        return []
    if keep == "head":
        found = [n for n in names if not re.search(r"/(?:encoder|transformer|embeddings)/", n)]
    elif keep == "first_last":
        layers = [int(m.group(1)) for n in names if (m := _LAYER.search(n))]
        ends = {min(layers), max(layers)} if layers else set()
        found = [n for n in names if (m := _LAYER.search(n)) and int(m.group(1)) in ends]
    else:
        found = [n for n in names if _PATTERNS[keep].search(n)]
    if not found:
        raise UserError(f"backend.keep_fp32={keep} names no node of this model's graph (it follows BERT-family and "
                        "DistilBERT module names); use keep_fp32=none")
    return found
