"""`python -m trainprof.analysis PATH`: print `analyze(PATH).to_dict()` as JSON (for the speed benchmark)."""

import sys

from trainprof.analysis import analyze
from trainprof.trace import TraceLoadError


def main(argv: list[str]) -> int:
    """Analyze the path in argv[0] and write the JSON result to stdout."""
    if len(argv) != 1:
        sys.stderr.write("usage: python -m trainprof.analysis PATH\n")
        return 2
    try:
        result = analyze(argv[0]).to_dict()
    except TraceLoadError as error:
        sys.stderr.write(f"trainprof: {error}\n")
        return 1
    try:
        import orjson

        sys.stdout.buffer.write(
            orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        )
    except ImportError:  # pragma: no cover
        import json

        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
