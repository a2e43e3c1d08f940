"""`make demo`: train the built-in digits Keras model, compress it with int8_prune30, show the result.

    python -m compressor.demo [--out demo-out] [--recipe int8_prune30]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compressor.demo", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    parser.add_argument("--recipe", default="int8_prune30")
    args = parser.parse_args(argv)

    from compressor.backends.examples import save_keras_digits_cnn
    from compressor.cli import main as compress_main

    args.out.mkdir(parents=True, exist_ok=True)
    model_path = args.out / "digits_cnn.keras"
    if not model_path.exists():
        print(f"training the example digits CNN -> {model_path}", file=sys.stderr)
        save_keras_digits_cnn(model_path)
    command = ["--recipe", args.recipe, str(model_path), "--data", "digits",
               "--out", str(args.out / args.recipe), "--force"]
    print(f"$ compress {' '.join(command)}", file=sys.stderr)
    return compress_main(command)


if __name__ == "__main__":
    sys.exit(main())
