"""Lexical channel: analyzer, BM25, fusion, glossary rewriting, predicates, HybridRetriever."""
