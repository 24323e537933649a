"""The user's evaluation data scored in instance 0 after the timed window (workload/evaluation.py reads it): the
measured configuration's outputs and the fp32 reference's on the same tokens, each in the data kind's metrics
(workload/tasks.py EVALUATIONS), and the drop between them.

Libraries: nDCG@10 is scikit-learn's `ndcg_score` (the relevance grades as gains), Spearman's rank correlation is
SciPy's `spearmanr`, accuracy is scikit-learn's `accuracy_score`; recall@10 (the share of a query's relevant
documents among its ten best-scored) is one line of NumPy.
"""

from __future__ import annotations

import numpy as np

from corescale.workload.evaluation import EvalData
from corescale.workload.tasks import EVALUATIONS

LIBRARIES = "scikit-learn ndcg_score, accuracy_score; scipy spearmanr"
K = 10


def _unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def retrieval(out: np.ndarray, data: EvalData, labels: tuple[str, ...]) -> dict[str, float]:
    from sklearn.metrics import ndcg_score

    queries = len(data.queries)
    scores = _unit(out[:queries]) @ _unit(out[queries:]).T  # cosine of every query with every document
    gains = np.zeros_like(scores)
    for row, grades in enumerate(data.relevant):
        gains[row, list(grades)] = list(grades.values())
    top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
    recall = [len(set(top[row]) & set(grades)) / len(grades) for row, grades in enumerate(data.relevant)]
    k = min(K, scores.shape[1])
    return {"recall_at_10": float(np.mean(recall)), "ndcg_at_10": float(ndcg_score(gains, scores, k=k))}


def pairs(out: np.ndarray, data: EvalData, labels: tuple[str, ...]) -> dict[str, float]:
    from scipy.stats import spearmanr

    count = len(data.gold)
    if len(out) == count:  # one score per pair (a cross-encoder's logit)
        predicted = out.reshape(count, -1)[:, 0]
    else:  # both sentences embedded: their cosine
        predicted = (_unit(out[:count]) * _unit(out[count:])).sum(axis=1)
    return {"spearman": float(spearmanr(predicted, data.gold).statistic)}


def labelled(out: np.ndarray, data: EvalData, labels: tuple[str, ...]) -> dict[str, float]:
    from sklearn.metrics import accuracy_score

    chosen = out.reshape(len(out), -1).argmax(axis=1)
    gold = [labels.index(g) if isinstance(g, str) and g in labels else g for g in data.gold]
    return {"accuracy": float(accuracy_score([str(g) for g in gold], [str(int(c)) for c in chosen]))}


SCORERS = {"retrieval": retrieval, "pairs": pairs, "labels": labelled}
assert set(SCORERS) == set(EVALUATIONS), "every kind of evaluation data has its scorer"


def score(kind: str, out: np.ndarray, data: EvalData, labels: tuple[str, ...]) -> dict[str, float]:
    found = SCORERS[kind](out, data, labels)
    assert set(found) == set(EVALUATIONS[kind])
    return found
