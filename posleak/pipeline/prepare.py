"""Every check of a command's input before any work: the options against each other, the model's facts and the
output folder, all problems refused at once (one BadInput); then one `PreparedRun`, what `analyze_model` runs: the
model loaded once with its load-time interventions, the sequences, the options and the run folder's fingerprint.

`prepare` is the check of `analyze` (and of each analysis of a batch); `Preparation` holds its steps, so that a
command with more to check (`intervene`: its own runs and the `--bos off` intervention) goes through the same
ones. `prepared_model` is the way in for a model already in memory (the lab's, a test's). Nothing here runs the
model or writes a file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posleak.capture.residual import decoder_layers, skipped_layers
from posleak.data.batches import TokenBatch, load_token_file, make_sequences, shape_problems
from posleak.data.corpus import load_corpus
from posleak.data.nulls import make_null
from posleak.data.recipe import Recipe
from posleak.device import Placement
from posleak.errors import BadInput, PosleakError
from posleak.interventions import Interventions
from posleak.models.facts import attention_chunk
from posleak.models.load import LoadedModel, load_model
from posleak.pipeline.config import AnalysisOptions, AnalyzeConfig
from posleak.store import RunFolder
from posleak.validate import Problems, out_folder_problems


@dataclass(frozen=True)
class PreparedRun:
    """One analysis ready to run (`analyze_model`), its input checked: made by `prepare` (a checkpoint) or
    `prepared_model` (a model in memory)."""

    model: PreTrainedModel  # switched to posleak's attention, with its load-time interventions
    batch: TokenBatch
    options: AnalysisOptions
    model_id: str  # what the run records as its model: a checkpoint's spec, or a name given
    # every option the fingerprint covers: `AnalyzeConfig.identity` (the recipe that made the sequences with the
    # options), or `AnalysisOptions.identity` for sequences made without a recipe
    identity: dict[str, Any]
    tokenizer: PreTrainedTokenizerBase | None = None
    loaded: LoadedModel | None = None  # a checkpoint's provenance (its file hash); None for a model in memory

    @classmethod
    def of(cls, loaded: LoadedModel, batch: TokenBatch, config: AnalyzeConfig) -> PreparedRun:
        """`config`'s analysis of `batch` on the checkpoint `loaded`."""
        return cls(loaded.model, batch, config.analysis, loaded.name, config.identity(), loaded.tokenizer, loaded)

    def fingerprint(self) -> dict[str, Any]:
        """What the run folder records and a resume compares: the model file, the exact tokens, every option."""
        return {
            "model": self.model_id,
            "model_sha256": self.loaded.file_hash if self.loaded is not None else None,
            "tokens_sha256": hashlib.sha256(self.batch.ids.numpy().tobytes()).hexdigest(),
            "config": self.identity,
        }


class Preparation:
    """One command's input being checked: the model and sequences made so far and every problem found."""

    def __init__(self, out: Path | str | None) -> None:
        self.problems = Problems()
        self.loaded: LoadedModel | None = None
        self.batch: TokenBatch | None = None
        if out is not None:
            self.problems.extend(out_folder_problems(out))

    def refuse_placement(self, config: AnalyzeConfig, with_options: bool = True) -> None:
        """No model loads where it cannot run: where the placement is refused, refuse now what was found (and,
        `with_options`, the problems of the options that need no model)."""
        if placement_problems := config.execution.placement.problems():
            self.problems.extend(placement_problems)
            if with_options:
                self.problems.extend(config.problems())
            self.problems.raise_any()

    def load(
        self,
        spec: str,
        trust_remote_code: bool,
        placement: Placement,
        base: LoadedModel | None = None,
        interventions: Interventions | None = None,
    ) -> None:
        """The model `spec` (`base`: already loaded), with the load-time interventions of `interventions`."""
        if base is None:
            base = checked_model(self.problems, spec, trust_remote_code, placement, interventions)
        self.loaded = base

    def make_sequences(self, config: AnalyzeConfig) -> None:
        self.batch = checked_sequences(self.problems, self.loaded, config)

    @property
    def bos_at_0(self) -> bool | None:
        """Whether the sequences start with the BOS (None: they could not be made)."""
        return None if self.batch is None else self.batch.bos_id is not None

    @property
    def ready(self) -> bool:
        """Model and sequences made and no problem found: the run folders can be checked."""
        return self.loaded is not None and self.batch is not None and not self.problems.found

    def check_folders(self, runs: dict[Path, dict[str, Any]]) -> None:
        """Whether each run folder can hold its run (the arguments it would record); call only when `ready`."""
        for path, arguments in runs.items():
            with self.problems.collecting():
                RunFolder(path).state(arguments)

    def done(self) -> tuple[LoadedModel, TokenBatch]:
        """The model and the sequences; BadInput with every problem found, if any."""
        self.problems.raise_any()
        assert self.loaded is not None and self.batch is not None  # no problem found, so both were made
        return self.loaded, self.batch


def prepare(
    spec: str,
    config: AnalyzeConfig,
    out: Path | str | None,
    trust_remote_code: bool = False,
    base: LoadedModel | None = None,
) -> PreparedRun:
    """The run of `analyze`: the model loaded once, with the load-time interventions (`base`: already loaded so),
    and the sequences, once every option has been checked against the others, the model's facts and the output
    folder; BadInput lists every problem. Nothing is run on the model and nothing is written."""
    check = Preparation(out)
    check.refuse_placement(config)
    check.load(spec, trust_remote_code, config.execution.placement, base, config.interventions)
    check.make_sequences(config)
    if check.loaded is not None and check.batch is not None:
        check.problems.extend(token_file_bos_problems(check.loaded, check.batch, config.recipe))
        check.problems.extend(attention_problems(check.loaded, check.batch))
    check.problems.extend(config.interventions.problems(check.loaded, check.bos_at_0))
    if out is not None and check.ready:
        assert check.loaded is not None and check.batch is not None  # `ready`
        check.check_folders({Path(out): PreparedRun.of(check.loaded, check.batch, config).fingerprint()})
    return PreparedRun.of(*check.done(), config)


def prepared_model(
    model: PreTrainedModel,
    batch: TokenBatch,
    options: AnalysisOptions,
    model_id: str,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> PreparedRun:
    """The run of a model already in memory (switched to posleak's attention) on `batch`, once `options` have been
    checked for its shape (any N: with one sequence the noise-corrected magnitudes are NaN, docs/method.md §3)."""
    if problems := options.measure.problems(batch.seq_len, None) + options.execution.problems():
        raise BadInput(problems)
    return PreparedRun(model, batch, options, model_id, options.identity(), tokenizer)


def checked_model(
    problems: Problems,
    spec: str,
    trust_remote_code: bool,
    placement: Placement | None = None,
    interventions: Interventions | None = None,
) -> LoadedModel | None:
    """The model `spec`, with the load-time interventions of `interventions` (RoPE scaling: loaded once, with
    them); None, with the reason in `problems`, if it will not load. Where they cannot apply to it (a bad
    --rope-scaling, a model without plain RoPE), the model as it is, so that every other problem is found beside
    theirs (`Interventions.problems` says what is wrong with them)."""
    interventions = interventions or Interventions()
    with problems.collecting():
        try:
            return load_for(spec, interventions, trust_remote_code, placement=placement)
        except PosleakError:
            if not interventions.at_load():
                raise
        return load_for(spec, Interventions(), trust_remote_code, placement=placement)
    return None


def checked_sequences(problems: Problems, loaded: LoadedModel | None, config: AnalyzeConfig) -> TokenBatch | None:
    """The sequences of `config` for `loaded` (None: it did not load), adding what stops them and every problem
    of the options for their shape to `problems`; None when they cannot be made."""
    recipe = config.recipe
    if recipe.tokens is not None:
        batch = None
        with problems.collecting():
            batch = sequences_for(loaded, recipe) if loaded is not None else load_token_file(recipe.tokens)
        if batch is not None:
            problems.extend(config.problems((batch.seq_len, batch.num_seqs)))
        return batch
    options = config.problems()
    options += shape_problems(recipe.seq_len, None, loaded.facts.max_positions if loaded is not None else None)
    problems.extend(options)
    if loaded is None or options:
        with problems.collecting():
            load_corpus(recipe.corpus)  # the corpus's own problems, at least
        return None
    with problems.collecting():
        return sequences_for(loaded, recipe)
    return None


def attention_problems(loaded: LoadedModel, batch: TokenBatch) -> list[str]:
    """What posleak cannot measure in this model, found before its forward: no attention layer at all (a hybrid
    whose layers are all mamba, convolution or linear attention), or chunked attention whose chunks are shorter
    than the sequences (posleak's masks are causal, sliding and prefix ones)."""
    problems = []
    name, layers = loaded.name, len(decoder_layers(loaded.model))
    skipped = skipped_layers(loaded.model)
    if len(skipped) == layers:
        kinds = ", ".join(sorted({reason.removesuffix(", not attention") for reason in skipped.values()}))
        problems.append(
            f"{name} has no attention layer among its {layers} decoder layers ({kinds}); nothing to measure"
        )
    chunk = attention_chunk(loaded.model.config)
    if chunk is not None and chunk < batch.seq_len:
        problems.append(
            f"{name} uses chunked attention of {chunk} positions, shorter than the sequences ({batch.seq_len}); "
            f"posleak does not build chunked masks, so analyse at most {chunk} positions"
        )
    return problems


def token_file_bos_problems(loaded: LoadedModel, batch: TokenBatch, recipe: Recipe) -> list[str]:
    """A token file is taken verbatim: --bos can only state what its first column holds."""
    bos = loaded.tokenizer.bos_token_id
    if recipe.bos == "on" and batch.bos_id is None:
        has = f"the tokenizer's BOS id {bos}" if bos is not None else "a BOS (the tokenizer has none)"
        return [
            f"--bos on with --tokens: the rows of {batch.source_name} do not all start with {has}; a token file is "
            "taken verbatim, so put the BOS in its first column or drop --bos on"
        ]
    if recipe.bos == "off" and batch.bos_id is not None:
        return [
            f"--bos off with --tokens: every row of {batch.source_name} starts with the BOS id {bos}; a token file "
            "is taken verbatim, so remove that column or drop --bos off"
        ]
    return []


def load_for(
    spec: str,
    interventions: Interventions,
    trust_remote_code: bool = False,
    base: LoadedModel | None = None,
    placement: Placement | None = None,
) -> LoadedModel:
    """The model with the load-time interventions (RoPE scaling) set in its config as it loads, where `placement`
    says; `base`, the model already loaded without them, where there are none (`intervene`'s baseline model)."""
    at_load = bool(interventions.at_load())
    if base is not None and not at_load:
        return base
    overrides = interventions.config_overrides if at_load else None
    return load_model(spec, trust_remote_code=trust_remote_code, config_overrides=overrides, placement=placement)


def sequences_for(loaded: LoadedModel, recipe: Recipe) -> TokenBatch:
    """The sequences of `recipe` for `loaded`: its token file, or sequences drawn from its corpus; their null
    where `recipe.null` names one (the same rows, each row's tokens moved: posleak.data.nulls)."""
    max_len = loaded.facts.max_positions
    if recipe.tokens is not None:
        batch = load_token_file(
            recipe.tokens, vocab_size=loaded.facts.vocab_size, max_len=max_len, bos_id=loaded.tokenizer.bos_token_id
        )
    else:
        batch = make_sequences(
            load_corpus(recipe.corpus),
            loaded.tokenizer,
            recipe.seq_len,
            recipe.num_seqs,
            bos=recipe.bos,
            seed=recipe.seed,
            cross_documents=recipe.cross_documents,
            max_len=max_len,
            part=recipe.part,
            windows_per_document=recipe.windows_per_document,
        )
    return batch if recipe.null is None else make_null(batch, recipe.null, recipe.null_seed)
