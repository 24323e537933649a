"""What a model computes on top of its encoder (its head), and which task that serves, read from its directory
without loading any framework.

- A Sentence-Transformers directory (`modules.json`): Transformer -> Pooling (`1_Pooling/config.json`: cls, mean,
  max, lasttoken) -> optional Dense layers -> optional Normalize: task `embed`.
- A `*ForSequenceClassification` model (`config.json` architectures): one label is a cross-encoder (`rerank`),
  several are a classifier (`classify`, its labels from `id2label`).
- Anything else is a plain encoder (`encode`: the last hidden state, as corescale measured before tasks).

`task=` may ask for another task where the model can do it: a plain encoder or a preset can be measured as an
embedder (mean pooling, L2 normalisation) and a preset as a reranker or classifier (a seeded random head).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corescale.errors import UserError
from corescale.userfiles import read_json
from corescale.workload import tasks

POOLING_MODES = ("cls", "mean", "max", "lasttoken")
POOLING_CHOICES = ("cls", "mean", "max", "last", "lasttoken")  # pooling=: "last" is lasttoken
# 1_Pooling/config.json's flags -> our mode (sentence-transformers' names)
_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                  "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "lasttoken"}
_UNSUPPORTED_FLAGS = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
# modules.json's "type" of each module corescale runs, as every released sentence-transformers wrote it (read from
# each version's sources): 2.0-3.0 the module's path (`type(module).__module__`), 3.1-5.3 its class's path under
# `sentence_transformers.models`, 5.4 and later the class's path in the package's new layout (Normalize moved to
# `base.modules` in 6.0). Each maps to the module's kind.
_OLD = "sentence_transformers.models."
MODULE_TYPES: dict[str, str] = {
    **{_OLD + kind: kind for kind in ("Transformer", "Pooling", "Dense", "Normalize")},
    **{f"{_OLD}{kind}.{kind}": kind for kind in ("Transformer", "Pooling", "Dense", "Normalize")},
    "sentence_transformers.base.modules.transformer.Transformer": "Transformer",
    "sentence_transformers.sentence_transformer.modules.pooling.Pooling": "Pooling",
    "sentence_transformers.base.modules.dense.Dense": "Dense",
    "sentence_transformers.sentence_transformer.modules.normalize.Normalize": "Normalize",  # 5.4-5.x
    "sentence_transformers.base.modules.normalize.Normalize": "Normalize",  # 6.0 and later
}
KNOWN_MODULES = tuple(MODULE_TYPES)
_ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity",
                "torch.nn.modules.activation.ReLU": "relu", "torch.nn.modules.activation.GELU": "gelu"}


@dataclass(frozen=True)
class DenseLayer:
    """A Sentence-Transformers Dense module: Linear(in, out, bias) then an activation; weights in `path`."""

    path: str
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "tanh"


@dataclass(frozen=True)
class HeadSpec:
    task: str = "encode"  # the plain encoder's (a registered task whose head is "tokens")
    pooling: str | None = None  # a pooled head: how token states become one vector
    normalize: bool = False  # a pooled head: L2-normalise the vector
    dense: tuple[DenseLayer, ...] = ()
    labels: tuple[str, ...] = ()  # a logits head: one score, or the classes in logit order
    encoder_path: str | None = None  # the Transformer module's folder (Sentence-Transformers: often the root)
    source: str = "model"  # where the head comes from: "sentence-transformers", "classification", "task=", "model"
    prompt: str = ""  # prepended to every text (a Sentence-Transformers model's default prompt), as the library does

    @property
    def entry(self) -> tasks.Task:
        return tasks.TASKS[self.task]

    @property
    def output_name(self) -> str:
        return self.entry.output

    def to_json(self) -> dict[str, Any]:
        found = dataclasses.asdict(self)
        return found if self.prompt else {k: v for k, v in found.items() if k != "prompt"}  # older keys hold

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HeadSpec:
        data = dict(data)
        data["dense"] = tuple(DenseLayer(**d) for d in data.get("dense", ()))
        data["labels"] = tuple(data.get("labels", ()))
        return cls(**data)

    def identity(self) -> dict[str, Any]:
        """What enters the trial key (only for a head other than the plain encoder's, so old keys hold)."""
        return {} if self.task == tasks.of_head("tokens") else {"head": self.to_json()}

    def summary(self) -> str:
        named = f": {', '.join(self.labels)}" if len(self.entry.labels) > 1 else ""  # classes, not one score
        if self.source == "file":  # a model file's own output, as exported
            return f"the file's output, as exported{named}"
        prompted = [f"prompt {self.prompt!r}"] if self.prompt else []
        if self.entry.head == "pooled":
            parts = [f"{self.pooling} pooling", *(f"dense {d.in_features}->{d.out_features}" for d in self.dense)]
            return ", ".join(prompted + parts + (["L2-normalised"] if self.normalize else []))
        if self.entry.head == "logits":
            return ", ".join(prompted + [f"{len(self.labels)} logit(s){named}"])
        return ", ".join(prompted + ["last hidden state"])


def model_head(path: Path | None, config: dict[str, Any], name: str) -> HeadSpec:
    """The head the model's own files declare (a preset or hub config without a directory: the plain encoder,
    or its classification head from `architectures`)."""
    if path is not None and (path / "modules.json").is_file():
        return sentence_transformers_head(path, name)
    architectures = config.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        labels = classification_labels(config, name)
        return HeadSpec(task=str(tasks.of_head("logits", len(labels))), labels=labels, source="classification")
    return HeadSpec()


def classification_labels(config: dict[str, Any], name: str) -> tuple[str, ...]:
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            return tuple(str(id2label[k]) for k in sorted(id2label, key=int))
        except ValueError:
            raise UserError(f"model '{name}': config.json's id2label keys must be class numbers") from None
    count = config.get("num_labels")
    if isinstance(count, int) and count >= 1:
        return tuple(f"LABEL_{i}" for i in range(count))
    raise UserError(f"model '{name}' is a sequence classifier without labels: config.json has neither id2label "
                    "nor num_labels")


def sentence_transformers_head(path: Path, name: str) -> HeadSpec:
    modules = read_json(path / "modules.json", f"model '{name}': modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise UserError(f"model '{name}': modules.json must be a list of modules, each with a \"type\"")
    unknown = [m["type"] for m in modules if m["type"] not in MODULE_TYPES]
    if unknown:
        raise UserError(f"model '{name}': modules.json names module '{unknown[0]}', which corescale cannot run; "
                        f"known: {', '.join(dict.fromkeys(MODULE_TYPES.values()))} (sentence-transformers 2 to 6)")
    kinds = [MODULE_TYPES[m["type"]] for m in modules]
    if not kinds or kinds[0] != "Transformer":
        raise UserError(f"model '{name}': modules.json must start with a Transformer module")
    folders = [module_folder(path, m.get("path"), name) for m in modules]
    prompt = default_prompt(path, name)
    if kinds == ["Transformer"]:  # a cross-encoder saved by sentence-transformers 5.4 and later: its config says
        config = read_json(folders[0] / "config.json", f"model '{name}': config.json")
        declared = model_head(None, config if isinstance(config, dict) else {}, name)
        if declared.entry.head == "logits":
            return dataclasses.replace(declared, encoder_path=str(folders[0]), prompt=prompt)
    pooling, dense, normalize = None, [], False
    for kind, folder in zip(kinds[1:], folders[1:]):
        if kind == "Pooling":
            pooling = pooling_mode(folder / "config.json", name, bool(prompt))
        elif kind == "Dense":
            dense.append(dense_layer(folder, name))
        elif kind == "Normalize":
            normalize = True
    if pooling is None:
        raise UserError(f"model '{name}': modules.json has no Pooling module, so its embedding is undefined")
    return HeadSpec(task=str(tasks.of_head("pooled")), pooling=pooling, normalize=normalize, dense=tuple(dense),
                    encoder_path=str(folders[0]), source="sentence-transformers", prompt=prompt)


def module_folder(root: Path, relative: Any, name: str) -> Path:
    """A module's folder: a relative path inside the model's directory (as the library requires), nothing else."""
    text = str(relative or "")
    inside = root.resolve()
    folder = (inside / text).resolve()
    if Path(text).is_absolute() or (folder != inside and inside not in folder.parents):
        raise UserError(f"model '{name}': modules.json names the module path '{text[:80]}', outside the model's "
                        "directory; a module's path is a folder inside it")
    return folder


def default_prompt(path: Path, name: str) -> str:
    """The prompt `SentenceTransformer.encode` prepends to every text: `prompts[default_prompt_name]` of
    config_sentence_transformers.json ("" when it names none)."""
    file = path / "config_sentence_transformers.json"
    if not file.is_file():
        return ""
    config = read_json(file, f"model '{name}': config_sentence_transformers.json")
    chosen = config.get("default_prompt_name") if isinstance(config, dict) else None
    if chosen is None:
        return ""
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not isinstance(prompts.get(chosen), str):
        raise UserError(f"model '{name}': config_sentence_transformers.json names default_prompt_name "
                        f"'{str(chosen)[:40]}', which its prompts do not hold")
    return str(prompts[chosen])


def with_prompt(items: list, prompt: str) -> list:
    """The texts as the library encodes them: the prompt before each text, or before a pair's first text."""
    if not prompt:
        return items
    return [(prompt + item[0], *item[1:]) if isinstance(item, (tuple, list)) else prompt + str(item)
            for item in items]


def pooling_mode(config_file: Path, name: str, prompted: bool = False) -> str:
    """The one pooling mode of a Pooling module's config: `pooling_mode` (sentence-transformers 5.4 and later: a
    name, or a list of one) or the older `pooling_mode_*` flags."""
    config = read_json(config_file, f"model '{name}': {config_file.parent.name}/config.json")
    if not isinstance(config, dict):
        raise UserError(f"model '{name}': {config_file} must hold a JSON object")
    if prompted and config.get("include_prompt") is False:
        raise UserError(f"model '{name}': its Pooling module leaves the prompt's tokens out (include_prompt=false), "
                        "which corescale does not compute; supported: pooling over every token")
    named = config.get("pooling_mode")
    if named is not None:
        modes = [named] if isinstance(named, str) else list(named) if isinstance(named, list) else [None]
        flags = {f"pooling_mode_{mode}" for mode in modes}
        chosen = [str(mode) for mode in modes]
    else:
        flags = {flag for flag in (*_POOLING_FLAGS, *_UNSUPPORTED_FLAGS) if config.get(flag) is True}
        chosen = [mode for flag, mode in _POOLING_FLAGS.items() if flag in flags]
    other = [flag for flag in _UNSUPPORTED_FLAGS if flag in flags] + \
        [f"pooling_mode_{m}" for m in chosen if m not in POOLING_MODES]
    if other:
        raise UserError(f"model '{name}': pooling {other[0].removeprefix('pooling_mode_')} is not supported; "
                        f"supported: {', '.join(POOLING_MODES)}")
    if not chosen:
        raise UserError(f"model '{name}': {config_file.parent.name}/config.json sets no pooling mode; set "
                        f"pooling_mode to one of {', '.join(POOLING_MODES)}")
    if len(chosen) > 1:
        raise UserError(f"model '{name}': {config_file.parent.name}/config.json sets several pooling modes "
                        f"({', '.join(chosen)}); corescale runs exactly one")
    return chosen[0]


def dense_layer(folder: Path, name: str) -> DenseLayer:
    config = read_json(folder / "config.json", f"model '{name}': {folder.name}/config.json")
    try:
        activation = _ACTIVATIONS[config.get("activation_function", "torch.nn.modules.activation.Tanh")]
        layer = DenseLayer(str(folder.resolve()), int(config["in_features"]), int(config["out_features"]),
                           bool(config.get("bias", True)), activation)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"model '{name}': {folder.name}/config.json needs in_features, out_features and a known "
                        f"activation_function ({', '.join(_ACTIVATIONS)})") from None
    if not (folder / "model.safetensors").is_file():
        pickled = (folder / "pytorch_model.bin").is_file()
        raise UserError(f"model '{name}': the Dense module {folder.name}/ has no weights (model.safetensors)"
                        + (" (only pytorch_model.bin, pickle weights, which corescale does not load: convert them "
                           "to safetensors)" if pickled else ""))
    return layer


def head_for_task(declared: HeadSpec, task: str | None, source: str, name: str, decoder: bool) -> HeadSpec:
    """The head to measure: the model's own, or `task=`'s where the model can do it (one line where not)."""
    if task is None or task == declared.task:
        return declared
    wanted = tasks.get(task)
    if wanted.head == "tokens":  # every model has a last hidden state
        return dataclasses.replace(declared, task=task, pooling=None, normalize=False, dense=(), labels=())
    if declared.entry.head != "tokens":
        raise UserError(f"model '{name}' is a {declared.entry.noun} (task={declared.task}); it cannot do "
                        f"task={task}")
    if wanted.head == "pooled":
        pooling = "lasttoken" if decoder else "mean"
        return HeadSpec(task=task, pooling=pooling, normalize=True, source="task=")
    if source != "preset":
        raise UserError(f"model '{name}' has no {wanted.noun} head (config.json's architectures name no "
                        f"*ForSequenceClassification); task={task} needs one, or use a preset (its head is random)")
    return HeadSpec(task=task, labels=wanted.labels, source="task=")


def pooled_head(declared: HeadSpec, task: str | None, pooling: str, normalize: bool | None, name: str,
                what: str) -> HeadSpec:
    """The head `pooling=` (and `normalize=`) adds to a model whose output is token states; one line for a model
    that already pools or computes another head, or a task= that is not the pooled one."""
    pooled = str(tasks.of_head("pooled"))
    if pooling not in POOLING_CHOICES:
        raise UserError(f"unknown pooling '{pooling}'; allowed: {', '.join(POOLING_CHOICES)}")
    if declared.entry.head != "tokens":
        raise UserError(f"{what} '{name}' already computes {declared.summary()} (task={declared.task}); pooling= adds "
                        "a head only to a model whose output is token states")
    if task not in (None, pooled):
        raise UserError(f"pooling={pooling} makes {what} '{name}' a {tasks.TASKS[pooled].noun} (task={pooled}); "
                        f"it cannot do task={task}")
    mode = "lasttoken" if pooling == "last" else pooling
    return HeadSpec(task=pooled, pooling=mode, normalize=True if normalize is None else bool(normalize),
                    encoder_path=declared.encoder_path, source="pooling=")


def file_head(spec: Any) -> HeadSpec | None:
    """The head pooling= adds to a model file's token states, which its backend computes on the graph's output
    inside the measured call; None where the graph computes the whole task."""
    head = spec.head
    return head if spec.model_file is not None and head.source == "pooling=" else None


def pool_states(head: HeadSpec, states: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`head`'s pooling (and L2 normalisation) of token states [B, S, H] over the attention mask, as
    Sentence-Transformers computes it (backends/pytorch/task.py's pool, in NumPy)."""
    states = np.asarray(states, dtype=np.float32)
    weights = np.asarray(mask)[:, :states.shape[1], None].astype(np.float32)
    if head.pooling == "cls":
        vector = states[:, 0]
    elif head.pooling == "max":
        vector = np.where(weights > 0, states, np.finfo(np.float32).min).max(axis=1)
    elif head.pooling == "lasttoken":
        vector = states[np.arange(len(states)), weights[:, :, 0].sum(axis=1).astype(np.int64) - 1]
    else:
        vector = (states * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    if head.normalize:
        vector = vector / np.maximum(np.linalg.norm(vector, axis=1, keepdims=True), 1e-12)
    return vector
