"""The lab's tasks (posleak.lab.tasks): every answer against a brute-force reading of the rule in the task's
docstring, seeds that reproduce, and position-blind models held to the analytic chance level of the absolute
tasks."""

from __future__ import annotations

import pytest
import torch

from posleak.errors import PosleakError
from posleak.lab.tasks import TASKS, generate, parse_tasks, solved, task_tokenizer
from posleak.lab.tasks.vocab import VOCAB_SIZE
from posleak.models.lab.config import LabSpec
from posleak.models.lab.hf_config import LabConfig
from posleak.models.lab.model import build_lab_model

LENGTHS = (24, 48, 96)  # 1×, 2× and 4× a training length


def _words(row: torch.Tensor) -> list[str]:
    return task_tokenizer().convert_ids_to_tokens(row.tolist())


def _brute_force(task: str, words: list[str]) -> dict[int, str]:
    """{position: the token the rule puts there} for every answer of one row, read from the row's words alone."""
    assert words[0] == "<bos>"
    if task == "index":
        n = (len(words) - 1) // 2
        content, answers, asked = words[1 : n + 1], {}, set()
        assert len(set(content)) == len(content)
        for i in range(n + 1, len(words) - 3, 4):  # queries d d d y, then <eos> to the end
            if words[i] == "<eos>":
                break
            p = int("".join(words[i : i + 3]))
            assert 1 <= p <= n and p not in asked
            asked.add(p)
            answers[i + 3] = content[p - 1]
        assert len(asked) == (len(words) - 1 - n) // 4 and all(w == "<eos>" for w in words[n + 1 + 4 * len(asked) :])
        return answers
    if task == "count":
        q = words.index("<q>")
        content = words[1:q]
        assert content.count("<m>") == 1 and q == len(words) - 4
        return dict(zip(range(q + 1, q + 4), f"{content.index('<m>'):03d}", strict=True))
    if task == "copy":
        return {i: words[i - 8] for i in range(9, len(words))}
    if task == "recall":
        q = words.index("<q>")
        m = (len(words) - 2) // 4
        pairs = dict(zip(words[1:q:2], words[2:q:2], strict=True))
        assert q == 2 * m + 1 and len(pairs) == m  # m pairs with distinct keys
        assert all(int(k[1:]) < 64 <= int(v[1:]) < 128 for k, v in pairs.items())  # keys s0–s63, values s64–s127
        asked = range(q + 1, q + 1 + 2 * m, 2)  # the positions of the queried keys
        assert sorted(words[i] for i in asked) == sorted(pairs)  # each key asked once
        assert all(w == "<eos>" for w in words[q + 1 + 2 * m :])
        return {i + 1: pairs[words[i]] for i in asked}
    if task == "reverse":
        r = words.index("<r>")
        content = words[1:r]
        return {r + 1 + j: token for j, token in enumerate(reversed(content))}
    raise AssertionError(task)


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("length", LENGTHS)
def test_answers_are_right_by_construction(task: str, length: int) -> None:
    batch = generate(task, 40, length, seed=3)
    assert batch.ids.shape == (40, length) and batch.answers.shape == (40, length - 1)
    assert int(batch.ids.max()) < VOCAB_SIZE and (batch.ids[:, 0] == 0).all()
    for row, answers in zip(batch.ids, batch.answers, strict=True):
        words = _words(row)
        expected = _brute_force(task, words)
        assert sorted(expected) == [int(i) + 1 for i in answers.nonzero().flatten()]
        assert all(words[i] == token for i, token in expected.items())
    # a model predicting each row's own next tokens solves every row; one wrong answer token unsolves it
    truth = batch.ids[:, 1:].clone()
    assert solved(truth, batch).all()
    first = batch.answers.int().argmax(dim=1)
    truth[torch.arange(40), first] = 1
    assert not solved(truth, batch).any()


@pytest.mark.parametrize("task", list(TASKS))
def test_seeds_reproduce_and_differ(task: str) -> None:
    a, b, c = generate(task, 16, 48, 7), generate(task, 16, 48, 7), generate(task, 16, 48, 8)
    assert torch.equal(a.ids, b.ids) and torch.equal(a.answers, b.answers)
    assert not torch.equal(a.ids, c.ids)
    assert not torch.equal(generate(task, 16, 48, (7, 0, 1)).ids, generate(task, 16, 48, (7, 0, 2)).ids)


def test_unknown_tasks_and_lengths_are_refused_in_one_line() -> None:
    assert parse_tasks("all") == tuple(TASKS)
    assert parse_tasks("copy, index") == ("copy", "index")
    with pytest.raises(PosleakError, match="unknown task nosuch; use all or some of index"):
        parse_tasks("index,nosuch")
    with pytest.raises(PosleakError, match="task index takes rows of 9 to 992 tokens"):
        generate("index", 2, 2000, 0)


def _greedy_answers(model: torch.nn.Module, ids: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """The model's own greedy continuation of ids[:, :start] for `count` tokens (what exact match scores)."""
    prefix = ids[:, :start]
    with torch.no_grad():
        for _ in range(count):
            nxt = model(input_ids=prefix).logits[:, -1].argmax(-1, keepdim=True)
            prefix = torch.cat([prefix, nxt], dim=1)
    return prefix[:, start:]


# rows whose answer ends them: index at 10 tokens (4 content symbols, one query), count at 20 (15 content tokens)
@pytest.mark.parametrize(("task", "length", "n", "answer_tokens"), [("index", 10, 4, 1), ("count", 20, 15, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_model_blind_to_position_is_at_chance_on_the_absolute_tasks(
    task: str, length: int, n: int, answer_tokens: int, seed: int
) -> None:
    """A NoPE model whose content positions see each other without a causal mask (a bidirectional prefix over
    <bos> and the content) cannot tell arrangements of the content apart: its greedy answer is the same for all
    n cyclic shifts of a row's content, while the true answers of those n rows are n different ones. So it
    solves at most one row of each orbit, 1/n of them, the task's analytic chance level; a causal NoPE model
    is not blind and answers the shifts differently (the check can fail)."""
    assert TASKS[task].chance(length) == pytest.approx(1 / n)
    blind_spec = LabSpec(pe="nope", attention=f"prefix:{n + 1}")
    blind = build_lab_model(LabConfig.from_spec(blind_spec, VOCAB_SIZE, 64, 0, 1), seed=seed)
    causal = build_lab_model(LabConfig.from_spec(LabSpec(pe="nope"), VOCAB_SIZE, 64, 0, 1), seed=seed)
    start = length - answer_tokens
    solved_rows, rows = 0, 0
    for row in generate(task, 4, length, seed=seed).ids:
        orbit = []
        for shift in range(n):
            shifted = row.clone()
            shifted[1 : n + 1] = torch.roll(row[1 : n + 1], shift)
            if task == "index":  # the same index p, whose token is now another one
                shifted[-1] = shifted[1 + int("".join(_words(row)[n + 1 : n + 4])) - 1]
            else:  # the marker moved: the count is its new index
                marker = int((shifted[1 : n + 1] == 4).nonzero())
                shifted[-3:] = torch.tensor([6 + int(c) for c in f"{marker:03d}"])
            orbit.append(shifted)
        orbit_ids = torch.stack(orbit)
        truths = orbit_ids[:, start:]
        assert len({tuple(t.tolist()) for t in truths}) == n  # n different answers
        answers = _greedy_answers(blind.eval(), orbit_ids, start, answer_tokens)
        assert (answers == answers[0]).all(), "a position-blind model answered the shifts differently"
        hits = (answers == truths).all(dim=1)
        assert int(hits.sum()) <= 1
        solved_rows, rows = solved_rows + int(hits.sum()), rows + n
        with torch.no_grad():
            predictions = blind(input_ids=orbit_ids).logits[:, :-1].argmax(-1)
        assert torch.equal(solved(predictions, generate_like(orbit_ids, task)), hits)  # teacher-forced = greedy
        with torch.no_grad():  # the first answer's logits: the same for every shift when blind, not when causal
            blind_logits = blind(input_ids=orbit_ids[:, :start]).logits[:, -1]
            causal_logits = causal.eval()(input_ids=orbit_ids[:, :start]).logits[:, -1]
        assert (blind_logits - blind_logits[0]).abs().max() < 1e-5
        assert (causal_logits - causal_logits[0]).abs().max() > 1e-3
    assert solved_rows / rows <= 1 / n


def generate_like(ids: torch.Tensor, task: str) -> object:
    """A TaskBatch of these rows with the task's answer targets (the last 1 or 3 tokens)."""
    from posleak.lab.tasks import TaskBatch

    answers = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
    answers[:, -(1 if task == "index" else 3) :] = True
    return TaskBatch(task, ids, answers)
