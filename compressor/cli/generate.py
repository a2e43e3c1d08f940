"""`compress generate ARTIFACT --prompt TEXT [--max-new-tokens N] [--chat] [--threads N]`: text
out of an LLM artifact in its own runtime, streamed as the tokens come, then one line with the
decode speed (on stderr, so the text can be piped).

The tokenizer is the artifact's own (the folder's tokenizer.json, or the files an LM .tflite
stores), read with the `tokenizers` library; --chat renders its chat template with jinja2 as
transformers does. Neither imports torch.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from compressor.cli.guard import Parser
from compressor.errors import DataError, ModelLoadError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
DEFAULT_NEW_TOKENS = 128


def generate(argv: list[str]) -> int:
    parser = Parser(prog="compress generate",
                    description="generate text with an LLM artifact in its runtime")
    parser.add_argument("artifact", type=Path, help="the model-onnx folder or an LM .tflite")
    parser.add_argument("--prompt", required=True, help="the text to continue (or the user "
                                                        "message, with --chat)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_NEW_TOKENS,
                        help=f"at most this many new tokens [default: {DEFAULT_NEW_TOKENS}]")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the tokenizer's chat template")
    parser.add_argument("--threads", type=int, help="runtime threads [default: all cores]")
    parser.add_argument("--master", help="a split folder (compress split) over boards: HOST:PORT "
                        "this rank 0 listens on for `compress stage` [default: all stages here]")
    args = parser.parse_args(argv)
    if not args.prompt.strip():
        raise DataError("--prompt is empty; give the text to continue, e.g. --prompt \"Once upon\"")
    if args.max_new_tokens < 1:
        raise DataError(f"--max-new-tokens {args.max_new_tokens}: give at least 1")
    if not args.artifact.exists():
        raise ModelLoadError(f"{args.artifact} does not exist; give the model-onnx folder or "
                             "the .tflite file a compress run wrote")
    runtime = _open_runtime(args)
    try:
        return _generate(args, runtime)
    finally:
        getattr(runtime, "close", lambda: None)()


def _open_runtime(args):
    """The artifact's LM runtime; a split folder's (split.json) runs its stages over gloo."""
    if (args.artifact / "split.json").is_file():
        from compressor.runtimes.split_lm import SplitLm

        return SplitLm(args.artifact, threads=args.threads, master=args.master)
    from compressor.runtimes.lm import open_lm_runtime

    return open_lm_runtime(args.artifact, threads=args.threads)


def _generate(args, runtime) -> int:
    tokenizer, settings = _tokenizer(runtime, args.artifact)
    text = _chat_prompt(args.prompt, settings) if args.chat else args.prompt
    ids = tokenizer.encode(text, add_special_tokens=not args.chat).ids
    if len(ids) >= runtime.context:
        raise DataError(f"the prompt is {len(ids)} tokens, but {args.artifact.name}'s context is "
                        f"{runtime.context}; shorten it (or export with a longer --context)")
    stops = _stop_ids(runtime, tokenizer, settings)
    stream = _Stream(tokenizer)
    start = time.perf_counter()
    out = runtime.generate(ids, args.max_new_tokens, on_token=stream.add, stop_ids=stops)
    end = time.perf_counter()
    stream.finish()
    # decode speed: the tokens after the first over the time after the first (the prefill)
    decoding = end - stream.first_at
    rate = (len(out) - 1) / decoding if len(out) > 1 and decoding > 0 else len(out) / (end - start)
    print(f"{len(out)} tokens, {rate:.1f} tokens/s ({runtime.name}, {runtime.threads} "
          f"thread{'s' if runtime.threads != 1 else ''}; prompt {len(ids)} tokens, first token "
          f"after {(stream.first_at - start) * 1000:.0f} ms)", file=sys.stderr)
    return 0


class _Stream:
    """Print the text of the tokens so far as each arrives: decode them all and print what is
    new (a byte-level BPE token can end inside a UTF-8 character: wait for the rest)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.printed, self.first_at = tokenizer, [], "", 0.0

    def add(self, token: int) -> None:
        if not self.ids:
            self.first_at = time.perf_counter()
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[len(self.printed):] if text.startswith(self.printed) else text)
        sys.stdout.flush()
        self.printed = text

    def finish(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        sys.stdout.write((text[len(self.printed):] if text.startswith(self.printed) else "") + "\n")
        sys.stdout.flush()


def _tokenizer(runtime, artifact: Path):
    """(tokenizers.Tokenizer, tokenizer_config dict with the chat template) of the artifact."""
    from tokenizers import Tokenizer

    files = _tokenizer_files(runtime, artifact)
    if "tokenizer.json" not in files:
        raise ModelLoadError(f"{artifact} has no tokenizer.json, so its tokens cannot be turned "
                             "into text; export the model again (compress writes the tokenizer "
                             "files with the artifact)")
    try:
        tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
        settings = json.loads(files.get("tokenizer_config.json", b"{}").decode("utf-8"))
    except Exception as exc:   # tokenizers raises plain Exception on malformed JSON
        raise ModelLoadError(f"{artifact}: its tokenizer files do not load ({exc}); export the "
                             "model again") from None
    if "chat_template.jinja" in files:
        settings["chat_template"] = files["chat_template.jinja"].decode("utf-8")
    return tokenizer, settings


def _tokenizer_files(runtime, artifact: Path) -> dict[str, bytes]:
    if artifact.is_dir():
        return {name: (artifact / name).read_bytes() for name in TOKENIZER_FILES
                if (artifact / name).is_file()}
    return dict(getattr(runtime, "tokenizer_files", dict)())


def _token_text(settings: dict, key: str) -> str:
    value = settings.get(key) or ""
    return value.get("content", "") if isinstance(value, dict) else str(value)


def _chat_prompt(prompt: str, settings: dict) -> str:
    """The prompt as one user turn of the tokenizer's chat template, ready for the reply."""
    template = settings.get("chat_template")
    if isinstance(template, list):   # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not template:
        raise DataError("this artifact's tokenizer has no chat template; drop --chat")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str):
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=[{"role": "user", "content": prompt}], add_generation_prompt=True,
            bos_token=_token_text(settings, "bos_token"), eos_token=_token_text(settings, "eos_token"))
    except jinja2.TemplateError as exc:
        raise DataError(f"the artifact's chat template fails on this prompt ({exc}); drop --chat") from None


def _stop_ids(runtime, tokenizer, settings: dict) -> tuple[int, ...]:
    """End-of-sequence ids: the runtime's (genai_config.json) and the tokenizer's eos token."""
    stops = set(getattr(runtime, "eos_ids", ()) or ())
    eos = tokenizer.token_to_id(_token_text(settings, "eos_token")) if _token_text(settings, "eos_token") else None
    if eos is not None:
        stops.add(int(eos))
    return tuple(sorted(stops))
