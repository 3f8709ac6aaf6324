"""Convert Qwen2.5-VL weights between Hugging Face directories and Flax params checkpoints.

  pyvision-convert hf2flax --src HF_DIR --dst DIR   # orbax params + config.json
  pyvision-convert flax2hf --src DIR --dst HF_DIR   # safetensors shards + index + config.json
  pyvision-convert flax2hf --src WORKDIR --dst HF_DIR --dtype bfloat16   # a training run

Tokenizer and other side files of the HF directory travel along (DIR/hf_files/) so that the
exported directory is complete for transformers and vLLM. A training checkpoint (a GRPO or
SFT workdir, its checkpoints/ directory or one step directory) exports the params of its
newest readable step, with config.json, tokenizer, chat template, generation and processor
configs of the model the run started from (model.hf_dir in WORKDIR/config.json).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pyvision_jax.convert import (
    CheckpointMismatchError,
    hf_side_files,
    load_hf,
    load_params,
    save_hf,
    save_params,
    side_files,
)
from pyvision_jax.eval.policy import detect_checkpoint_kind
from pyvision_jax.wiring.export import export_training_checkpoint

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _byte_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 5GB, 500MiB, 1000000)")
    return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dtype",
        choices=["bfloat16", "float32", "float16"],
        default=None,
        help="cast every tensor to this dtype (default: keep the stored dtypes)",
    )
    common.add_argument("--overwrite", action="store_true", help="replace --dst if it already exists")
    common.add_argument("--quiet", action="store_true", help="no progress bar")

    to_flax = commands.add_parser(
        "hf2flax", parents=[common], help="HF safetensors directory -> Flax params checkpoint"
    )
    to_flax.add_argument("--src", required=True, help="HF directory: config.json + model*.safetensors (+ index)")
    to_flax.add_argument("--dst", required=True, help="output directory: params/ (orbax) + config.json")

    to_hf = commands.add_parser("flax2hf", parents=[common], help="Flax params checkpoint -> HF safetensors directory")
    to_hf.add_argument(
        "--src",
        required=True,
        help="params checkpoint (written by hf2flax) or training checkpoint (a workdir, its checkpoints/ or one step)",
    )
    to_hf.add_argument("--dst", required=True, help="output HF directory")
    to_hf.add_argument(
        "--max-shard-size",
        type=_byte_size,
        default="5GB",
        help="largest safetensors shard, e.g. 5GB, 500MiB (default 5GB)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not Path(args.src).is_dir():
        print(f"convert {args.command}: error: {args.src}: no such directory", file=sys.stderr)
        return 2
    if Path(args.dst).exists() and not args.overwrite:
        print(
            f"convert {args.command}: error: {args.dst} already exists (pass --overwrite to replace it)",
            file=sys.stderr,
        )
        return 2

    try:
        if args.command == "hf2flax":
            config, params = load_hf(args.src, dtype=args.dtype, progress=not args.quiet)
            out = save_params(config, params, args.dst, extra_files=side_files(args.src), overwrite=args.overwrite)
        elif detect_checkpoint_kind(args.src) == "train":
            export = export_training_checkpoint(
                args.src,
                args.dst,
                dtype=args.dtype,
                max_shard_bytes=args.max_shard_size,
                overwrite=args.overwrite,
                progress=not args.quiet,
            )
            print(f"wrote {export.out_dir} (step {export.step} of {export.step_dir.parent})")
            return 0
        else:
            config, params = load_params(args.src, dtype=args.dtype)
            out = save_hf(
                config,
                params,
                args.dst,
                max_shard_bytes=args.max_shard_size,
                extra_files=hf_side_files(args.src),
                overwrite=args.overwrite,
                progress=not args.quiet,
            )
    except (CheckpointMismatchError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"convert {args.command}: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def run() -> None:
    """The `pyvision-convert` console command."""
    sys.exit(main())
