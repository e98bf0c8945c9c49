"""``python -m loopwarden.generate`` (``make schemas``): write every generated file; ``snapshot`` / ``check``: a
release's contracts (``make release-snapshot``, ``docs/upgrades.md``)."""

from __future__ import annotations

import sys

from loopwarden.generate import ROOT, asyncapi, auth_conf, compat, files, messages, records


def main(argv: list[str]) -> int:
    if argv:
        return compat.command(argv)
    for generator in (messages, asyncapi, auth_conf, files, records):
        written = generator.write()
        print(
            f"wrote {len(written)} file(s): {', '.join(str(p.relative_to(ROOT)) for p in written[:3])}"
            + (", ..." if len(written) > 3 else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
