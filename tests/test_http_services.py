"""OpenAI-compatible chat + embeddings against a real HTTP server on 127.0.0.1."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ragspine_pipeline.llm.http import HTTPServiceError
from ragspine_pipeline.llm.provider import OpenAICompatibleProvider
from ragspine_pipeline.retrieval.rerank.listwise_rerank import (
    ProviderListwiseJudge,
    listwise_rerank,
)
from ragspine_pipeline.retrieval.vector.embedding_backends import make_embedding_backend


class Handler(BaseHTTPRequestHandler):
    requests: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.requests.append((self.path, body, self.headers.get("Authorization")))
        if self.path.endswith("/chat/completions"):
            if body["messages"][-1]["content"].startswith("FAIL"):
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"boom")
                return
            out = {"choices": [{"message": {"role": "assistant", "content": "[2] > [1]"}}]}
        elif self.path.endswith("/embeddings"):
            out = {"data": [{"index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                            for i, t in enumerate(body["input"])][::-1]}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def test_chat_provider_and_judge(server):
    p = OpenAICompatibleProvider(base_url=server, model="m", api_key="k")
    assert p.chat([{"role": "user", "content": "hello"}], max_tokens=7, stop=["\n"]) == "[2] > [1]"
    path, body, auth = Handler.requests[-1]
    assert path == "/v1/chat/completions" and body["model"] == "m" and auth == "Bearer k"
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["max_tokens"] == 7 and body["stop"] == ["\n"]  # options pass through
    results = [{"chunk_id": "a", "text": "A", "sensitivity": "PUBLIC"},
               {"chunk_id": "b", "text": "B", "sensitivity": "PUBLIC"}]
    out = listwise_rerank("q", results, ProviderListwiseJudge(p))
    assert [r["chunk_id"] for r in out] == ["b", "a"]


def test_http_error_is_typed_and_rerank_falls_back(server):
    p = OpenAICompatibleProvider(base_url=server)
    with pytest.raises(HTTPServiceError, match="HTTP 500"):
        p.chat([{"role": "user", "content": "FAIL please"}])
    dead = OpenAICompatibleProvider(base_url="http://127.0.0.1:9/v1", timeout=2)
    results = [{"chunk_id": "a", "text": "A", "sensitivity": "PUBLIC"},
               {"chunk_id": "b", "text": "B", "sensitivity": "PUBLIC"}]
    assert listwise_rerank("q", results, ProviderListwiseJudge(dead)) == results


def test_openai_embeddings_backend(server, monkeypatch):
    monkeypatch.setenv("RAGSPINE_EMBED_BASE_URL", server)
    b = make_embedding_backend("openai:emb-model")
    vecs = b.embed_texts(["ab", "abcd"])
    assert b.model_id == "openai:emb-model"
    assert len(vecs) == 2
    # Re-ordered by index and L2-normalized.
    assert vecs[0][0] < vecs[1][0]
    assert all(abs(sum(x * x for x in v) - 1) < 1e-9 for v in vecs)


def test_make_reranker_llm_against_local_server(server, monkeypatch):
    from ragspine_pipeline.retrieval.rerank import RerankerUnavailable, make_reranker

    assert make_reranker(None) is None and make_reranker("none") is None
    monkeypatch.setenv("RAGSPINE_LLM_BASE_URL", server)
    rr = make_reranker("llm")
    cands = [{"chunk_id": "a", "text": "A", "sensitivity": "PUBLIC"},
             {"chunk_id": "b", "text": "B", "sensitivity": "PUBLIC"}]
    assert [c["chunk_id"] for c in rr.rerank("q", cands)] == ["b", "a"]
    monkeypatch.delenv("RAGSPINE_RERANKER_MODEL", raising=False)
    with pytest.raises(RerankerUnavailable, match="model weights"):
        make_reranker("cross_encoder")  # no package ships a cross-encoder
    with pytest.raises(ValueError, match="cross_encoder"):  # the message lists what is accepted
        make_reranker("magic")
