"""Which model plays each role of `posleak paper`, and every check of that choice before any work.

The models come from `--models ROLE=MODEL,...` and from a plan file (`--plan PLAN.yaml`, read with the
project's one spec-file reader); `--models` wins over the file, and both over the built-in set (plan.ROLES).
A plan file holds two sections, both optional:

    roles:                                  # per role: the model, or the model and its T and N per sample
      standard: {model: /ckpt/Llama-3.1-8B, seq_len: 2048, num_seqs: 8}
      sliding: /ckpt/Mistral-7B-v0.1        # the plan's T and N for the role
    base:                                   # the plan's other sizes (`file_keys`: the plan's, its lab's, the claims')
      ntk_factors: [4, 16]
      bootstrap: 200
      corpora: [stdlib, bible-web]          # every claim judged on each (`--corpus` wins over it)

The "bos" role (C5: whose BOS embedding is replaced) follows the "sliding" model unless named itself: the
built-in set gives both to gemma3-270m, C5's replacements being measured on the sliding-window model at the
standard T (its early queries never reach the window), so naming `sliding=X` moves C5 to X as well.

The checks read each model's config and tokenizer only (`RoleFacts`), never its weights, so that a wrong
assignment is refused in seconds, one line per problem: an unknown role, a malformed entry, a model that does
not exist or will not load, a sliding model without a window shorter than its T, a model whose maximum
positions are shorter than its T, a model of a BOS-needing claim (C5, C6) whose tokenizer has no BOS.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posleak.errors import PosleakError
from posleak.experiments.paper.plan import ROLE_NAMES, Plan, RoleName, role_for
from posleak.experiments.paper.reproduction import analysis_config
from posleak.experiments.paper.requests import LongerT
from posleak.measure.bootstrap import MIN_BOOTSTRAP_UNITS
from posleak.models.builtin import ZOO
from posleak.models.facts import ModelFacts
from posleak.models.load import load_error, model_files
from posleak.store.specfile import SpecFormat
from posleak.validate import Problems

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SIZE_KEYS = ("seq_len", "num_seqs")
# The kinds of value a file's `base` key takes, from the type of the field it sets: a whole number ≥ 1, true or
# false, a name (a non-empty string), or a non-empty list of numbers > 0, whole numbers ≥ 0 or corpus names.
KINDS: dict[str, str] = {
    "int": "a whole number ≥ 1",
    "int | None": "a whole number ≥ 1",
    "bool": "true or false",
    "str": "a name",
    "tuple[float, ...]": "a non-empty list of numbers > 0",
    "tuple[int, ...]": "a non-empty list of whole numbers ≥ 0",
    "tuple[str, ...]": "a non-empty list of corpus names (stdlib, bible-web, a file, ...)",
}
LISTS = {"tuple[float, ...]": float, "tuple[int, ...]": int, "tuple[str, ...]": str}


def _parts(plan: Plan) -> list[Any]:
    """The parts of `plan` a file's `base` sets keys of: the plan, its lab budget and each claim's options."""
    return [plan, plan.lab, *plan.options]


def file_keys(plan: Plan) -> dict[str, tuple[int, str, str]]:
    """Each key a plan file's `base` may set in `plan`: the index of its part (`_parts`), the field it sets there,
    and the field's type (a key of KINDS), as each part's class names them (`file_keys`)."""
    keys = {}
    for index, part in enumerate(_parts(plan)):
        types = {f.name: str(f.type) for f in dataclasses.fields(part)}
        keys |= {key: (index, name, types[name]) for key, name in type(part).file_keys.items()}
    return keys


def _plan_format(plan: Plan) -> SpecFormat:
    """The plan file format whose `base` takes the keys of `plan` (`file_keys`)."""
    keys = sorted(file_keys(plan))
    return SpecFormat(
        kind="paper plan",
        short="plan",
        owner="paper plan",
        module="posleak/experiments/paper/models.py",
        sections=("roles", "base"),
        options=frozenset(keys),
        options_hint=f"use {', '.join(keys)}",
    )


def _with_base(plan: Plan, base: Mapping[str, Any]) -> Plan:
    """`plan` with each key of `base` set in its part (`file_keys`)."""
    keys, parts = file_keys(plan), _parts(plan)
    for key, value in base.items():
        index, name, _ = keys[key]
        parts[index] = dataclasses.replace(parts[index], **{name: value})
    return dataclasses.replace(parts[0], lab=parts[1], options=tuple(parts[2:]))


def paper_plan(
    start: Plan,
    models: str | None = None,
    plan_file: str | Path | None = None,
    corpora: Sequence[str] | None = None,
) -> tuple[Plan, list[str]]:
    """`start` with the models (and sizes) of `plan_file` and `models` (ROLE=MODEL,...), and the `corpora`
    (`--corpus`, winning over the file's), and every problem of those texts, one line each (an entry with a
    problem is left out of the plan). Reads no model and no corpus (`reproduction_problems` reads them)."""
    problems = Problems()
    chosen: dict[RoleName, str] = {}
    sizes: dict[RoleName, tuple[int, int]] = {}
    base: dict[str, Any] = {}
    if plan_file is not None:
        with problems.collecting():
            chosen, sizes, base = _read_plan_file(Path(plan_file), start, problems)
    if models is not None:
        chosen |= _parse_models(models, problems)
    if "sliding" in chosen and "bos" not in chosen:
        chosen["bos"] = chosen["sliding"]  # the BOS role follows the sliding model (module docstring)
    roles = {role: role_for(role, chosen[role]) if role in chosen else start.roles[role] for role in ROLE_NAMES}
    if corpora:
        base["corpora"] = tuple(corpora)
    plan = dataclasses.replace(_with_base(start, base), roles=roles, sizes={**start.sizes, **sizes})
    return plan, problems.found


def _parse_models(text: str, problems: Problems) -> dict[RoleName, str]:
    """`--models ROLE=MODEL,...`: the model of each role named."""
    chosen: dict[RoleName, str] = {}
    for entry in text.split(","):
        role, sep, model = (part.strip() for part in entry.partition("="))
        if not sep or not role or not model:
            problems.add(f"--models: {entry.strip()!r} is not ROLE=MODEL (roles: {', '.join(ROLE_NAMES)})")
        elif role not in ROLE_NAMES:
            problems.add(f"--models: unknown role {role!r}; the roles are {', '.join(ROLE_NAMES)}")
        elif role in chosen:
            problems.add(f"--models: role {role!r} is named twice; give each role one model")
        else:
            chosen[role] = model
    return chosen


def _read_plan_file(
    path: Path, start: Plan, problems: Problems
) -> tuple[dict[RoleName, str], dict[RoleName, tuple[int, int]], dict[str, Any]]:
    """A plan file's models, per-role sizes and other sizes; its problems in `problems` (a file that is not a
    plan file raises)."""
    spec_format = _plan_format(start)
    raw = spec_format.read(path)
    spec_format.check_sections(raw)
    roles, base = raw.get("roles") or {}, raw.get("base") or {}
    if not isinstance(roles, dict):
        raise PosleakError(f"paper plan '{path}': roles must map each role to a model or {{model, seq_len, num_seqs}}")
    if not isinstance(base, dict):
        raise PosleakError(f"paper plan '{path}': base must map Plan fields to values (ntk_factors: [4, 16], ...)")
    base, _ = spec_format.base_and_grid({"base": base})
    chosen: dict[RoleName, str] = {}
    sizes: dict[RoleName, tuple[int, int]] = {}
    for role, entry in roles.items():
        if role not in ROLE_NAMES:
            problems.add(f"paper plan '{path}': unknown role {role!r}; the roles are {', '.join(ROLE_NAMES)}")
            continue
        entry = {"model": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or set(entry) - {"model", *SIZE_KEYS}:
            problems.add(f"paper plan '{path}': role {role!r} must be a model or a mapping of model, seq_len, num_seqs")
            continue
        if "model" in entry:
            chosen[role] = str(entry["model"])
        if set(SIZE_KEYS) & set(entry):
            seq_len, num_seqs = start.size(role)
            size = (entry.get("seq_len", seq_len), entry.get("num_seqs", num_seqs))
            if all(_is_count(v) for v in size):
                sizes[role] = size
            else:
                problems.add(f"paper plan '{path}': role {role!r}: seq_len and num_seqs must be whole numbers ≥ 1")
    return chosen, sizes, _checked_base(path, base, start, problems)


def _checked_base(path: Path, base: dict[str, Any], start: Plan, problems: Problems) -> dict[str, Any]:
    """The `base` options of a plan file with values of their kind (lists become tuples); the others refused."""
    values: dict[str, Any] = {}
    keys = file_keys(start)
    for key, value in base.items():
        kind = keys[key][2]
        if kind in LISTS:
            item = LISTS[kind]
            ok = isinstance(value, list) and bool(value) and all(_is_item(v, item) for v in value)
            value = tuple(item(v) for v in value) if ok else value
        elif kind == "str":
            ok = isinstance(value, str) and bool(value)
        elif kind == "bool":
            ok = isinstance(value, bool)
        else:
            ok = _is_count(value)
        if ok:
            values[key] = value
        else:
            problems.add(f"paper plan '{path}': base {key} = {value!r} is not {KINDS[kind]}")
    return values


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_item(value: Any, kind: type) -> bool:
    """Whether `value` is one of a list of `kind`: a float > 0, an int ≥ 0, or a non-empty str (a corpus name)."""
    if kind is str:
        return isinstance(value, str) and bool(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value > 0 if kind is float else isinstance(value, int) and value >= 0


def role_problems(plan: Plan) -> list[str]:
    """Every problem of the plan's models in their roles, from their configs and tokenizers (no weights): the
    models are read side by side (a large tokenizer takes seconds to parse), each once; each claim's own needs of
    them (a longer T, a BOS token) as the claims declare them."""
    from posleak.experiments.paper.claims.registry import CLAIMS  # here: C3's units read `read_facts` from this module

    problems = Problems()
    specs = list(dict.fromkeys(plan.roles[role].model for role in ROLE_NAMES))
    with ThreadPoolExecutor(len(specs)) as pool:
        facts = dict(zip(specs, pool.map(_facts_or_problems, specs), strict=True))
    folders: dict[str, RoleName] = {}
    reported: set[str] = set()
    for role in ROLE_NAMES:
        spec, folder = plan.roles[role].model, plan.roles[role].folder
        if folder in folders:
            problems.add(
                f"roles {folders[folder]} and {role} would share the run folders runs/{folder}-A and -B; "
                "give them models with different names"
            )
        folders.setdefault(folder, role)
        seq_len, num_seqs = plan.size(role)
        options = analysis_config(plan, role).problems()
        if num_seqs < MIN_BOOTSTRAP_UNITS:  # one window per document: N documents per sample
            options.append(
                f"{num_seqs} documents per sample are too few for a bootstrap interval (docs/method.md §6); "
                f"give the role num_seqs ≥ {MIN_BOOTSTRAP_UNITS}"
            )
        problems.extend([f"{role} (T = {seq_len}, N = {num_seqs}): {p}" for p in options])
        known = facts[spec]
        if isinstance(known, RoleFacts):
            longer = [t for claim in CLAIMS for t in claim.positions_needed(plan) if t.role == role]
            why_bos = next((claim.bos_needed[role] for claim in CLAIMS if role in claim.bos_needed), None)
            problems.extend(_fact_problems(role, spec, known, seq_len, longer, why_bos))
        elif spec not in reported:  # the model's own problems, once (under the first role that names it)
            reported.add(spec)
            problems.extend([f"{role} model {spec}: {p}" for p in known])
    return problems.found


def _facts_or_problems(spec: str) -> RoleFacts | list[str]:
    found = Problems()
    with found.collecting():
        return read_facts(spec)
    return found.found


def _fact_problems(
    role: RoleName,
    spec: str,
    facts: RoleFacts,
    seq_len: int,
    longer: Sequence[LongerT] = (),
    why_bos: str | None = None,
) -> list[str]:
    """What stops `spec` (facts `facts`) from playing `role` at T = `seq_len`, at each T a claim runs it at beyond
    that (`longer`: `ClaimModule.positions_needed`), and without a BOS token where a claim needs one (`why_bos`)."""
    fix = "give the role a shorter seq_len in the plan file, or another model"
    found = _positions_problems(role, spec, facts, "its T", seq_len, fix)
    for t in longer:
        found += _positions_problems(role, spec, facts, t.which, t.seq_len, t.fix)
    window = facts.sliding_window
    if role == "sliding" and window is None:
        found.append(
            f"sliding model {spec}: has no sliding window (every layer attends to all earlier keys); the sliding "
            f"role needs a model with a window shorter than its T = {seq_len}"
        )
    elif role == "sliding" and window is not None and window >= seq_len:
        found.append(
            f"sliding model {spec}: its sliding window W = {window} is not shorter than its T = {seq_len}, so the "
            f"window never acts; give the role a seq_len above {window} in the plan file"
        )
    if why_bos is not None and not facts.has_bos:
        found.append(f"{role} model {spec}: its tokenizer has no BOS token, and {why_bos}; give the role another model")
    return found


def _positions_problems(role: RoleName, spec: str, facts: RoleFacts, which: str, seq_len: int, fix: str) -> list[str]:
    """`spec`'s maximum positions against a T it must hold (`which` names that T), with the `fix`."""
    if facts.max_positions is None or facts.max_positions >= seq_len:
        return []
    found = f"its maximum positions ({facts.max_positions}) are shorter than {which} = {seq_len}"
    return [f"{role} model {spec}: {found}; {fix}"]


@dataclass(frozen=True)
class RoleFacts:
    """What the role checks need of a model: its maximum positions, its sliding window, whether it has a BOS."""

    max_positions: int | None
    sliding_window: int | None
    has_bos: bool


def read_facts(spec: str, trust_remote_code: bool = False) -> RoleFacts:
    """The `RoleFacts` of `spec` (what `posleak analyze` takes) from its config and tokenizer, without its
    weights: seconds even for a 70B checkpoint. A hub id reads only those files from the hub. A folder whose
    tokenizer_config.json states the BOS token is not made to parse its tokenizer (Gemma's takes seconds)."""
    from transformers import AutoConfig

    from posleak.models import zoo
    from posleak.models.lab.model import register_lab_model

    if spec in ZOO and not zoo.is_fetched(spec):  # no hashing of its files, unlike load_model
        raise PosleakError(f"model {spec!r} is not fetched; run `posleak fetch {spec}`")
    source, gguf = model_files(spec, trust_remote_code, download=False)
    register_lab_model()  # a lab checkpoint folder's config (model_type posleak_lab)
    where = {"gguf_file": gguf} if gguf else {}
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **where)
        has_bos = _declared_bos(Path(source)) if gguf is None else None
        if has_bos is None:
            has_bos = _tokenizer_bos(source, trust_remote_code, where)
    except (OSError, ValueError) as err:
        raise load_error(spec, err) from None
    facts = ModelFacts.from_config(config)
    return RoleFacts(facts.max_positions, facts.sliding_window, has_bos)


def _declared_bos(folder: Path) -> bool | None:
    """Whether a local folder's tokenizer_config.json names a BOS token; None where it does not say."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    declared = json.loads(path.read_text())
    return None if "bos_token" not in declared else declared["bos_token"] is not None


def _tokenizer_bos(source: str, trust_remote_code: bool, where: dict[str, str]) -> bool:
    return _tokenizer(source, trust_remote_code, where).bos_token_id is not None


def _tokenizer(source: str, trust_remote_code: bool, where: dict[str, str]) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code, **where)


def role_tokenizers(plan: Plan) -> dict[str, PreTrainedTokenizerBase]:
    """The tokenizer of each model of the plan's roles, by spec, each read once, side by side (a large tokenizer
    takes seconds to parse): what the checks that need the tokens (`word_problems`, posleak.experiments.paper.
    samples) read."""
    specs = list(dict.fromkeys(plan.roles[role].model for role in ROLE_NAMES))
    with ThreadPoolExecutor(len(specs)) as pool:
        return dict(zip(specs, pool.map(_spec_tokenizer, specs), strict=True))


def _spec_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    source, gguf = model_files(spec, False, download=False)
    return _tokenizer(source, False, {"gguf_file": gguf} if gguf else {})


def word_problems(
    plan: Plan, words: Mapping[RoleName, Sequence[str]], tokenizers: Mapping[str, PreTrainedTokenizerBase]
) -> list[str]:
    """Every word of `words` (per role: those its claims put into the inputs as one token, `ClaimModule.words`)
    that the tokenizer of the role's model (`tokenizers`, by spec: `role_tokenizers`) splits, before any work."""
    wanted: dict[str, dict[str, None]] = {}  # per model spec, its words in order, each once
    for role, role_words in words.items():
        wanted.setdefault(plan.roles[role].model, {}).update(dict.fromkeys(role_words))
    split = {spec: _split_words(tokenizers[spec], list(spec_words)) for spec, spec_words in wanted.items()}
    return [
        f"model {spec}: its tokenizer splits {', '.join(repr(w) for w in found)}, which the reproduction puts at "
        "position 0 as one token each (C3's K/V patch, C6's first tokens); give the role a model whose tokenizer "
        "keeps them whole"
        for spec, found in split.items()
        if found
    ]


def _split_words(tokenizer: PreTrainedTokenizerBase, words: list[str]) -> list[str]:
    """The words that `tokenizer` encodes to more than one token (no special tokens)."""
    return [word for word in words if len(tokenizer.encode(word, add_special_tokens=False)) != 1]
