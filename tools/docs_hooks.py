"""MkDocs hook (``mkdocs.yml`` ``hooks:``): the matrix reference, generated from the pydantic schema at build time.

``docs/matrix.md`` holds the marker ``<!-- matrix-reference -->``; at build time it is replaced by one table
per block of the matrix file (top level, ``base``, each ``design`` type, ``exclude[]``, ``expect[]``,
``tune`` and its parts) with every key, its type, its allowed range, its default and what it means, read
from the models in :mod:`bench.spec.matrix`, :mod:`bench.spec.expect` and :mod:`bench.tune.space`. A key
added to the schema therefore appears in the reference with the next build; ``tests/test_docs.py``
compares the keys of the schema with those of the built page.

``python tools/docs_hooks.py`` prints the generated Markdown.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's bench, also from mkdocs

from pydantic import BaseModel  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

MARKER = "<!-- matrix-reference -->"
#: the marker of ``docs/commands.md`` that the reference of every subcommand and option replaces
COMMANDS_MARKER = "<!-- command-reference -->"

#: what each key means, where the model's docstring does not say it per key (keys missing here get "-")
MEANING = {
    "name": "experiment name: results/<name>/ and the MLflow experiment",
    "engine": "engine that runs a cell (the registry of engines)",
    "platform": "where runs execute; `auto` picks npu, cuda or cpu from what is present",
    "base": "run settings shared by every cell (verl's names)",
    "factors": "factor -> levels; any of the seven optimizations; a bare list of keys takes the default levels",
    "design": "how factors become cells (one of the design tables below)",
    "repeats": "runs per cell; block k holds repeat k of every cell",
    "exclude": "rules that drop matching cells, with the reason shown in the dry run",
    "tune": "Optuna search of the dynamic-bsz token limits (`run_bench.py tune`)",
    "expect": "claims about a factor's effect, checked by the gate",
    "description": "free text, shown in MLflow",
    "model": "model path or `builtin:...` (verl `actor_rollout_ref.model.path`); `${VAR}` expands",
    "data": "training parquet or `builtin:...` (verl `data.train_files`)",
    "val_data": "validation parquet (verl `data.val_files`; default: `data`)",
    "steps": "GRPO steps per run (`trainer.total_training_steps`)",
    "warmup_steps": "first steps excluded from the statistics",
    "profile_steps": "steps run under the profiler (give the Free ratio); `null`: the last step; `[]`: none",
    "train_batch_size": "prompts per step (`data.train_batch_size`)",
    "ppo_mini_batch_size": "prompts per PPO mini-batch",
    "micro_batch_size_per_gpu": "sequences per micro-batch of the actor update (fixed-size batching)",
    "log_prob_micro_batch_size_per_gpu": "sequences per micro-batch of the log-prob passes",
    "max_prompt_length": "P, tokens",
    "max_response_length": "R, tokens",
    "ppo_max_token_len": "token budget per GPU of the actor update with dynamic bsz (default 2*(P+R))",
    "log_prob_max_token_len": "token budget per GPU of the log-prob passes with dynamic bsz (default 4*(P+R))",
    "n": "samples per prompt (GRPO group size)",
    "temperature": "rollout sampling temperature",
    "use_kl_loss": "KL loss against the reference model",
    "seed": "data and sampling seed",
    "timeout_s": "seconds a run may take before it is ended and recorded as timed out",
    "rollout_tp": "vLLM tensor-parallel size of the rollout",
    "n_gpus_per_node": "devices per node (`trainer.n_gpus_per_node`)",
    "nnodes": "nodes (`trainer.nnodes`)",
    "gpu_memory_utilization": "vLLM's share of device memory",
    "overrides": "extra Hydra overrides passed to every verl run",
    "env": "extra environment variables of every run; `${VAR}` expands",
    "embedded": "extra keys of the embedded engine's run config",
    "type": "the design (or sampler) type",
    "reference": "reference cell: `baseline` = all factors off, `all_on` = all on",
    "resolution": "resolution of the two-level fractional design (pyDOE3)",
    "generators": "explicit generators of the fraction instead of a resolution (pyDOE3 syntax)",
    "cells": "the cells, each a mapping factor -> level; factors a cell omits stay at their first level",
    "when": "factor -> level; a cell matching all of them is dropped",
    "reason": "why (shown in the dry run and the plan)",
    "factor": "a factor key, or `all` (the all-on cell)",
    "level": "the factor's level (default: its last level in the matrix)",
    "metric": "what the claim is about",
    "at_least": "smallest improvement, as a fraction (0.10 = 10 %)",
    "at_most": "largest improvement, as a fraction",
    "vs": "reference: `all_off` (this factor alone changed) or `all_on` (all on against this factor off)",
    "fixed": "factor levels fixed during the search (dynamic_bsz is on)",
    "space": "searched limits: `ppo_max_token_len_per_gpu` and/or `log_prob_max_token_len_per_gpu`",
    "objective": "minimize step time or maximize throughput",
    "n_trials": "trials to run (with `timeout_s`: whichever comes first)",
    "sampler": "Optuna sampler (a string is its type)",
    "start_at_rule_of_thumb": "first trial at the article's 2*(P+R) / 4*(P+R)",
    "normalize": "speed-normalized objective on the embedded engine (machine-speed probe)",
    "study": "Optuna study name (the same name resumes)",
    "storage": "Optuna storage URL (default `sqlite:///results/optuna.db`)",
    "low": "lower bound, in `unit`",
    "high": "upper bound, in `unit`",
    "unit": "`tokens` or `seq` (multiples of P+R)",
    "log": "search on a log scale",
    "step": "grid step, in `unit`",
    "n_startup_trials": "random trials before TPE models the objective",
    "multivariate": "multivariate TPE",
}


def _type(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:  # StrictInt and the like: the type a user writes
        return _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        text = " \\| ".join(_type(a) for a in parts)
        return text + (" \\| null" if len(parts) < len(args) else "")
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann.__name__
    if ann is typing.Any:
        return "any"
    return getattr(ann, "__name__", str(ann))


def _range(field: Any) -> str:
    parts = []
    for m in field.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "length >="),
                           ("max_length", "length <="), ("pattern", "matches")):
            v = getattr(m, attr, None)
            if v is not None:
                parts.append(f"{sign} `{v}`" if attr == "pattern" else f"{sign} {v:,}" if isinstance(v, int)
                             else f"{sign} {v}")
    return ", ".join(parts) or "-"


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "-"
    if isinstance(value, BaseModel):
        return "each key at its default (its table)"
    return f"`{json.dumps(value, separators=(', ', ': '))}`"


def _special(model: type[BaseModel], key: str) -> tuple[str | None, str | None]:
    """(type, range) of keys whose pydantic annotation is looser than what the validators accept."""
    from bench.core.engine_registry import engine_names
    from bench.spec.optimizations import FACTOR_KEYS

    factors = ", ".join(f"`{k}`" for k in FACTOR_KEYS)
    table = {
        ("Matrix", "engine"): (None, "one of " + ", ".join(f"`{n}`" for n in engine_names())),
        ("Matrix", "factors"): ("dict[factor, list[level]]", f"keys: {factors}, `stack`; levels: see Factors "
                                "(`stack`: names under `stacks`)"),
        ("Matrix", "stacks"): ("dict[name, stack]", "see stacks.&lt;name&gt;"),
        ("Matrix", "tune"): ("tune block \\| null", "see tune"),
        ("Matrix", "expect"): ("list[expect item]", "see expect[]"),
        ("ExplicitDesign", "cells"): ("list[dict[factor, level]]", "length >= 1; keys and levels as in Factors"),
        ("Exclude", "when"): ("dict[factor, level]", "keys and levels as in Factors"),
        ("Expect", "factor"): (None, f"`all` or {factors}"),
        ("TuneBlock", "fixed"): ("dict[factor, level]", "keys and levels as in Factors; dynamic_bsz on"),
        ("TuneBlock", "space"): ("dict[limit, Dimension]", "length >= 1; `ppo_max_token_len_per_gpu`, "
                                 "`log_prob_max_token_len_per_gpu`"),
    }
    return table.get((model.__name__, key), (None, None))


#: what the validators add to a key's range (``Base._check``, ``check_batch_sizes`` in bench/spec/matrix.py)
RULES = {
    ("Base", "warmup_steps"): "below `steps`",
    ("Base", "profile_steps"): "each in 1..`steps`, none twice; at least one step after the warm-up left unprofiled",
    ("Base", "ppo_mini_batch_size"): "divides `train_batch_size`; `ppo_mini_batch_size * n` a multiple of "
                                     "`n_gpus_per_node * nnodes`",
    ("Base", "train_batch_size"): "`train_batch_size * n` a multiple of `n_gpus_per_node * nnodes`",
    ("Base", "micro_batch_size_per_gpu"): "divides `ppo_mini_batch_size * n / (n_gpus_per_node * nnodes)`",
    ("Base", "ppo_max_token_len"): "at least `max_prompt_length + max_response_length`",
    ("Base", "log_prob_max_token_len"): "at least `max_prompt_length + max_response_length`",
}


def factors_markdown() -> str:
    """The seven factors as a table: key, title, article section, where it acts, levels, default levels."""
    from bench.spec.optimizations import REGISTRY

    out = ["### Factors", "", "Keys of `factors:` (and of `exclude[].when`, `design.cells`, `tune.fixed`). A level "
           "is an integer of the factor's levels; `off`/`on` (and `false`/`true`) mean 0/1.", "",
           "| factor | what | article | acts on | levels | default levels |", "|---|---|---|---|---|---|"]
    for key, opt in REGISTRY.items():
        out.append(f"| `{key}` | {opt.title} | {opt.section} | {opt.acts} | {', '.join(map(str, opt.levels))} | "
                   f"{', '.join(map(str, opt.default_levels))} |")
    return "\n".join(out + [""])


def sections() -> list[tuple[str, str, type[BaseModel]]]:
    """(heading, where in the file, model) of every block of a matrix file, top level first."""
    from bench.spec.expect import Expect
    from bench.spec.matrix import Base, Exclude, ExplicitDesign, FractionalDesign, FullDesign, Matrix, OneAtATimeDesign
    from bench.spec.stack import Stack, StackPath
    from bench.tune.space import Dimension, SamplerSpec, TuneBlock

    return [
        ("Top level", "the matrix file", Matrix),
        ("base", "`base:`", Base),
        ("design: full", "`design: full` (or `{type: full}`)", FullDesign),
        ("design: one_at_a_time", "`design: {type: one_at_a_time, ...}`", OneAtATimeDesign),
        ("design: fractional", "`design: {type: fractional, ...}`", FractionalDesign),
        ("design: explicit", "`design: {type: explicit, ...}`", ExplicitDesign),
        ("exclude[]", "each item of `exclude:`", Exclude),
        ("expect[]", "each item of `expect:`", Expect),
        ("tune", "`tune:`", TuneBlock),
        ("tune.space.&lt;limit&gt;", "each limit under `tune.space`", Dimension),
        ("tune.sampler", "`tune.sampler:`", SamplerSpec),
        ("stacks.&lt;name&gt;", "each stack under `stacks:` ([stacks](stacks.md))", Stack),
        ("stacks.&lt;name&gt;.paths[]", "each item of a stack's `paths` (a bare string is `{path: ...}`)", StackPath),
    ]


def public_fields(model: type[BaseModel]) -> dict[str, Any]:
    """The keys a user writes: the model's fields without the ones excluded from dumps (set by the loader)."""
    return {k: f for k, f in model.model_fields.items() if not f.exclude}


def reference_markdown() -> str:
    """The reference as Markdown: one table per block, every key with type, range, default and meaning."""
    out = []
    for title, where, model in sections():
        out += [f"### {title}", "", f"{where}. {' '.join((model.__doc__ or '').split())}", "",
                "| key | type | range | default | meaning |", "|---|---|---|---|---|"]
        for key, field in public_fields(model).items():
            meaning = field.description or MEANING.get(key, "-")
            typ, rng = _special(model, key)
            rule = RULES.get((model.__name__, key))
            rng = "; ".join(x for x in (rng or _range(field), rule) if x and x != "-") or "-"
            out.append(f"| `{key}` | {typ or _type(field.annotation)} | {rng} | {_default(field)} "
                       f"| {meaning} |")
        out.append("")
    return "\n".join(out) + "\n" + factors_markdown()


def _cell(text: str) -> str:
    """Text for a Markdown table cell: ``|`` escaped, ``<...>`` shown as text."""
    text = html.escape(" ".join(text.split()), quote=False)
    return "".join("\\" + c if c in "|*[]_" else c for c in text)


def subcommand_parsers() -> dict[str, tuple[str, argparse.ArgumentParser]]:
    """``{name: (help, parser)}`` of every subcommand of ``run_bench.py`` (:func:`bench.cli.build_parser`)."""
    from bench.cli import build_parser

    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    return {name: (helps.get(name, ""), p) for name, p in sub.choices.items()}


def commands_markdown() -> str:
    """Every subcommand with its usage and a table of its arguments and options (flags, value, meaning), read
    from the argparse parsers the CLI itself builds."""
    out = []
    for name, (text, p) in subcommand_parsers().items():
        fmt = p._get_formatter()
        usage = p.format_usage().strip().removeprefix("usage: ").splitlines()
        out += [f"### {name}", "", f"{text[:1].upper()}{text[1:]}.", "", "```", usage[0],
                *(ln[len("usage: "):] for ln in usage[1:]), "```", "",
                "| argument | value | meaning |", "|---|---|---|"]
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            flags = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}` (positional)"
            value = ("" if a.nargs == 0 or (not a.option_strings and a.nargs is None) else
                     "zero or more" if not a.option_strings and a.nargs == "*" else fmt._format_args(a, a.dest.upper()))
            out.append(f"| {flags} | {_cell(value)} | {_cell(fmt._expand_help(a) if a.help else '-')} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: put the generated references where ``docs/matrix.md`` and ``docs/commands.md`` have
    their markers."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference_markdown())
    if COMMANDS_MARKER in markdown:
        markdown = markdown.replace(COMMANDS_MARKER, commands_markdown())
    return markdown


if __name__ == "__main__":  # python tools/docs_hooks.py [commands]
    print(commands_markdown() if sys.argv[1:] == ["commands"] else reference_markdown())
