"""Write docs/configuration.md from the settings registry (``--check``: exit 1 if stale).

The table is generated so it cannot drift from the defaults and accepted values the code
reads; tests/test_settings.py fails when the committed file differs from this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragspine_pipeline.settings import configuration_markdown  # noqa: E402

TARGET = ROOT / "docs" / "configuration.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is stale")
    p.add_argument("--out", type=Path, default=TARGET)
    args = p.parse_args(argv)
    text = configuration_markdown()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run python tools/gen_config_table.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
