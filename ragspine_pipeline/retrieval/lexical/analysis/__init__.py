"""Text analysis for the lexical channel: the tokenizer/analyzer, Unicode script classes, stop words and the glossary query rewriter."""
