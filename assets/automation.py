"""Refresh job, the library sensor (new folders + changed files) and the daily schedule.

The schedule is built by ``build_refresh_schedule()`` when the Definitions are built, not
at import: its cron and time zone (``RAGSPINE_REFRESH_CRON`` / ``RAGSPINE_REFRESH_TZ``)
are read then, so importing this module never fails on a bad value and a test or a
deployment that sets them after import is honoured.
"""

import hashlib
import json

import dagster as dg

from ragspine_pipeline import settings
from ragspine_pipeline.warehouse.raw import refresh_reason, scan_library
from resources import WarehouseResource

from .library_assets import LIBRARY_ASSETS
from .partitions import library_partitions

refresh_job = dg.define_asset_job(
    "refresh_library", selection=dg.AssetSelection.assets(*LIBRARY_ASSETS),
    description="Re-ingest one library: parse, chunk (incremental), index, publish, catalog.",
)


def library_fingerprint(folder) -> str:
    """Hash of the raw_documents step's own change signatures (size, mtime, ctime, inode of
    every file; sidecars by content): changes whenever a refresh might publish something,
    and also when a file was only touched (``refresh_reason`` then tells the two apart)."""
    return hashlib.sha1(json.dumps(scan_library(folder), sort_keys=True).encode()).hexdigest()


@dg.sensor(job=refresh_job, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Registers a partition per new library folder and refreshes a library when its files change "
                       "in content (a file only touched launches nothing).")
def library_sensor(context: dg.SensorEvaluationContext, warehouse: WarehouseResource) -> dg.SensorResult:
    """The cursor holds each library's fingerprint as last seen. A library whose
    fingerprint is not the cursor's (every library on the first evaluation, when there is
    no cursor) is compared with the warehouse: a run is launched only when a refresh would
    publish something (``refresh_reason``: not built, files changed in content, not
    published) or the library is a new partition. So a first start over an up-to-date
    warehouse, or a file touched back to the same bytes, launches nothing."""
    cursor = json.loads(context.cursor) if context.cursor else {}
    known = set(context.instance.get_dynamic_partitions(library_partitions.name))
    libs = warehouse.libraries_on_disk()
    new = [lib for lib in libs if lib not in known]
    runs, next_cursor = [], {}
    wh = warehouse.tables()
    for lib in libs:
        fp = library_fingerprint(warehouse.corpus_path() / lib)
        next_cursor[lib] = fp
        if cursor.get(lib) == fp:
            continue
        reason = "new library" if lib in new else refresh_reason(wh, warehouse.corpus_path(), lib)
        if reason is not None:
            runs.append(dg.RunRequest(partition_key=lib, run_key=f"{lib}:{fp[:16]}",
                                      tags={"ragspine/trigger": reason}))
    return dg.SensorResult(
        run_requests=runs,
        dynamic_partitions_requests=[library_partitions.build_add_request(new)] if new else [],
        cursor=json.dumps(next_cursor, sort_keys=True),
    )


def daily_refresh(context: dg.ScheduleEvaluationContext):
    """One run per registered library, keyed by the scheduled minute (a retry is a no-op)."""
    stamp = context.scheduled_execution_time.strftime("%Y-%m-%dT%H:%M") if context.scheduled_execution_time else "now"
    return [dg.RunRequest(partition_key=lib, run_key=f"daily:{stamp}:{lib}")
            for lib in context.instance.get_dynamic_partitions(library_partitions.name)]


def build_refresh_schedule() -> dg.ScheduleDefinition:
    """The daily refresh of every registered library, on ``RAGSPINE_REFRESH_CRON`` (default
    ``0 3 * * *``) in ``RAGSPINE_REFRESH_TZ`` (default UTC), read now; a bad value is a
    SettingsError naming the variable."""
    return dg.schedule(job=refresh_job, name="daily_refresh",
                       cron_schedule=settings.get("RAGSPINE_REFRESH_CRON"),
                       execution_timezone=settings.get("RAGSPINE_REFRESH_TZ"),
                       description="Daily refresh of every registered library (cron: RAGSPINE_REFRESH_CRON).",
                       )(daily_refresh)
