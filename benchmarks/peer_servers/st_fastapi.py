"""The common baseline: sentence-transformers behind a plain FastAPI app, as users write it.

    python benchmarks/peer_servers/st_fastapi.py --model DIR [--host 127.0.0.1] [--port 8080] [--threads N]

Each request is `SentenceTransformer(DIR).encode(texts)` in FastAPI's thread pool (plain `def` endpoints), no
batching across requests, no pinning. Routes: OpenAI-compatible `POST /v1/embeddings` ({"input": str | [str],
"model": ...}), Hugging Face TEI's `POST /embed` ({"inputs": str | [str]} -> [[float]]), `GET /health`,
`GET /v1/models`. Not part of corescale: a peer it measures with `corescale run scenario=server endpoint=...`.
"""

from __future__ import annotations

import argparse
import os

from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

MODEL_ENV = "ST_MODEL"  # the model directory when started as `uvicorn st_fastapi:app`

app = FastAPI(title="sentence-transformers")
model: SentenceTransformer | None = None


def loaded() -> SentenceTransformer:
    global model
    if model is None:
        model = SentenceTransformer(os.environ[MODEL_ENV], device="cpu")
    return model


class OpenAIRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


class TEIRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = True


def encode(texts: str | list[str]) -> list[list[float]]:
    batch = [texts] if isinstance(texts, str) else texts
    return loaded().encode(batch).tolist()


@app.post("/v1/embeddings")
def embeddings(request: OpenAIRequest) -> dict:
    vectors = encode(request.input)
    return {"object": "list", "model": request.model or os.path.basename(os.environ[MODEL_ENV]),
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0}}


@app.post("/embed")
def embed(request: TEIRequest) -> list[list[float]]:
    return encode(request.inputs)


@app.get("/health")
def health() -> dict:
    loaded()
    return {"status": "ok"}


@app.get("/v1/models")
def models() -> dict:
    return {"object": "list", "data": [{"id": os.path.basename(os.environ[MODEL_ENV]), "object": "model"}]}


def main() -> None:
    import torch
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a sentence-transformers model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    os.environ[MODEL_ENV] = args.model
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
