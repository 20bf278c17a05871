"""One partition per library folder under the corpus root (registered by a sensor)."""

import dagster as dg

library_partitions = dg.DynamicPartitionsDefinition(name="library")
