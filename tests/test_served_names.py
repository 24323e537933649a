"""Names as OpenAI-compatible clients use them (issue 55, item 1): `--served-model-name NAME [NAME ...]`, the first
the one answers carry; by default the bundle's model, a packaged model's own name and the names its folder's model
card records; `GET /v1/models` in OpenAI's shape, read by the official `openai` client."""

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from helpers import corescale
from serving import minilm_folder
from test_serve_limits import VOCAB, FakePool

from corescale.errors import UserError
from corescale.serve.limits import Limits
from corescale.serve.names import checked, served_names, serves
from corescale.serve.tokens import Tokens

CARD = """---
language: en
model_name: acme/minilm-support-v3
model-index:
- name: minilm-support
  results: []
---
# minilm-support
"""


def test_a_packaged_preset_answers_to_its_own_name_too():
    assert served_names(None, "all-minilm-l6-v2", None) == ["all-minilm-l6-v2", "all-MiniLM-L6-v2"]


def test_a_folder_answers_to_its_name_and_what_its_model_card_records(tmp_path):
    folder = tmp_path / "minilm"
    folder.mkdir()
    assert served_names(None, str(folder), folder) == ["minilm"]
    (folder / "README.md").write_text(CARD)
    assert served_names(None, str(folder), folder) == ["minilm", "acme/minilm-support-v3", "minilm-support"]


def test_given_names_replace_the_derived_ones_the_first_canonical(tmp_path):
    assert served_names(["all-MiniLM-L6-v2", "embedder", "embedder"], str(tmp_path), tmp_path) == \
        ["all-MiniLM-L6-v2", "embedder"]


@pytest.mark.parametrize("names, message", [(["two words"], "not a model id"), (['x"y'], "not a model id"),
                                            ([""], "not a model id"), (["a" * 201], "not a model id"),
                                            ([f"m{i}" for i in range(17)], "at most 16")])
def test_bad_names_are_one_line(names, message):
    with pytest.raises(UserError) as err:
        checked(names)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("asked, served", [("all-MiniLM-L6-v2", True), ("sentence-transformers/all-MiniLM-L6-v2", True),
                                           ("ALL-minilm-l6-v2", True), ("/models/minilm/", True),
                                           ("text-embedding-3-large", False), ("all-MiniLM", False)])
def test_a_request_names_any_served_model(asked, served):
    assert serves(["minilm", "all-MiniLM-L6-v2"], asked) is served


def front(names):
    from corescale.serve.app import Front, create_app
    from corescale.serve.metrics import Metrics
    from corescale.workload.heads import HeadSpec

    tokens = Tokens(minilm_folder() / "tokenizer.json", 64, Limits(max_inputs=8), VOCAB)
    head = HeadSpec(task="embed", pooling="mean", normalize=False)
    app = create_app(Front(FakePool(rows=lambda ids: np.arange(1, 33, dtype=np.float32)), tokens, head, names,
                           Metrics(), width=32), "k3y")
    return TestClient(app, base_url="http://localhost", raise_server_exceptions=False)


def test_the_openai_client_lists_the_models_and_embeds_with_any_of_their_names():
    client = openai.OpenAI(base_url="http://localhost/v1", api_key="k3y", max_retries=0,
                           http_client=front(["minilm", "all-MiniLM-L6-v2"]))
    listed = client.models.list()
    assert [m.id for m in listed.data] == ["minilm", "all-MiniLM-L6-v2"]
    assert all(m.object == "model" and m.owned_by == "corescale" and m.created > 0 for m in listed.data)
    assert client.models.retrieve("all-MiniLM-L6-v2").id == "minilm"  # the canonical one answers
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=["one text"])
    assert answer.model == "minilm" and len(answer.data[0].embedding) == 32
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("text-embedding-3-large")
    assert missing.value.response.json()["error_type"] == "model_not_found"
    assert "'all-MiniLM-L6-v2'" in missing.value.response.json()["error"]


def test_the_model_list_needs_the_key_as_every_route_but_health():
    answer = front(["minilm"]).get("/v1/models")
    assert answer.status_code == 401, answer.text


@pytest.mark.slow  # the CLI: a bad name is refused before the bundle is read; deploy passes the names on
def test_serve_and_deploy_take_the_names(tmp_path, tiny_bundle):
    import yaml

    proc = corescale("serve", str(tiny_bundle("embed")), "--served-model-name", "two words")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "not a model id" in proc.stderr
    out = tmp_path / "k8s"
    proc = corescale("deploy", str(tiny_bundle("embed")), "--target", "kubernetes", "--out", str(out),
                     "--served-model-name", "all-MiniLM-L6-v2", "embedder", "--max-queue", "64",
                     "--receive-timeout", "10")
    assert proc.returncode == 0, proc.stderr
    documents = [d for f in out.glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    (deployment,) = [d for d in documents if d.get("kind") == "Deployment"]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-7:] == ["--served-model-name", "all-MiniLM-L6-v2", "embedder", "--max-queue", "64",
                            "--receive-timeout", "10"]
    exposed = corescale("deploy", str(tiny_bundle("embed")), "--target", "ray", "--host", "0.0.0.0")
    assert exposed.returncode == 2 and exposed.stderr.strip().count("\n") == 0, exposed.stderr
    assert "--behind-proxy" in exposed.stderr and "connection protections" in exposed.stderr


def test_the_protections_given_are_passed_on_as_serve_words():
    import argparse

    from corescale.commands.serve import add_protections, protection_words, protections

    parser = argparse.ArgumentParser()
    add_protections(parser)
    assert protection_words(parser.parse_args([])) == []
    given = parser.parse_args(["--max-queue", "64", "--auto-truncate", "--queue-timeout", "2.5",
                               "--payload-limit", "1000"])
    assert protection_words(given) == ["--max-queue", "64", "--payload-limit", "1000", "--auto-truncate",
                                       "--queue-timeout", "2.5"]
    assert protections(given)["max_queue"] == 64 and protections(given)["limits"].payload_bytes == 1000


@pytest.mark.parametrize("header, status", [("Bearer k3y", 200), ("bearer k3y", 200), ("BEARER  k3y ", 200),
                                            ("Basic k3y", 401), ("Bearer k3yX", 401), ("k3y", 401), ("", 401)])
def test_the_bearer_scheme_is_case_insensitive_as_rfc_7235_says(header, status):
    """Review 0.4 L1: `bearer KEY` got 401."""
    answer = front(["minilm"]).get("/v1/models", headers={"Authorization": header} if header else {})
    assert answer.status_code == status, answer.text
