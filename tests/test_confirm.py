"""A question asked of the model once its answer is made (``Sampling.probe``: "Is your answer stated in the
excerpts?"): its probability of Yes against No (``Trace.confirm``) is the model's own, read after the answer in the
same window, last, so that the answer and memory's counts are as without it, in every family and dtype.
``Chat.probe`` renders the question in the chat template; ``Reading.confirm`` holds an answer until the reader
confirms it, and says that the book does not say where it does not."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from test_answer import QUESTION
from test_decline import FAMILIES, PROMPT, bank, bank_view, beside_plain, generated, tiny_mistral
from test_drafting import DTYPES, GREEDY, opened

from longmem.model.baselines import BackboneLM
from longmem.model.lm import Probe, Sampling, Trace
from longmem.tasks.answer import NOT_SAID, answer
from longmem.tasks.chat import Chat
from longmem.tasks.reading import CONFIRM, PassageFinder, Reading

PROBE = Probe(ids=(11, 23, 35, 47), yes=(8, 9), no=(20,))
UNSTOPPED = replace(GREEDY, max_new_tokens=6, stop_ids=(), backbone_stops=False)  # ends at max_new_tokens


def logit(p: float) -> float:
    return math.log(p / (1 - p))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_probe_s_confirmation_is_the_model_s_own(family, dtype):
    """After an answer that ended at its length, the probe's tokens follow the answer's last: the model's log-odds of
    its yes tokens against its no tokens equal those of one scoring pass over the prompt, the answer and the probe."""
    model = opened(family, dtype, 64)
    trace = Trace()
    # the model's own logits (side_weight 1), so that ``score`` (one pass, every token searching) reads the same
    out = generated(model, replace(UNSTOPPED, side_weight=1.0, probe=PROBE), bank_view(model), trace)
    assert trace.confirm is not None and 0.0 < trace.confirm < 1.0
    assert_log_odds(trace.confirm, model, bank(model), out, dtype)


def assert_log_odds(confirm: float, scorer, memory, answer: list[int], dtype: torch.dtype) -> None:
    """``confirm``'s log-odds are ``scorer``'s of the probe's yes tokens against its no tokens after the prompt, the
    ``answer`` and the probe, in one scoring pass."""
    asked = torch.tensor(answer + list(PROBE.ids))

    def logp(tokens: tuple[int, ...]) -> float:
        return float(torch.logsumexp(torch.tensor(
            [scorer.score(PROMPT, torch.cat([asked, torch.tensor([t])]), memory) for t in tokens]), 0))
    expected = logp(PROBE.yes) - logp(PROBE.no)
    tol = 1e-3 if dtype == torch.float32 else 0.3  # bfloat16: one pass against the decode's incremental ones
    assert logit(confirm) == pytest.approx(expected, abs=tol * max(1.0, abs(expected)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_after_a_stop_the_probe_follows_the_answer_and_weighs_the_backbone_s_share(family, dtype):
    """An answer ended by a stop id: the stop is left unread, the probe follows the answer's other tokens; at a
    side_weight of 0 the confirmation is the frozen backbone's own, as the backbone alone scores it in one pass."""
    model = opened(family, dtype, 64)
    free = generated(model, replace(UNSTOPPED, side_weight=0.0), bank_view(model))
    stop = next(t for i, t in enumerate(free) if i >= 2 and t not in free[:i])  # first made third or later
    trace = Trace()
    out = generated(model, replace(UNSTOPPED, side_weight=0.0, stop_ids=(stop,), probe=PROBE), bank_view(model),
                    trace)
    assert out[-1] == stop and stop not in out[:-1] and trace.confirm is not None
    assert_log_odds(trace.confirm, BackboneLM(model.backbone, 64), None, out[:-1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_probe_leaves_the_answer_and_memory_s_counts_as_they_were(family, dtype):
    model, plain, plain_view, view = beside_plain(family, dtype)
    trace = Trace()
    assert generated(model, replace(GREEDY, probe=PROBE), view, trace) == plain
    assert view.hits == plain_view.hits  # the probe's own searches were uncounted
    assert trace.confirm is not None and 0.0 < trace.confirm < 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_answer_left_unfinished_or_with_no_room_for_the_probe_is_not_confirmed(dtype):
    model = opened("llama", dtype, 64)
    trace = Trace()
    tokens = model.generate(PROMPT, bank_view(model), replace(UNSTOPPED, probe=PROBE), trace=trace)
    next(tokens), tokens.close()  # left after its first token
    assert trace.confirm is None
    full = opened("llama", dtype, 16)  # a 16-token window: the 10-token prompt, 6 answer tokens and no room
    trace = Trace()
    assert len(generated(full, replace(UNSTOPPED, probe=PROBE), bank_view(full), trace)) == 6
    assert trace.confirm is None
    trace = Trace()
    generated(model, UNSTOPPED, bank_view(model), trace)
    assert trace.confirm is None  # no probe: nothing asked


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cache_that_cannot_be_cut_back_is_probed_too(dtype):
    """The probe is read last, so a sliding-window cache (Mistral's) need not go back: it is asked, and its log-odds
    are the model's own in one scoring pass."""
    model = tiny_mistral(dtype)
    trace = Trace()
    out = generated(model, replace(UNSTOPPED, probe=PROBE), None, trace)
    assert trace.confirm is not None
    assert_log_odds(trace.confirm, model, None, out, dtype)


def test_a_probe_needs_its_question_and_two_distinct_replies():
    with pytest.raises(ValueError, match="needs"):
        Probe(ids=(), yes=(1,), no=(2,))
    with pytest.raises(ValueError, match="share"):
        Probe(ids=(3,), yes=(1, 2), no=(2,))


def test_the_chat_renders_its_probe_in_the_template_after_the_answer(loaded):
    """The probe's ids are what the template adds after an answer to put the question and open the next reply; its
    replies are the first tokens of Yes and No (a character tokenizer: those of "Y"/"y" against "N"/"n", the space
    both share left out)."""
    model, _, memory = loaded
    chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
    tok = model.backbone.tokenizer
    probe = chat.probe(CONFIRM)
    turns = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "A zeppelin."}]
    before = tok.apply_chat_template(turns, tokenize=False)
    after = tok.apply_chat_template(turns + [{"role": "user", "content": CONFIRM}], add_generation_prompt=True,
                                    tokenize=False)
    assert tok.decode(probe.ids) == after[len(before) - 1:]  # from the end of the answer's turn ("\n" here)
    assert {tok.decode([t]) for t in probe.yes} == {"Y", "y"} and {tok.decode([t]) for t in probe.no} == {"N", "n"}


def test_an_answer_is_shown_only_once_the_reader_confirms_it(loaded):
    """``Reading.confirm``: below the reader's probability of Yes the answer is shown whole, in one piece, as without
    the probe; above it the reply says that the book does not say, and the draft is kept for records."""
    model, bank, memory = loaded
    finder = PassageFinder(bank, model, memory)

    def asked(confirm: float):
        chat = Chat(model, memory, Sampling(max_new_tokens=8, temperature=0))
        reply = answer(chat, finder, QUESTION, Reading(abstain=0.0, confirm=confirm, budget=150))
        return list(reply), reply, chat

    plain, free, _ = asked(0.0)
    assert free.confirm is None and free.trace.confirm is None
    pieces, probed, _ = asked(1e-6)
    assert 0.0 < probed.confirm < 1.0 and pieces == ["".join(plain)]  # held, then shown whole
    pieces, doubted, chat = asked(min(1.0, probed.confirm * 1.01))
    assert pieces == [NOT_SAID] and not doubted.said and doubted.draft == "".join(plain)
    assert doubted.confirm == pytest.approx(probed.confirm, rel=1e-4)
    assert chat.history[-1] == {"role": "assistant", "content": NOT_SAID, "said": False}
    with pytest.raises(ValueError, match="confirm"):
        Reading(confirm=1.5)
