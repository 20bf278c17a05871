"""One partition per library folder under the corpus root (registered by a sensor)."""

import warnings

import dagster as dg

library_partitions = dg.DynamicPartitionsDefinition(name="library")


def library_check(name: str, *, asset: str | dg.AssetKey, description: str) -> dg.AssetCheckSpec:
    """A check spec of a library-partitioned asset, partitioned like it.

    Why: a check without ``partitions_def`` records its result against no partition, so
    the UI shows Partition "—" and one history mixing every library (e.g. a 0.9 floor of
    one library next to 0.7 of another). With it, each evaluation is stored against the
    step's library partition. Dagster marks the argument a preview (a PreviewWarning at
    definition time); the warning is silenced here, for this one call, because this is
    the only way it records the partition.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return dg.AssetCheckSpec(name, asset=asset, description=description, partitions_def=library_partitions)
