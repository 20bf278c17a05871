"""The published BM25 file: its on-disk layout and checks, the shared memory mapping, and the raw postings a build counts before a layout is chosen."""
