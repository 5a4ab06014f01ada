"""`rlpipe export RUN [--step K | --best] DIR [--lake URI]`: write the policy of a run at a checkpoint
as a Hugging Face model folder (config, safetensors weights, tokenizer) that
`AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load as
is; a LoRA run's folder holds the merged weights. `--best`: the kept checkpoint with the
highest held-out accuracy. workers/policy_export.py does the work.

Exit status: 0 when the folder is written; 2 for bad input (no lake, unknown run, a step
without a checkpoint, DIR existing and not empty, a checkpoint that lost or changed files).

What it does not: load the model (the CLI never imports torch or transformers), or change
the lake.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlpipe.cli.consoles import literal, stderr_console, stdout_console

console = stdout_console()
warnings = stderr_console()


def export(
    run_id: str = typer.Argument(..., help="The run whose policy is exported."),
    directory: Path = typer.Argument(..., help="The folder to write (new or empty)."),
    step: Optional[int] = typer.Option(None, "--step", min=0, help="Checkpoint step (default: the newest intact checkpoint)."),
    best: bool = typer.Option(False, "--best", help="The checkpoint with the highest held-out accuracy (of those evaluated)."),
    config: Optional[Path] = typer.Option(None, "--config", help="Read the lake location from this config."),
    lake: Optional[str] = typer.Option(None, "--lake", help="Lake URI (folder or s3://bucket/prefix); default: from --config, else ./rlpipe-lake."),
) -> None:
    """Write a run's policy at a checkpoint as a Hugging Face model folder (merged for a LoRA run)."""
    from rlpipe.cli.lake import config_for_lake, open_lake
    from rlpipe.workers.policy_export import export_policy

    if best and step is not None:
        from rlpipe.core.errors import UserError

        raise UserError("--best and --step both choose the checkpoint", "pass one of them")
    exported = export_policy(open_lake(config_for_lake(config, lake)), run_id, directory, step, best)
    for line in exported.passed_over:
        warnings.print(f"[yellow]warning:[/] {literal(line)}", soft_wrap=True)
    console.print(f"exported run {literal(exported.run_id)} at step {exported.step} from {literal(exported.lake_uri)}", soft_wrap=True)
    console.print(f"to {literal(str(exported.folder))}  ({len(exported.files)} files, {exported.size_bytes / 1e6:.1f} MB)", soft_wrap=True)
    console.print(f"load it: AutoModelForCausalLM.from_pretrained({literal(repr(str(exported.folder)))}) "
                  "and AutoTokenizer.from_pretrained(the same folder)", soft_wrap=True)
