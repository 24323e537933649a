"""Model presets (hyperparameters written here, weights random and seeded), the packaged trained model, local
directories (Transformers and Sentence-Transformers) and hub ids.

`resolve_model` is light (no torch): it turns the `model` key (and `task`) into a ModelSpec the parent process can
validate against, its head included (workload/heads.py); `source_files` tells a model's files apart, as light.
`build_torch_model` runs inside the worker.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corescale.errors import UserError
from corescale.userfiles import default_cache_dir, read_json
from corescale.workload.heads import HeadSpec, classification_labels, head_for_task, model_head, pooled_head
from corescale.workload.modelfile import check_text_inputs, graph_task, is_model_file, read_graph, tokenizer_vocab
from corescale.workload.packaged import PACKAGED, packaged_model
from corescale.workload.tasks import TASKS, of_head

if TYPE_CHECKING:
    from corescale.config import BenchmarkConfig

_BERT = dict(model_type="bert", vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
             hidden_act="gelu", layer_norm_eps=1e-12)

PRESETS: dict[str, dict[str, Any]] = {
    "bert-base": dict(_BERT, num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    "bert-large": dict(_BERT, num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                       intermediate_size=4096),
    "bert-tiny": dict(_BERT, num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512),
    "distilbert-base": dict(model_type="distilbert", vocab_size=30522, max_position_embeddings=512, n_layers=6,
                            dim=768, n_heads=12, hidden_dim=3072, activation="gelu"),
    "roberta-base": dict(model_type="roberta", vocab_size=50265, max_position_embeddings=514, type_vocab_size=1,
                         num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                         hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "xlm-roberta-base": dict(model_type="xlm-roberta", vocab_size=250002, max_position_embeddings=514,
                             type_vocab_size=1, num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                             intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-5, pad_token_id=1,
                             bos_token_id=0, eos_token_id=2),
    "mpnet-base": dict(model_type="mpnet", vocab_size=30527, max_position_embeddings=514, num_hidden_layers=12,
                       hidden_size=768, num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                       layer_norm_eps=1e-5, relative_attention_num_buckets=32, pad_token_id=1, bos_token_id=0,
                       eos_token_id=2),
    "modernbert-base": dict(model_type="modernbert", vocab_size=50368, max_position_embeddings=8192,
                            num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152,
                            pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281,
                            sep_token_id=50282),
    # a decoder embedder: Qwen3-Embedding-0.6B's shape (last-token pooling, L2-normalised)
    "qwen3-embedding-0.6b": dict(model_type="qwen3", vocab_size=151669, max_position_embeddings=32768,
                                 num_hidden_layers=28, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=3072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                 tie_word_embeddings=True, pad_token_id=151643, eos_token_id=151643),
    "qwen3-tiny": dict(model_type="qwen3", vocab_size=151669, max_position_embeddings=32768, num_hidden_layers=2,
                       hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       intermediate_size=384, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       pad_token_id=151643, eos_token_id=151643),
}
DECODER_TYPES = ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3")
NO_TOKEN_TYPES = ("distilbert", "mpnet", "modernbert", *DECODER_TYPES)  # their forward takes no token_type_ids
# presets whose own head is not the plain encoder's (the rest: task=encode unless task= says otherwise)
PRESET_HEADS = {name: HeadSpec(task="embed", pooling="lasttoken", normalize=True, source="preset")
                for name in ("qwen3-embedding-0.6b", "qwen3-tiny")}

LOCAL_SOURCES = ("local", "packaged")  # a directory on this machine
_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class ModelSpec:
    """What the model is, known before loading any framework."""

    name: str
    source: str  # preset | local | hub | packaged | file
    config: dict[str, Any] = field(hash=False)
    path: str | None = None
    head_json: dict[str, Any] = field(default_factory=lambda: HeadSpec().to_json(), hash=False)
    # source "file": what the file's graph says (workload/modelfile.py: format, inputs, outputs, bytes, the output
    # measured, hidden and vocabulary sizes where known, where the sizes come from)
    model_file: dict[str, Any] | None = field(default=None, hash=False)
    # reference=DIR: the fp32 model a model file came from (its ModelSpec's fields, its head the file's), the
    # quality check's reference on PyTorch
    reference: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def head(self) -> HeadSpec:
        return HeadSpec.from_json(self.head_json)

    @property
    def reference_spec(self) -> ModelSpec | None:
        return ModelSpec(**self.reference) if self.reference else None

    @property
    def quantization(self) -> dict[str, Any] | None:
        """What a model file's graph says of its precision (workload/modelfile.py), None for a float graph."""
        return (self.model_file or {}).get("quantization")

    @property
    def task(self) -> str:
        return str(self.head_json.get("task", "encode"))

    @property
    def decoder(self) -> bool:
        return self.model_type in DECODER_TYPES

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "bert" if self.model_file is None else "unknown")

    @property
    def layers(self) -> int:
        return int(self.config.get("num_hidden_layers", self.config.get("n_layers", 0)))

    @property
    def hidden(self) -> int:
        return int(self.config.get("hidden_size", self.config.get("dim", (self.model_file or {}).get("hidden") or 0)))

    @property
    def intermediate(self) -> int:
        return int(self.config.get("intermediate_size", self.config.get("hidden_dim", 4 * self.hidden)))

    @property
    def heads(self) -> int:
        return int(self.config.get("num_attention_heads", self.config.get("n_heads", 0)))

    @property
    def query_width(self) -> int:
        """Attention heads x head size (the hidden size, except where head_dim says otherwise: Qwen3)."""
        head_dim = self.config.get("head_dim")
        return self.heads * int(head_dim) if head_dim else self.hidden

    @property
    def key_value_width(self) -> int:
        """Key/value heads x head size (grouped-query attention shares them among query heads)."""
        groups = self.config.get("num_key_value_heads") or self.heads
        return self.query_width * int(groups) // max(self.heads, 1)

    @property
    def gated_ffn(self) -> bool:
        """A gated FFN (GeGLU, SwiGLU): three matrices of d x f, not two."""
        return self.model_type in ("modernbert", *DECODER_TYPES)

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size", (self.model_file or {}).get("vocab_size") or 30522))

    @property
    def sizes_known(self) -> bool:
        """Layers, hidden size and heads are known (a model file without config.json: not), so FLOPs are."""
        return bool(self.layers and self.hidden and self.heads)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence it takes (None: unknown, a model file without config.json)."""
        if self.model_file is not None and "max_position_embeddings" not in self.config:
            return None
        limit = int(self.config.get("max_position_embeddings", 512))
        # RoBERTa reserves padding_idx + 1 positions
        return limit - 2 if self.model_type in ("roberta", "xlm-roberta", "camembert") else limit

    @property
    def takes_token_type_ids(self) -> bool:
        if self.model_file is not None:  # what the graph takes
            return "token_type_ids" in self.model_file["inputs"]
        return self.model_type not in NO_TOKEN_TYPES and int(self.config.get("type_vocab_size", 2)) > 0

    @property
    def encoder_path(self) -> str | None:
        """Where the encoder's weights are (a Sentence-Transformers model may keep them in a subfolder)."""
        return self.head.encoder_path or self.path

    def identity(self) -> dict[str, Any]:
        """Model identity for result keys: the name plus its hyperparameters (and its head, when it has one)."""
        found = {"name": self.name, "source": self.source, "config": self.config, **self.head.identity()}
        if self.reference is not None:
            referred = self.reference_spec
            assert referred is not None
            found["reference"] = {**referred.identity(), "path": referred.path}
        return {**found, "file": self.model_file} if self.model_file is not None else found


def configured_model(cfg: BenchmarkConfig, judged: bool = True) -> ModelSpec:
    """The model a configuration measures: `model`, `task`, `pooling`, `normalize`, and `reference=` naming a model
    where its quality is judged (not where a bundle is served: the reference stays behind)."""
    return resolve_model(cfg.model, cfg.trust_remote_code, cfg.task, cfg.cache_dir, cfg.workload.tokenizer,
                         pooling=cfg.pooling, normalize=cfg.normalize,
                         reference=cfg.reference if judged and not cfg.reference_backend else None)


def resolve_model(name: str, trust_remote_code: bool = False, task: str | None = None,
                  cache_dir: str | None = None, tokenizer: str | None = None, pooling: str | None = None,
                  normalize: bool | None = None, reference: str | None = None) -> ModelSpec:
    """The model and the head `task` asks for (None: the model's own), or the head `pooling` adds to its token
    states; one line for anything it cannot be. `tokenizer` (workload.tokenizer) serves a model file, whose
    vocabulary it gives when no config.json does; `reference` names the fp32 model a model file came from."""
    if normalize is not None and pooling is None:
        raise UserError(f"normalize={str(normalize).lower()} applies to the head pooling= adds; give pooling= too")
    if is_model_file(name) and name not in PRESETS:
        referred = reference_model(reference, trust_remote_code, cache_dir) if reference else None
        spec = file_spec(name, Path(os.path.expanduser(name)), task, tokenizer, pooling, normalize, referred)
        return spec if referred is None else with_reference(spec, referred)
    if reference:
        raise UserError(f"reference={reference} names the fp32 model a model file was exported or quantized from; "
                        f"model '{name}' is not a model file (its own fp32 PyTorch model is its reference)")
    if name in PRESETS:
        spec = ModelSpec(name=name, source="preset", config=dict(PRESETS[name]))
        declared = PRESET_HEADS.get(name, HeadSpec())
    elif name in PACKAGED:
        spec = _local_spec(name, packaged_model(name, cache_dir or default_cache_dir()), source="packaged")
        declared = spec.head
    else:
        path = Path(os.path.expanduser(name))
        if path.exists() or name.startswith((".", "/", "~")):
            spec = _local_spec(name, path)
        elif name.count("/") <= 1 and all(part and " " not in part for part in name.split("/")):
            spec = _hub_spec(name, trust_remote_code)
        else:
            raise UserError(f"unknown model '{name}'; use a preset ({', '.join(PRESETS)}), a packaged model "
                            f"({', '.join(PACKAGED)}), a local directory or a hub id")
        declared = spec.head
    if pooling is not None:
        head = pooled_head(declared, task, pooling, normalize, name, "model")
    else:
        head = head_for_task(declared, task, spec.source, name, spec.model_type in DECODER_TYPES)
    return dataclasses.replace(spec, head_json=head.to_json())


def reference_model(name: str, trust_remote_code: bool, cache_dir: str | None) -> ModelSpec:
    """`reference=` naming a model: a directory, a packaged model or a hub id (not another model file)."""
    if is_model_file(name) and name not in PRESETS:
        raise UserError(f"reference={name} is a model file; the reference is the fp32 model directory or hub id the "
                        "file was exported or quantized from (or a backend name)")
    try:
        return resolve_model(name, trust_remote_code, cache_dir=cache_dir)
    except UserError as failed:
        raise UserError(f"reference={name} is neither a backend nor a model corescale can load: {failed}") from None


def with_reference(spec: ModelSpec, referred: ModelSpec) -> ModelSpec:
    """The file judged against `referred`: the same vocabulary and hidden size (else one line), and the file's
    head on the reference's encoder (a head the file computes itself: the reference's own, of the same task)."""
    where = f"reference={referred.name} cannot judge model file '{spec.name}'"
    if referred.vocab_size != spec.vocab_size:
        raise UserError(f"{where}: its vocabulary has {referred.vocab_size} tokens, the file's {spec.vocab_size} (a "
                        "reference of another vocabulary)")
    found = spec.model_file or {}
    head = spec.head
    tokens = found["outputs"][found["output"]][1][-1] if head.source != "file" or head.entry.head == "tokens" \
        else None  # the width of the file's token states, which the reference's must share
    if tokens and referred.hidden and tokens != referred.hidden:
        raise UserError(f"{where}: its hidden size is {referred.hidden}, the file's token states have {tokens}")
    if head.source == "file":  # the file's own head: the reference's, which must compute the same task
        ref_head = head_for_task(referred.head, spec.task, referred.source, referred.name, referred.decoder)
    else:  # pooling= on the file: the same head on the reference's encoder
        ref_head = dataclasses.replace(head, encoder_path=referred.head.encoder_path, prompt=referred.head.prompt)
    if ref_head.task != spec.task:
        raise UserError(f"{where}: it is a {ref_head.entry.noun}, the file a {head.entry.noun}")
    fields = dataclasses.asdict(dataclasses.replace(referred, head_json=ref_head.to_json()))
    return dataclasses.replace(spec, reference=fields)


def _local_spec(name: str, path: Path, source: str = "local") -> ModelSpec:
    if not path.is_dir():
        raise UserError(f"model directory '{name}' does not exist")
    head = model_head(path, {}, name) if (path / "modules.json").is_file() else None
    folder = Path(head.encoder_path) if head and head.encoder_path else path
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UserError(f"model directory '{name}' has no config.json")
    config = read_json(config_file, f"model directory '{name}': config.json")
    check_config(config, f"model directory '{name}': config.json")
    head = head or model_head(None, config, name)
    return ModelSpec(name=name, source=source, config=config, path=str(path.resolve()), head_json=head.to_json())


def file_spec(name: str, path: Path, task: str | None, tokenizer: str | None, pooling: str | None = None,
              normalize: bool | None = None, referred: ModelSpec | None = None) -> ModelSpec:
    """An exported model file (workload/modelfile.py): its graph read, its inputs a text model's, its task from its
    outputs (or the head pooling= adds to its token states), its sizes from a config.json beside it or, where the
    graph tells them, from the graph; its vocabulary from its tokenizer, else from its reference's."""
    graph = read_graph(path, name)
    check_text_inputs(graph, name)
    if pooling is not None:
        declared, _ = graph_task(graph, name, None)
        pooled_head(HeadSpec(task=declared, source="file"), task, pooling, normalize, name, "model file")
        chosen, output = graph_task(graph, name, of_head("tokens"))
    else:
        chosen, output = graph_task(graph, name, task)
    config_file = path.parent / "config.json"
    config: dict[str, Any] = {}
    if config_file.is_file():
        config = read_json(config_file, f"model file '{name}': config.json beside it")
        check_config(config, f"model file '{name}': config.json beside it")
    folder = Path(os.path.expanduser(tokenizer)) if tokenizer else path.parent
    vocab = config.get("vocab_size") or tokenizer_vocab(folder) or (referred.vocab_size if referred else None)
    if vocab is None:
        raise UserError(f"model file '{name}' needs its tokenizer: give workload.tokenizer=DIR (a folder holding "
                        "tokenizer.json), put tokenizer.json or config.json beside the file, or name the model it "
                        "came from (reference=DIR)")
    dims = graph["outputs"][output][1]
    labels: tuple[str, ...] = ()
    entry = TASKS[chosen]
    if entry.head == "logits":  # one score, else the classes ((): unknown)
        labels = classification_labels(config, name) if config.get("id2label") or config.get("num_labels") else \
            entry.labels if len(entry.labels) == 1 else tuple(f"LABEL_{i}" for i in range(dims[1] or 0))
    head = HeadSpec(task=chosen, labels=labels, source="file")
    found = {**graph, "output": output, "vocab_size": int(vocab), "sizes": "config.json" if config else "graph",
             "hidden": dims[-1] if entry.head != "logits" else None}
    if pooling is not None:
        head = pooled_head(HeadSpec(task=chosen, source="file"), task, pooling, normalize, name, "model file")
    return ModelSpec(name=name, source="file", config=config, path=str(path.resolve()), head_json=head.to_json(),
                     model_file=found)


# config.json fields ModelSpec reads, with the least value each may take (BERT spellings, then DistilBERT's)
SIZE_FIELDS = {"num_hidden_layers": 1, "hidden_size": 1, "num_attention_heads": 1, "intermediate_size": 1,
               "vocab_size": 1, "max_position_embeddings": 1, "type_vocab_size": 0,
               "n_layers": 1, "dim": 1, "n_heads": 1, "hidden_dim": 1}


def check_config(config: Any, where: str) -> None:
    """A model config a user handed us: a JSON object whose size fields are whole numbers in range (a string or
    negative size would fail deep inside a worker)."""
    if not isinstance(config, dict):
        raise UserError(f"{where} must hold a JSON object of model settings, not a {type(config).__name__}")
    if not isinstance(config.get("model_type", ""), str):
        raise UserError(f"{where}: model_type must be a string such as \"bert\" (got {config['model_type']!r})")
    for key, least in SIZE_FIELDS.items():
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise UserError(f"{where}: {key} must be a whole number >= {least} (got {value!r})")
    hidden = config.get("hidden_size", config.get("dim"))
    heads = config.get("num_attention_heads", config.get("n_heads"))
    if hidden and heads and hidden % heads:
        raise UserError(f"{where}: the hidden size {hidden} is not a multiple of the {heads} attention heads")
    check_special_tokens(config, where)


SPECIAL_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")
FIRST_ORDINARY_ID = 5  # random query ids are drawn from here up (below: a model's special tokens)


def check_special_tokens(config: dict, where: str) -> None:
    """The vocabulary holds the special token ids the config names and some ordinary ids after the first
    FIRST_ORDINARY_ID (random queries draw from those)."""
    vocab = config.get("vocab_size", 30522)
    if not isinstance(vocab, int):
        return  # a size field of the wrong type: check_config's
    if vocab <= FIRST_ORDINARY_ID:
        raise UserError(f"{where}: vocab_size={vocab} leaves no ordinary token ids (random queries use ids "
                        f"{FIRST_ORDINARY_ID} and up, below the vocabulary size); allowed: vocab_size > "
                        f"{FIRST_ORDINARY_ID}")
    for key in SPECIAL_TOKENS:
        value = config.get(key)
        ids = value if isinstance(value, list) and value else [value]  # some configs list several eos ids
        if value is not None and not all(_token_id(v, vocab) for v in ids):
            raise UserError(f"{where}: {key}={str(value)[:40]} is not a token id of the vocabulary (a whole number "
                            f"from 0 to vocab_size-1 = {vocab - 1})")


def _token_id(value: Any, vocab: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab


def _hub_reachable(host: str = "huggingface.co") -> bool:
    import socket

    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def _hub_spec(name: str, trust_remote_code: bool) -> ModelSpec:
    """A hub id from the local cache first; the network only when allowed and reachable."""
    import logging

    from transformers import AutoConfig

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false")
    attempts = [True] if offline or not _hub_reachable() else [True, False]
    error = None
    for local_only in attempts:
        try:
            config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, local_files_only=local_only)
        except Exception as exc:  # not cached, unknown id, no network: all the same to the user
            error = exc
            continue
        found = config.to_dict()
        check_special_tokens(found, f"hub model '{name}': config.json")
        return ModelSpec(name=name, source="hub", config=found, path=name,
                         head_json=model_head(hub_snapshot(name), found, name).to_json())
    why = "HF_HUB_OFFLINE is set" if offline else ("the hub is unreachable" if len(attempts) == 1 else "")
    hint = f" ({why} and it is not in the local cache)" if why else ""
    raise UserError(
        f"unknown model '{name}': not a preset ({', '.join(PRESETS)}), not a local directory, "
        f"and not loadable as a hub id{hint}: {str(error).splitlines()[0][:120]}"
    )


def weights_file_kind(path: Path) -> str | None:
    if any((path / f).is_file() for f in _SAFE_WEIGHTS):
        return "safetensors"
    if any((path / f).is_file() for f in _PICKLE_WEIGHTS):
        return "pickle"
    return None


def source_files(spec: ModelSpec) -> list[tuple[str, str, int, int]] | None:
    """The files a model is built from, told apart without loading any framework: (name, the file it resolves to,
    size, modification time) of each file in its folder (a hub snapshot's files resolve to blobs named by their
    hash). A preset has none (its weights come from the seed); None when the files cannot be found."""
    if spec.source == "preset":
        return []
    if spec.path is None:
        return None
    folder = Path(spec.path) if spec.source in LOCAL_SOURCES else None
    if spec.source == "file":  # the file, its weights beside it (external data, an IR's .bin), its config.json
        model = Path(spec.path)
        folder = model.parent
        wanted = {model.with_suffix(".bin").name, "config.json"}
        picked = lambda item: item.name.startswith(model.name) or item.name in wanted  # noqa: E731
    else:
        folder = folder or hub_snapshot(spec.path)
        picked = lambda item: True  # noqa: E731 - a model directory: every file in it
    if folder is None or not folder.is_dir():
        return None
    found = []
    for item in sorted(folder.iterdir()):
        if item.is_file() and picked(item):
            real = item.resolve()
            stat = real.stat()
            found.append((item.name, str(real), stat.st_size, stat.st_mtime_ns))
    return found


def hub_snapshot(repo_id: str) -> Path | None:
    """The folder of a hub model's snapshot in the local cache (its commit), if it is there."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def build_torch_model(spec: ModelSpec, seed: int, trust_remote_code: bool = False, allow_pickle: bool = False):
    """The PyTorch model in eval mode (eager attention, so every exporter sees the same graph): the encoder, or
    for a reranker or classifier the sequence classifier with its head (workload/heads.py)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    head = spec.head
    classifier = head.entry.head == "logits"
    auto = AutoModelForSequenceClassification if classifier else AutoModel
    if spec.source == "preset":
        config = dict(spec.config)
        model_type = config.pop("model_type")
        if classifier:
            config.update(num_labels=len(head.labels), id2label=dict(enumerate(head.labels)))
        hf_config = AutoConfig.for_model(model_type, **config)
        hf_config._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = auto.from_config(hf_config)
    else:
        path = spec.encoder_path or spec.name  # a local or hub spec names where its weights are
        if spec.source in LOCAL_SOURCES:
            kind = weights_file_kind(Path(path))
            if kind is None:
                raise UserError(f"model directory '{spec.name}' has no model.safetensors (or pytorch_model.bin)")
            if kind == "pickle" and not allow_pickle:
                raise UserError(
                    f"model directory '{spec.name}' holds pickle weights (pytorch_model.bin), which can run code; "
                    "convert them to safetensors or set allow_pickle=true"
                )
        model = auto.from_pretrained(
            path, trust_remote_code=trust_remote_code, use_safetensors=None if allow_pickle else True,
            attn_implementation="eager",
        )
    return model.eval()
