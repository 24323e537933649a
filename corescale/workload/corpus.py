"""The built-in real text: what quality is judged on when the user gives no text of their own.

`corescale/data/corpus.jsonl` holds 1,861 English texts, each with its origin: the one-line and long descriptions
of the Debian packages installed on the development machine (`/var/lib/dpkg/status`, split into paragraphs) and the
summaries of the Python distributions in its virtualenv (their metadata). They are real prose of mixed length (a few
words to a few hundred tokens), written by people, about software. `build()` remakes the file from the machine it runs
on (`python -m corescale.workload.corpus OUT`); the shipped file is what every machine reads, so quality figures are
comparable between machines.

Rerank queries are built from the same texts (`rerank_sets`): a package's one-line description is the query; its own
long description paragraphs and the texts that share the most words with the query (TF-IDF cosine over the corpus)
are its candidates: a retrieval first stage as a reranker meets it, with hard negatives that share its words.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from corescale.workload.tasks import TASKS

RERANK_CANDIDATES = 16  # documents per rerank query
BUILTIN = "builtin"  # `workload=builtin`: these texts as the measured queries
CORPUS_FILE = Path(__file__).resolve().parent.parent / "data" / "corpus.jsonl"
SIZE = 2000
MIN_CHARS, MAX_CHARS = 20, 1200
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Text:
    text: str
    origin: str  # "debian:<package>:short" | "debian:<package>:long<N>" | "pypi:<distribution>"


@lru_cache(maxsize=1)
def entries() -> tuple[Text, ...]:
    rows = [json.loads(line) for line in CORPUS_FILE.read_text(encoding="utf-8").split("\n") if line]
    return tuple(Text(str(r["text"]), str(r["origin"])) for r in rows)


def texts(count: int | None = None) -> list[str]:
    """The first `count` texts (all by default), in the file's fixed, shuffled order."""
    found = [t.text for t in entries()]
    return found if count is None else found[:count]


@dataclass(frozen=True)
class RerankSet:
    query: str
    documents: tuple[str, ...]


def workload_items(task: str, count: int) -> tuple[list, str]:
    """`workload=builtin`: the texts (a pair task's: (query, document) pairs) and their origin."""
    if TASKS[task].pairs:
        sets = rerank_sets(max(count // RERANK_CANDIDATES, 2), RERANK_CANDIDATES)
        return [(s.query, d) for s in sets for d in s.documents], (
            f"built-in {task} pairs ({len(sets)} queries x {RERANK_CANDIDATES} candidates: one-line package "
            "descriptions as queries; their own and the most word-sharing texts as candidates)")
    chosen = texts(count)
    return chosen, f"built-in corpus ({len(chosen)} texts: Debian package descriptions, PyPI summaries)"


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rerank_sets(queries: int, candidates: int = 20) -> list[RerankSet]:
    """`queries` queries, each with `candidates` documents (see the module's docstring); deterministic."""
    corpus = entries()
    documents = [t for t in corpus if not t.origin.endswith(":short")]
    counts = [Counter(_words(t.text)) for t in documents]
    frequency = Counter(word for c in counts for word in c)
    idf = {w: math.log(len(documents) / n) for w, n in frequency.items()}

    def vector(counter: Counter) -> dict[str, float]:
        weights = {w: c * idf.get(w, 0.0) for w, c in counter.items()}
        norm = math.sqrt(sum(v * v for v in weights.values())) or 1.0
        return {w: v / norm for w, v in weights.items()}

    vectors = [vector(c) for c in counts]
    found = []
    for query in (t for t in corpus if t.origin.endswith(":short")):
        package = query.origin.split(":")[1]
        q = vector(Counter(_words(query.text)))
        similarity = [sum(q.get(w, 0.0) * v for w, v in vectors[i].items()) for i in range(len(documents))]
        scored = sorted(range(len(documents)), key=lambda i: (-similarity[i], i))
        own = [i for i in range(len(documents)) if documents[i].origin.split(":")[1] == package]
        chosen = (own + [i for i in scored if i not in own])[:candidates]
        if len(chosen) == candidates:
            found.append(RerankSet(query.text, tuple(documents[i].text for i in chosen)))
        if len(found) == queries:
            break
    return found


# --- building the file (run by a developer; the shipped file is what is read) ------------------------------------

def _debian(status: Path) -> list[Text]:
    found: list[Text] = []
    for block in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        package = re.search(r"^Package: (\S+)", block, re.M)
        description = re.search(r"^Description: (.*(?:\n .*)*)", block, re.M)
        if not package or not description:
            continue
        first, *rest = description.group(1).split("\n")
        found.append(Text(first.strip(), f"debian:{package.group(1)}:short"))
        paragraphs = "\n".join(line[1:] for line in rest).split("\n.\n")
        for number, paragraph in enumerate(paragraphs):
            lines = [line.strip() for line in paragraph.split("\n") if line.strip() not in ("", ".")]
            if lines and not any(line.startswith(("*", "-", "+")) for line in lines):
                found.append(Text(" ".join(lines), f"debian:{package.group(1)}:long{number}"))
    return found


def _pypi() -> list[Text]:
    from importlib import metadata

    return [Text(str(d.metadata["Summary"]).strip(), f"pypi:{d.metadata['Name']}")
            for d in metadata.distributions() if d.metadata["Summary"]]


def build(out: Path, status: Path = Path("/var/lib/dpkg/status")) -> int:
    import hashlib

    seen, kept = set(), []
    for item in _debian(status) + _pypi():
        if MIN_CHARS <= len(item.text) <= MAX_CHARS and item.text not in seen:
            seen.add(item.text)
            kept.append(item)
    kept.sort(key=lambda t: hashlib.sha256(t.text.encode()).hexdigest())  # a fixed order, mixed origins
    kept = kept[:SIZE]
    out.write_text("".join(json.dumps({"text": t.text, "origin": t.origin}) + "\n" for t in kept), encoding="utf-8")
    return len(kept)


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])), "texts written")
