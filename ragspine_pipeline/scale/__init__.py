"""Past one machine, on Ray (the ``[scale]`` extra): distributed chunking and embedding
steps, and a library served as hash shards queried by exact two-phase scatter-gather.

Nothing here imports Ray at module import: ``config`` reads the settings, and the modules
that need Ray import it when called, so a base install can read (and refuse) the settings.
"""
