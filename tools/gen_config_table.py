"""Write the configuration tables from the settings registry: docs/configuration.md and the
block between the markers in README.md (``--check``: exit 1 if either is stale).

The tables are generated so they cannot drift from the defaults and accepted values the
code reads; tests/test_settings.py fails when a committed file differs from this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragspine_pipeline.settings.markdown import (  # noqa: E402
    configuration_markdown,
    with_readme_table,
)

TARGET = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when a file is stale")
    p.add_argument("--out", type=Path, default=TARGET)
    p.add_argument("--readme", type=Path, default=README)
    args = p.parse_args(argv)
    readme = args.readme.read_text(encoding="utf-8") if args.readme.is_file() else ""
    wanted = {args.out: configuration_markdown(), args.readme: with_readme_table(readme)}
    stale = [path for path, text in wanted.items()
             if (path.read_text(encoding="utf-8") if path.is_file() else "") != text]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python tools/gen_config_table.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
