"""`make demo`: both routes of `compress`, end to end, on models trained here.

1. digits: train the built-in digits Keras CNN, compress it with int8_prune30.
2. lm: train a tiny Llama on the built-in English corpus (a Hugging Face folder), `compress plan`
   it for a Jetson Orin NX 8 GB, compress it with int4, generate text with the int4 artifact
   (compressor.demo_lm).

    python -m compressor.demo [--route all|digits|lm] [--out demo-out] [--recipe int8_prune30]

Trained models are kept in --out and reused. Exits with the first failing stage's code (0: every
stage passed).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROUTES = ("all", "digits", "lm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compressor.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--route", choices=ROUTES, default="all",
                        help="digits (Keras CNN), lm (tiny language model) or all [default: all]")
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    parser.add_argument("--recipe", default="int8_prune30", help="the digits route's recipe "
                                                                 "[default: int8_prune30]")
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    if args.route in ("all", "digits"):
        code = digits(args.out, args.recipe)
        if code != 0:
            return code
    if args.route in ("all", "lm"):
        from compressor import demo_lm

        if args.route == "all":
            print("\n=== language-model route ===", file=sys.stderr)
        return demo_lm.run(args.out)
    return 0


def digits(out: Path, recipe: str) -> int:
    """The digits route: train (or reuse) the example CNN, compress it with `recipe`."""
    from compressor.backends.examples import save_keras_digits_cnn
    from compressor.cli import main as compress_main

    model_path = out / "digits_cnn.keras"
    if not model_path.exists():
        print(f"training the example digits CNN -> {model_path}", file=sys.stderr)
        save_keras_digits_cnn(model_path)
    command = ["--recipe", recipe, str(model_path), "--data", "digits",
               "--out", str(out / recipe), "--force"]
    print(f"$ compress {' '.join(command)}", file=sys.stderr)
    return compress_main(command)


if __name__ == "__main__":
    sys.exit(main())
