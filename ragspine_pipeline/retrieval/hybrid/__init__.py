"""The hybrid retriever: metadata pre-filter, BM25 (+ dense) per query variant, rank fusion. Fusion and the dense top-k sit here, next to the retriever that fuses."""
