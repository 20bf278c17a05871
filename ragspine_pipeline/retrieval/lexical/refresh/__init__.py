"""Building and refreshing a published BM25 index: publishing, the streaming build, incremental merge, hash-bucket segments and the segment stack."""
